"""The worker context's rooms on their own: the round's group and its waits (worker/rounds/groups.py) and the
heartbeat link to the driver (worker/link/driver_link.py), each on a bare object that has only what the room uses."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.net.control_server import ControlServer
from cloud_elastic.protocol import PollReply
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.rounds.groups import RoundGroup, RoundGroupsMixin, RoundInfo
from cloud_elastic.worker.link.driver_link import DriverLinkMixin
from cloud_elastic.worker.link.progress import Progress
from cloud_elastic.worker.ledger import CommitWindow

pytestmark = pytest.mark.timeout(60)


class Rounds(RoundGroupsMixin):
    """What RoundGroupsMixin uses of the context: the round, the aborts seen, the group, window and progress,
    and the collective timeout its waits pass on."""

    def __init__(self) -> None:
        self.collective_timeout_s = 300.0
        self.info = RoundInfo(0, 1, 0, 1, 0, 1, round=3, needs_sync=False, update_gen=0)
        self._seen_abort = 0
        self.dismissed = False
        self._group = RoundGroup(pg=None, store=None, sockets=None, backend="gloo")
        self.window = CommitWindow("auto")
        self.progress = Progress()
        self.worker_id = "w"


class Work:
    def __init__(self, future: Any, error: str | None = None) -> None:
        self._future, self._error = future, error

    def get_future(self) -> Any:
        return self._future

    def wait(self) -> bool:
        if self._error:
            raise RuntimeError(self._error)
        return True


def test_a_collective_started_after_the_abort_fails_at_once_and_abandons_the_group() -> None:
    rounds = Rounds()
    assert rounds.group("allreduce") is None  # the (fake) group's pg
    rounds._seen_abort = 3
    with pytest.raises(CollectiveError, match="allreduce not started: the driver aborted round 3"):
        rounds.group("allreduce")
    assert rounds._group.abandoned


def test_a_wait_is_abandoned_when_the_driver_aborts_the_round() -> None:
    rounds = Rounds()
    threading.Timer(0.2, lambda: setattr(rounds, "_seen_abort", 3)).start()
    with pytest.raises(CollectiveError, match="allreduce abandoned: the driver aborted round 3"):
        rounds.wait(Work(torch.futures.Future()), "allreduce")
    assert rounds._group.abandoned and rounds.progress.waiting_s() == 0


def test_a_failed_collective_says_why_in_one_line() -> None:
    rounds = Rounds()
    done = torch.futures.Future()
    done.set_result(None)
    with pytest.raises(CollectiveError, match=r"^allreduce failed: Connection closed by peer$"):
        rounds.wait(Work(done, "Connection closed by peer This is typically a peer crash\nmore"), "allreduce")
    assert rounds._group.abandoned


def test_a_send_to_a_peer_already_gone_is_the_rounds_failure_not_a_crash() -> None:
    """Gloo raises as a send starts when the receiver's connection is closed: a heal's holder then rolls back
    and rejoins like any worker whose collective failed, instead of leaving elastic.run with a RuntimeError."""
    rounds = Rounds()

    def send(group: Any) -> Any:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:590] Connection closed by peer [127.0.0.2]:4242")

    with pytest.raises(CollectiveError, match=r"^healing parameters from peers failed: \[gloo.*Connection closed"):
        rounds.point_to_point("healing parameters from peers", send)
    assert rounds._group.abandoned


class Link(DriverLinkMixin):
    """What DriverLinkMixin's heartbeat uses of the context."""

    def __init__(self, address: str, codec: Codec) -> None:
        self.settings = SimpleNamespace(driver_address=address)
        self.job_id = "j1"
        self._codec = codec
        self.worker_id = "w1"
        self._shutdown = threading.Event()
        self.progress = Progress()
        self._seen_round = self._seen_update = self._seen_abort = 0
        self.commits, self.commit_seq, self.holds_commit = 4, 4, True
        self.heartbeat_timeout_s = 5.0
        self.driver_lost = False
        self.driver_grace_s = 15.0
        self._stacks_sent = 0
        self._notice_watcher = None
        self.view_as_of = time.monotonic()
        self.dismissed = False
        self._heartbeat: threading.Thread | None = None

    def abort_lost_round(self) -> None:
        """The heartbeat calls it after each reply: RoundGroupsMixin's (a link alone has no group to abort)."""


def test_the_heartbeat_learns_the_round_sends_the_stacks_asked_for_and_ends_with_the_job() -> None:
    secret = new_secret()
    codec = Codec(secret, "j")
    seen: list[tuple[str, dict]] = []

    def handler(kind: str, msg: dict) -> dict:
        seen.append((kind, msg))
        polls = sum(1 for k, _ in seen if k == "poll")
        if kind == "stacks":
            return {"ok": True}
        return PollReply(3, 2, 1, shutdown=polls >= 2, stacks=1).to_wire()

    server = ControlServer(codec, handler)
    server.start()
    try:
        link = Link(f"127.0.0.1:{server.port}", codec)
        beat = threading.Thread(target=link._heartbeat_loop)
        beat.start()
        beat.join(20)
        assert not beat.is_alive(), "the heartbeat did not end when the driver said the job is over"
    finally:
        server.close()
    assert [k for k, _ in seen] == ["poll", "stacks", "poll"]  # stacks are sent once per request
    assert seen[0][1]["commits"] == 4 and "most recent call first" in seen[1][1]["text"]
    assert (link._seen_round, link._seen_update, link._seen_abort, link._stacks_sent) == (3, 2, 1, 1)


class LinkedRounds(Link, Rounds):
    """Both rooms, as in the context: the heartbeat thread writes what the waits read."""

    abort_lost_round = Rounds.abort_lost_round

    def __init__(self, address: str, codec: Codec, heartbeat_timeout_s: float = 5.0) -> None:
        Rounds.__init__(self)
        Link.__init__(self, address, codec)
        self.heartbeat_timeout_s = heartbeat_timeout_s

    def beat(self) -> None:
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True)
        self._heartbeat.start()


def _driver(reply: PollReply, delay_s: float = 0.0) -> tuple[ControlServer, Codec]:
    codec = Codec(new_secret(), "j")

    def handler(kind: str, msg: dict) -> dict:
        time.sleep(delay_s)  # a poll answered late, as a long-poll is
        return reply.to_wire()

    server = ControlServer(codec, handler)
    server.start()
    return server, codec


def _done() -> Any:
    fut = torch.futures.Future()
    fut.set_result(None)
    return fut


def test_a_worker_silent_past_the_heartbeat_timeout_learns_the_abort_before_a_collective_counts() -> None:
    """Stopped past the timeout (SIGSTOP, starvation), the driver gave the worker up and aborted its
    round; a collective that then completes (from data its peers sent before moving on) must not
    let it train and commit on in the dead round: it first waits for a heartbeat sent after it resumed."""
    server, codec = _driver(PollReply(3, 0, 3, False), delay_s=0.3)
    try:
        ctx = LinkedRounds(f"127.0.0.1:{server.port}", codec)
        ctx.view_as_of = time.monotonic() - 10  # its last answered heartbeat was sent 10 s ago
        ctx.beat()
        with pytest.raises(CollectiveError, match="allreduce completed, but the driver aborted round 3"):
            ctx.wait(Work(_done()), "allreduce")
        assert ctx._group.abandoned
    finally:
        ctx._shutdown.set()
        server.close()


def test_a_heartbeat_that_brings_the_abort_of_an_nccl_round_aborts_its_communicator_at_once() -> None:
    """On NCCL the training thread may be blocked in the GPU behind a collective on a lost peer, where no wait of ours
    runs: the heartbeat thread, which hears the driver, aborts the communicator (``rounds.on_device``)."""
    aborted = threading.Event()
    pg = SimpleNamespace(abort=aborted.set)
    server, codec = _driver(PollReply(3, 0, 3, False))
    try:
        ctx = LinkedRounds(f"127.0.0.1:{server.port}", codec)
        ctx.info = RoundInfo(0, 2, 0, 1, 0, 2, round=3, needs_sync=False, update_gen=0)
        ctx._group = RoundGroup(pg=pg, store=None, sockets=None, backend="nccl", size=2)
        ctx._group.round = 3
        ctx.beat()
        assert aborted.wait(10) and ctx._group.abandoned
    finally:
        ctx._shutdown.set()
        server.close()


def test_a_worker_the_driver_no_longer_counts_starts_no_collective() -> None:
    server, codec = _driver(PollReply(0, 0, 0, True))  # what the driver answers a worker it gave up
    try:
        ctx = LinkedRounds(f"127.0.0.1:{server.port}", codec)
        ctx.view_as_of = time.monotonic() - 10
        ctx.beat()
        with pytest.raises(CollectiveError, match="allreduce not started: the driver aborted round 3"):
            ctx.group("allreduce")
        assert ctx.dismissed
    finally:
        server.close()


def test_a_lost_driver_holds_training_up_no_longer_than_the_heartbeat_timeout() -> None:
    server, codec = _driver(PollReply(3, 0, 0, False))
    address = f"127.0.0.1:{server.port}"
    server.close()  # nobody answers there any more
    ctx = LinkedRounds(address, codec, heartbeat_timeout_s=1.0)
    ctx.view_as_of = time.monotonic() - 10
    ctx.beat()
    started = time.monotonic()
    try:
        ctx.wait(Work(_done()), "allreduce")  # the driver grace's business: training goes on
        assert ctx.driver_lost and time.monotonic() - started < 15
    finally:
        ctx._shutdown.set()


def test_a_current_view_costs_no_wait() -> None:
    server, codec = _driver(PollReply(3, 0, 0, False), delay_s=3.0)
    try:
        ctx = LinkedRounds(f"127.0.0.1:{server.port}", codec)
        ctx.beat()  # its first poll is answered only after 3 s
        started = time.monotonic()
        ctx.wait(Work(_done()), "allreduce")
        assert time.monotonic() - started < 1.0
    finally:
        ctx._shutdown.set()
        server.close()
