"""A real job checkpointing to S3 (moto over HTTP) through an ``s3://`` URL, through a failure, then resumed from there."""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from typing import Iterator

import pytest

from tests.integration.harness import probe_cmd, worker_on
from tests.integration.holding_proxy import HoldingProxy

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


def test_a_job_checkpoints_to_s3_through_a_failure_and_the_same_command_resumes_from_there(jobs, tmp_path, s3_env,
                                                                                           monkeypatch):
    """Rank 0's checkpoint upload (fsspec, s3fs) is held in flight, by a proxy on 127.0.0.9 in front of S3,
    while a peer dies and rank 0 abandons the round's group: the upload is not cut, completes once let
    through, and the job goes on at two workers and ends with its final checkpoint (issue 25). Which
    sockets a group owns when an upload opens while it forms is arranged in
    ``test_abandoned_groups.py``; here the connection is older than the group."""
    env, bucket = s3_env
    upstream = env["AWS_ENDPOINT_URL"].removeprefix("http://").rsplit(":", 1)
    proxy = HoldingProxy("127.0.0.9", (upstream[0], int(upstream[1])))
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path), AWS_ENDPOINT_URL=proxy.url)
    url = f"s3://{bucket}/jobs/probe"
    args = ["run", "-np", "3", "--min-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", "--checkpoint-dir", url,
            "--checkpoint-interval", "0.5", "--checkpoint-keep", "2", "--blacklist-cooldown-range", "600", "600",
            "--events-file", str(tmp_path / "events.jsonl"), *probe_cmd("--steps", "60", "--step-sleep", "0.1")]
    try:
        first = jobs(args, env=env)
        first.wait_for(lambda j: "checkpoint of step" in j.output(), timeout=120, what="a first checkpoint")
        proxy.arm(b"/state.pt")
        assert proxy.held.arrived.wait(60), "rank 0 wrote no further checkpoint"
        os.kill(worker_on(first.job_id(), "127.0.0.2"), signal.SIGKILL)
        first.wait_for(lambda j: any(line.startswith("[0]<127.0.0.1[0]>") and "rolling back to the last commit" in line
                                     for line in j.lines), timeout=60, what="rank 0 abandoning the round")
        proxy.release()
        deadline = time.monotonic() + 60
        while proxy.held.status is None and not proxy.held.client_closed_early and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not proxy.held.client_closed_early, "the upload in flight was cut when the round's group was abandoned"
        assert proxy.held.status == 200, bytes(proxy.held.head[:300])
        assert first.finish(180) == 0, first.output()
        assert "was not written" not in first.output()
        assert [e["size"] for e in first.of("reset")] == [2, 2], first.of("reset")  # the survivors went on without it

        for name, value in env.items():
            monkeypatch.setenv(name, value)
        from cloud_elastic.checkpoint import CheckpointStore, read_job_record

        store = CheckpointStore(url, keep=2)
        listed = store.list()
        assert 1 <= len(listed) <= 2 and listed[0].step == 60  # the final state was written at completion
        assert read_job_record(store).job_id == first.job_id()
        latest = store.latest()
        assert latest.payload["step"] == 60 and set(latest.payload) == {"model", "optimizer", "step", "epoch", "resets"}
        events = (tmp_path / "events.jsonl").read_text()
        assert '"event": "checkpoint_saved"' in events or '"event":"checkpoint_saved"' in events

        # The same command again: the job (its id) resumes from the final checkpoint and has nothing left to do.
        second = jobs(args, env=env)
        assert second.finish(180) == 0, second.output()
        assert second.job_id() == first.job_id()
        assert "resumed from the checkpoint of step 60" in second.output()
        done = second.of("done")
        assert len(done) == 3 and {e["step"] for e in done} == {60}
        assert not second.of("commit"), "a finished job trained again"
    finally:
        proxy.close()
