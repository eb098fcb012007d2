"""A round given up by a worker fails its pending collectives at once, wherever its group is then let go.

Real Gloo groups of two real WorkerContexts in this process (each with its own store client), as a
job's workers form them; the driver's abort is set directly. The interleaving is the one behind the CI
hang of ``test_commit_kill_points``: a member's training thread dropped the last reference to its
previous round's group while a collective of that group was still blocked on a live peer; Gloo's
destructor then joined that collective's thread for up to the collective timeout (300 s in a job),
with the training thread stuck inside the call and heartbeats still flowing. Abandoning the group the
moment its collective fails or is aborted (``worker.groups``) makes every such release immediate.
"""

from __future__ import annotations

import gc
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from cloud_elastic.worker.context import RoundInfo, WorkerContext
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

#: Gloo's own timeout for the test's groups: what a release blocked on a pending collective would wait.
COLLECTIVE_TIMEOUT_S = 30.0


@pytest.fixture
def pair():
    """Two workers (hosts 127.0.0.1 and 127.0.0.2) in round 1 of one job, after one allreduce together."""
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)

    def worker(name: str, host: str) -> WorkerContext:
        ctx = WorkerContext(WorkerSettings(
            standalone=False, driver_address="127.0.0.1:1", store_address=f"127.0.0.1:{server.port}", job_id="ab",
            worker_id=name, hostname=host, secret="s" * 64, backend="gloo", collective_timeout_s=COLLECTIVE_TIMEOUT_S,
            malloc_tuning=False,
        ))
        ctx._store = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=30))
        return ctx

    a, b = worker("a", "127.0.0.1"), worker("b", "127.0.0.2")
    formed = threading.Thread(target=b._form_group, args=(RoundInfo(1, 2, 0, 1, 1, 2, round=1, needs_sync=False,
                                                                    update_gen=0),))
    formed.start()
    a._form_group(RoundInfo(0, 2, 0, 1, 0, 2, round=1, needs_sync=False, update_gen=0))
    formed.join(30)
    pending = b.pg.allreduce([torch.ones(4)])
    a.wait(a.pg.allreduce([torch.ones(4)]), "first allreduce")
    pending.wait()
    yield a, b
    server = None  # noqa: F841 (the store outlives both workers' use of it)


def _abort_soon(ctx: WorkerContext) -> threading.Timer:
    timer = threading.Timer(0.3, lambda: setattr(ctx, "_seen_abort", 1))  # the driver's abort, by heartbeat
    timer.start()
    return timer


def test_a_group_whose_collective_was_abandoned_is_let_go_at_once_even_on_the_training_thread(pair):
    a, b = pair  # b stays silent: stopped, partitioned, or already in another collective
    _abort_soon(a)
    with pytest.raises(CollectiveError, match="abandoned: the driver aborted round 1"):
        a.wait(a.pg.allreduce([torch.ones(1000)]), "gradient allreduce")
    group, a._group = a._group, None
    started = time.monotonic()
    del group  # the last reference, dropped by the training thread itself
    gc.collect()
    assert time.monotonic() - started < 5, "the release waited for the collective abandoned on the silent peer"


def test_a_peer_waiting_on_a_worker_that_gave_the_round_up_is_released_at_once(pair):
    a, b = pair
    waiting = b.pg.allreduce([torch.ones(1000)])  # b is in a collective that a will never join
    _abort_soon(a)
    with pytest.raises(CollectiveError):
        a.wait(a.pg.broadcast([torch.ones(3)], dist.BroadcastOptions()), "another collective")
    started = time.monotonic()
    with pytest.raises(RuntimeError):
        waiting.wait(timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    assert time.monotonic() - started < 5, "the peer waited out Gloo's timeout for a worker that had left"


def test_a_round_the_driver_aborted_ends_even_when_its_collectives_still_complete(pair):
    """The driver may abort a round whose members are all alive (a false stall, an adopted round it
    cannot use, a member that returned early): a collective that completes in it must not let a worker
    train on, committing steps of a round the driver no longer counts."""
    a, b = pair
    theirs = b.pg.allreduce([torch.ones(4)])
    mine = a.pg.allreduce([torch.ones(4)])
    theirs.wait()
    mine.wait()  # completed on both sides: nobody is stuck
    a._seen_abort = 1  # then the abort arrives with a heartbeat
    with pytest.raises(CollectiveError, match="the driver aborted round 1"):
        a.wait(mine, "gradient allreduce")
    with pytest.raises(CollectiveError, match="the driver aborted round 1"):
        a.group("membership check")  # and nothing more starts in it


class _SlowBody:
    """A request body that takes a few seconds to send: an upload still in flight when the round fails."""

    def __init__(self, size: int, chunks: int, started: threading.Event, go_on: threading.Event) -> None:
        self._left, self._chunk = size, size // chunks
        self._started, self._go_on = started, go_on

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        if not self._started.is_set():
            self._started.set()  # its connection is open now: inside the group's formation
            self._go_on.wait(30)
        else:
            time.sleep(0.05)
        data = b"x" * min(self._chunk, self._left)
        self._left -= len(data)
        return data

    def __len__(self) -> int:
        return self._left


def test_an_upload_opened_while_a_group_formed_is_not_cut_when_that_group_is_abandoned(monkeypatch):
    """Rank 0's background checkpoint upload shares the process with the round's group: only the
    connections to the round's members are the group's (issue 25: reclaim by address)."""
    import boto3
    import botocore
    from botocore.config import Config
    from moto.server import ThreadedMotoServer

    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # not one of the members
    s3.start()
    try:
        host, port = s3.get_host_and_port()
        client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="ckpt")
        # The upload streams its body as it is made (no checksum or signature over it, which would read it
        # first), and a cut connection fails it (no retry on a fresh one).
        streaming = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                                 config=Config(retries={"max_attempts": 1}, signature_version=botocore.UNSIGNED,
                                               request_checksum_calculation="when_required"))
        server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)

        def worker(name: str, ip: str) -> WorkerContext:
            ctx = WorkerContext(WorkerSettings(
                standalone=False, driver_address="127.0.0.1:1", store_address=f"127.0.0.1:{server.port}",
                job_id="up", worker_id=name, hostname=ip, secret="s" * 64, backend="gloo",
                collective_timeout_s=COLLECTIVE_TIMEOUT_S, malloc_tuning=False))
            ctx._store = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=30))
            return ctx

        a, b = worker("a", "127.0.0.2"), worker("b", "127.0.0.3")
        info = {r: RoundInfo(r, 2, 0, 1, r, 2, round=1, needs_sync=False, update_gen=0, peers_in_store=True)
                for r in (0, 1)}
        started, go_on, result = threading.Event(), threading.Event(), {}

        def upload() -> None:
            body = _SlowBody(4 << 20, 40, started, go_on)
            try:
                streaming.put_object(Bucket="ckpt", Key="step-7", Body=body, ContentLength=len(body))
                result["ok"] = True
            except Exception as exc:  # noqa: BLE001 - what the test reports
                result["error"] = repr(exc)

        forming = threading.Thread(target=a._form_group, args=(info[0],))
        forming.start()
        time.sleep(0.3)  # a's formation has begun: what it opens from now on looks like its group's
        threading.Thread(target=upload, daemon=True).start()
        assert started.wait(30)
        b_forming = threading.Thread(target=b._form_group, args=(info[1],))
        b_forming.start()
        forming.join(30)
        b_forming.join(30)
        go_on.set()  # the upload streams on while the round fails
        _abort_soon(a)
        with pytest.raises(CollectiveError):
            a.wait(a.pg.allreduce([torch.ones(1000)]), "gradient allreduce")
        deadline = time.monotonic() + 60
        while not result and time.monotonic() < deadline:
            time.sleep(0.05)
        assert result == {"ok": True}, result
        assert client.head_object(Bucket="ckpt", Key="step-7")["ContentLength"] == 4 << 20
    finally:
        s3.stop()
