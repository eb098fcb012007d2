"""A checkpoint upload to S3 that fails as it completes leaves no multipart upload open (s3fs over HTTP to moto).

s3fs uploads a large object in parts: the first while it is written, the last one and CompleteMultipartUpload
when the file is closed. The review's s3_orphan_mpu.py made the last part fail with 500: the save failed as it
should, but the close that failed was never followed by an abort, so the upload stayed open, its parts billed
for good ("pending multipart uploads: before 1, after 2"). The fault here is injected into s3fs's own call.
"""

from __future__ import annotations

import pytest
import torch

from cloud_elastic.checkpoint import CheckpointError, CheckpointStore
from tests.emulator.test_checkpoint_s3 import _keys, _s3, bucket, moto_url  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

#: s3fs's smallest part: a payload past it is uploaded in parts.
BLOCK = 5 * 2**20


@pytest.mark.parametrize("failing", ["upload_part", "complete_multipart_upload"], ids=["last-part", "completion"])
def test_a_save_whose_upload_fails_in_its_last_part_or_completion_aborts_its_multipart_upload(
        moto_url: str, bucket: str, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:  # noqa: F811
    from s3fs.core import S3File

    url = f"s3://{bucket}/run"
    store = CheckpointStore(url, keep=2, storage_options={"default_block_size": BLOCK})
    kept = store.save(1, {"w": torch.ones(10)})
    call_s3 = S3File._call_s3

    def failing_call(self, method, *args, **kwargs):
        # Part 1 goes up while the data is written; part 2 (the zip's tail) and the completion in close().
        if method == failing and kwargs.get("PartNumber", 2) >= 2:
            raise OSError(5, f"injected failure of {method}")
        return call_s3(self, method, *args, **kwargs)

    monkeypatch.setattr(S3File, "_call_s3", failing_call)
    with pytest.raises(CheckpointError, match=f"could not write checkpoint {url}/ckpt-.*injected failure of "
                                              f"{failing}"):
        store.save(2, {"w": torch.zeros(BLOCK // 4 + 1000)})  # a little over one part
    monkeypatch.setattr(S3File, "_call_s3", call_s3)
    assert _s3(moto_url).list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    # The kept checkpoint and its record (checkpointed.json names the newest written: the failed save wrote none).
    assert _keys(moto_url, bucket) == ["run/checkpointed.json", f"run/{kept.name}/manifest.json",
                                       f"run/{kept.name}/state.pt"]
    assert CheckpointStore(url).latest().info.step == 1
