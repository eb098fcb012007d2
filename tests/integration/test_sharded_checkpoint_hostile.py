"""A sharded checkpoint (``hvd.shard``, torch DCP) that storage corrupted or an attacker changed, resumed by a real
job whose host holds two workers: they agree to fall back to the previous checkpoint, and no pickle runs.

The first job writes checkpoints (one DCP file per worker). Then, in its final checkpoint, bytes of
worker 1's file are flipped (same size, manifest untouched: only worker 1 reads that file, so
worker 0 learns of it through DCP) and a pickle that would create a marker file replaces DCP's
``.metadata`` (its size fixed in the manifest). The second job resumes: from the checkpoint
before, with the state the first job committed at that step; the marker never appears.
Before: the flipped bytes loaded "successfully" and the pickle ran.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys

import pytest

from tests.integration.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PROBE = REPO / "tests" / "integration" / "shard_probe.py"


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def _args(ckpt, steps: int) -> list[str]:
    return ["run", "-np", "2", "--min-np", "2", "--slots-per-host", "2", "--whole-hosts", "-H", "127.0.0.1:2",
            "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0.3", "--checkpoint-keep", "2",
            sys.executable, str(PROBE), "--steps", str(steps), "--step-sleep", "0.1", "--full-checksum"]


def test_a_corrupt_shard_of_one_worker_makes_the_whole_host_fall_back_and_no_pickle_runs(jobs, tmp_path):
    ckpt, marker = tmp_path / "ckpt", tmp_path / "ran"
    first = jobs(_args(ckpt, 8))
    assert first.finish(timeout=150) == 0, first.output()
    previous, final = sorted(p for p in ckpt.iterdir() if p.name.startswith("ckpt-"))[-2:]
    at = json.loads((previous / "manifest.json").read_text())["step"]
    assert json.loads((final / "manifest.json").read_text())["step"] == 8 and at < 8
    committed = {e["full"] for e in first.of("commit") if e["step"] == at}
    assert len(committed) == 1

    shard = final / "dcp" / "__1_0.distcp"
    raw = bytearray(shard.read_bytes())
    middle = len(raw) // 2
    raw[middle:middle + 16] = bytes(b ^ 0xFF for b in raw[middle:middle + 16])
    shard.write_bytes(bytes(raw))
    evil = pickle.dumps(_RunsCode(str(marker)))
    (final / "dcp" / ".metadata").write_bytes(evil)
    manifest = json.loads((final / "manifest.json").read_text())
    manifest["shards"]["files"][".metadata"] = len(evil)
    (final / "manifest.json").write_text(json.dumps(manifest))

    second = jobs(_args(ckpt, 10))
    code = second.finish(timeout=150)
    assert not marker.exists(), "a pickle from the checkpoint ran"
    assert code == 0, second.output()
    out = second.output()
    unusable = [line for line in second.lines if final.name in line and "is unusable" in line]
    assert len(unusable) == 2 and all("__1_0.distcp does not match the size and SHA-256 digest" in line
                                      for line in unusable), out  # each worker of the host, the same reason
    entered = second.of("entered")
    assert len(entered) == 2 and {(e["step"], e["full"]) for e in entered} == {(at, committed.pop())}, entered
    assert {e["step"] for e in second.of("done")} == {10}
    assert "Traceback" not in out, out  # one line per worker, not DCP's error reports


def test_an_item_forged_into_the_metadata_falls_back_and_a_fitting_resume_trains_on(jobs, tmp_path):
    """Review rvH2's side note: one more non-tensor item in ``dcp/metadata.json`` (``{"kind": "bytes"}``, no bytes
    stored for it: DCP never writes one), its digest fixed in the manifest. Before: the job ended as "does not fit
    this training state" (another model), though nothing fit less than the previous, intact checkpoint."""
    ckpt = tmp_path / "ckpt"
    first = jobs(_args(ckpt, 6))
    assert first.finish(timeout=150) == 0, first.output()
    previous, final = sorted(p for p in ckpt.iterdir() if p.name.startswith("ckpt-"))[-2:]
    at = json.loads((previous / "manifest.json").read_text())["step"]
    committed = {e["full"] for e in first.of("commit") if e["step"] == at}
    assert len(committed) == 1 and at < 6

    path = final / "dcp" / "metadata.json"
    metadata = json.loads(path.read_text())
    metadata["items"]["model.extra"] = {"kind": "bytes"}
    path.write_text(json.dumps(metadata))
    manifest = json.loads((final / "manifest.json").read_text())
    manifest["shards"]["files"]["metadata.json"] = path.stat().st_size
    manifest["shards"]["sha256"]["metadata.json"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (final / "manifest.json").write_text(json.dumps(manifest))

    second = jobs(_args(ckpt, 7))
    code = second.finish(timeout=150)
    out = second.output()
    assert code == 0 and "does not fit" not in out, out
    unusable = [line for line in second.lines if final.name in line and "is unusable" in line]
    assert len(unusable) == 2 and all("item 'model.extra': a non-tensor item without a storage entry" in line
                                      for line in unusable), out
    entered = second.of("entered")
    assert len(entered) == 2 and {(e["step"], e["full"]) for e in entered} == {(at, committed.pop())}, entered
    assert {e["step"] for e in second.of("done")} == {7}
