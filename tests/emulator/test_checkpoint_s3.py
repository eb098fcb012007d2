"""Checkpoints to S3 through ``s3://`` URLs: s3fs over real HTTP to moto (``ThreadedMotoServer``).

The endpoint reaches s3fs the way a user's would: ``AWS_ENDPOINT_URL`` in
the environment, or ``endpoint_url`` in the storage options. To kill a
writer in the middle of an upload, the child process talks to moto through
:class:`_StallingProxy`, which forwards every request except the one upload
the test names: that one it reads half of and then never answers.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import urlsplit

import pytest
import torch

from cloud_elastic.checkpoint import (CheckpointError, CheckpointStore, CheckpointWriter, DurableJobRecord,
                                      read_job_record, write_job_record)

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

REGION = "us-east-1"
_HOP = {"content-length", "connection", "transfer-encoding", "keep-alive", "date", "server"}


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; test credentials and AWS_ENDPOINT_URL (moto) in the environment."""
    import boto3

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", REGION), ("AWS_ENDPOINT_URL", moto_url)):
        monkeypatch.setenv(name, value)
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_url, region_name=REGION).create_bucket(Bucket=name)
    return name


def _s3(moto_url: str):
    import boto3

    return boto3.client("s3", endpoint_url=moto_url, region_name=REGION)


def _keys(moto_url: str, bucket: str) -> list[str]:
    listing = _s3(moto_url).list_objects_v2(Bucket=bucket)
    return sorted(obj["Key"] for obj in listing.get("Contents", []))


def _payload(step: int, size: int = 1000) -> dict:
    return {"model": {"w": torch.full((size,), float(step))}, "step": step}


def test_checkpoints_round_trip_through_s3_with_keep_k(moto_url: str, bucket: str) -> None:
    # AWS_ENDPOINT_URL alone points s3fs at moto: no storage options.
    store = CheckpointStore(f"s3://{bucket}/jobs/run-1", keep=2)
    assert store.latest() is None
    with CheckpointWriter(store) as writer:
        for step in (100, 200, 300):
            assert writer.submit(step, _payload(step), {"epoch": step // 100, "world_size": 8, "job_id": "j1"})
            assert writer.wait(30)
    assert writer.stats().written == 3

    keys = _keys(moto_url, bucket)
    layout = r"jobs/run-1/(ckpt-\d{8}T\d{12}Z-step\d{12}/(state\.pt|manifest\.json)|checkpointed\.json)"
    assert len(keys) == 5 and all(re.fullmatch(layout, k) for k in keys) and "jobs/run-1/checkpointed.json" in keys
    latest = CheckpointStore(f"s3://{bucket}/jobs/run-1").latest()  # a new reader, as after a restart
    assert (latest.info.step, latest.info.epoch, latest.info.world_size, latest.info.job_id) == (300, 3, 8, "j1")
    assert latest.info.url.startswith(f"s3://{bucket}/jobs/run-1/ckpt-")
    assert torch.equal(latest.payload["model"]["w"], torch.full((1000,), 300.0))
    assert [info.step for info in store.list()] == [300, 200]
    # Counted as s3fs sent them (each upload of the data, in close()), and aged by S3's own LastModified.
    assert store.bytes_written == 3 * latest.info.size
    assert abs(time.time() - store.backend.changed(latest.info.name)) < 120


def test_a_corrupt_latest_object_falls_back_to_the_previous(
    moto_url: str, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(f"s3://{bucket}/run", keep=3)
    store.save(1, _payload(1))
    newest = store.save(2, _payload(2))
    _s3(moto_url).put_object(Bucket=bucket, Key=f"run/{newest.name}/state.pt", Body=b"overwritten")
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        latest = store.latest()
    assert latest.info.step == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and newest.name in warnings[0] and "digest" in warnings[0]


def test_the_job_record_is_created_on_s3_only_where_there_is_none(bucket: str) -> None:
    """A conditional upload (``If-None-Match: *``): of two drivers started at once, one claims the store."""
    url = f"s3://{bucket}/jobs/claimed"
    assert write_job_record(CheckpointStore(url), DurableJobRecord("first111", ("python", "a.py"), 1.0),
                            only_if_absent=True)
    assert not write_job_record(CheckpointStore(url), DurableJobRecord("second22", ("python", "b.py"), 2.0),
                                only_if_absent=True)
    assert read_job_record(CheckpointStore(url)).job_id == "first111"


def test_unreachable_storage_is_an_error_not_an_empty_store(bucket: str) -> None:
    # Treating "cannot read" as "no checkpoint" would start training over; the caller must see the failure.
    store = CheckpointStore(f"s3://{bucket}/run", storage_options={
        "endpoint_url": "http://127.0.0.1:9", "config_kwargs": {"retries": {"max_attempts": 1}}, "retries": 1})
    with pytest.raises(CheckpointError, match="could not list checkpoints") as caught:
        store.latest()
    assert "\n" not in str(caught.value)


class _StallingProxy:
    """Forwards HTTP to moto; a PUT whose path matches ``stall`` is half read and never answered."""

    def __init__(self, target: str, stall: str) -> None:
        self._target = urlsplit(target)
        self._stall = re.compile(stall)
        self.stalled = threading.Event()
        self._release = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if self.command == "PUT" and proxy._stall.search(self.path):
                    self.rfile.read(length // 2)
                    proxy.stalled.set()
                    proxy._release.wait(60)
                    self.close_connection = True
                    return
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(proxy._target.hostname, proxy._target.port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "expect")}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    reply = conn.getresponse()
                    data = reply.read()
                    self.send_response(reply.status)
                    for key, value in reply.getheaders():
                        if key.lower() not in _HOP:
                            self.send_header(key, value)
                    size = reply.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                    self.send_header("Content-Length", size)
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


CHILD = textwrap.dedent("""
    import sys, torch
    from cloud_elastic.checkpoint import CheckpointStore, CheckpointWriter
    store = CheckpointStore(sys.argv[1], keep=2)
    store.save(1, {"model": {"w": torch.full((1000,), 1.0)}, "step": 1})
    print("saved 1", flush=True)
    with CheckpointWriter(store) as writer:
        writer.submit(2, {"model": {"w": torch.full((1_000_000,), 2.0)}, "step": 2})
        print("submitted 2", flush=True)
        writer.wait()
    print("saved 2", flush=True)
""")


@pytest.mark.parametrize("stall", ["state.pt", "manifest.json"], ids=["data-upload", "manifest-upload"])
def test_sigkill_mid_upload_leaves_the_previous_checkpoint(moto_url: str, bucket: str, stall: str) -> None:
    proxy = _StallingProxy(moto_url, rf"-step000000000002/{re.escape(stall)}$")
    url = f"s3://{bucket}/run"
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url,
           "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-c", CHILD, url], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "saved 1"
        assert child.stdout.readline().strip() == "submitted 2"
        assert proxy.stalled.wait(60), "the upload of checkpoint 2 never started"
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        proxy.close()

    keys = _keys(moto_url, bucket)
    assert not [k for k in keys if "-step000000000002/manifest.json" in k]
    latest = CheckpointStore(url, keep=2).latest()
    assert latest.info.step == 1 and latest.payload["step"] == 1
    manifest_key = f"run/{latest.info.name}/manifest.json"
    manifest = json.loads(_s3(moto_url).get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    assert manifest["step"] == 1


def test_a_sharded_checkpoint_goes_to_s3_and_comes_back_bitwise(bucket: str):
    """``hvd.shard``'s checkpoints (torch DCP through DCP's fsspec writer and reader) on S3; one host of one worker."""
    from cloud_elastic.worker.durable.sharded import ShardedCheckpoints
    from cloud_elastic.worker.durable.rank_zero import DurableSettings
    from tests.unit.test_sharded_checkpoint import _ctx, _job_store, _state, _train, _values

    url = f"s3://{bucket}/sharded"
    state, ctx = _state(), _ctx()
    _train(state, 2)
    ctx.ledger.commit_seq = 2
    durable = ShardedCheckpoints(DurableSettings(_job_store(url)), ctx)
    assert durable.finish(state) is None
    assert ctx.reports[0][1]["path"].startswith(url + "/ckpt-")
    [info] = CheckpointStore(url).list()
    assert info.step == 2 and info.shard_count == 1 and ".metadata" in info.shards
    # Every byte uploaded counted as progress (s3fs's uploads, DCP's shard files among them), each once.
    assert durable.store.bytes_written == info.size + sum(info.shards.values())
    other = _state(seed=5)
    assert ShardedCheckpoints(DurableSettings(url), _ctx()).load_latest(other).step == 2
    assert all(torch.equal(a, b) for a, b in zip(_values(other), _values(state)))
