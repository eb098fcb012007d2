"""A real job checkpointing to S3 (moto over HTTP) through an ``s3://`` URL, then resumed from there."""

from __future__ import annotations

import logging
import uuid
from typing import Iterator

import pytest

from tests.integration.harness import probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.emulator, pytest.mark.timeout(240)]

REGION = "us-east-1"


@pytest.fixture
def s3_env() -> Iterator[tuple[dict[str, str], str]]:
    """Environment that points every AWS client (s3fs included) at a fresh moto bucket, and the bucket."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=url, region_name=REGION, aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
           "AWS_ENDPOINT_URL": url}
    yield env, bucket
    server.stop()


def test_a_job_checkpoints_to_s3_and_the_same_command_resumes_from_there(jobs, tmp_path, s3_env, monkeypatch):
    env, bucket = s3_env
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    url = f"s3://{bucket}/jobs/probe"
    args = ["run", "-np", "2", "-H", "127.0.0.1:2", "--checkpoint-dir", url, "--checkpoint-interval", "0.5",
            "--checkpoint-keep", "2", "--events-file", str(tmp_path / "events.jsonl"), *probe_cmd("--steps", "30")]
    first = jobs(args, env=env)
    assert first.finish(180) == 0, first.output()
    assert "checkpoint of step" in first.output()

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from cloud_elastic.checkpoint import CheckpointStore, read_job_record

    store = CheckpointStore(url, keep=2)
    listed = store.list()
    assert 1 <= len(listed) <= 2 and listed[0].step == 30  # the final state was written at completion
    assert read_job_record(store).job_id == first.job_id()
    latest = store.latest()
    assert latest.payload["step"] == 30 and set(latest.payload) == {"model", "optimizer", "step", "epoch", "resets"}
    events = (tmp_path / "events.jsonl").read_text()
    assert '"event": "checkpoint_saved"' in events or '"event":"checkpoint_saved"' in events

    # The same command again: the job (its id) resumes from the final checkpoint and has nothing left to do.
    second = jobs(args, env=env)
    assert second.finish(180) == 0, second.output()
    assert second.job_id() == first.job_id()
    assert "resumed from the checkpoint of step 30" in second.output()
    done = second.of("done")
    assert len(done) == 2 and {e["step"] for e in done} == {30}
    assert not second.of("commit"), "a finished job trained again"
