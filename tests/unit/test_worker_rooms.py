"""The worker context's rooms on their own: the round's group and its waits (worker/groups.py) and the
heartbeat link to the driver (worker/link.py), each on a bare object that has only what the room uses."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.server import ControlServer
from cloud_elastic.protocol import PollReply
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.groups import RoundGroup, RoundGroupsMixin, RoundInfo
from cloud_elastic.worker.link import DriverLinkMixin
from cloud_elastic.worker.progress import Progress
from cloud_elastic.worker.window import CommitWindow

pytestmark = pytest.mark.timeout(60)


class Rounds(RoundGroupsMixin):
    """What RoundGroupsMixin uses of the context: the round, the aborts seen, the group, window and progress."""

    def __init__(self) -> None:
        self.info = RoundInfo(0, 1, 0, 1, 0, 1, round=3, needs_sync=False, update_gen=0)
        self._seen_abort = 0
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


class Link(DriverLinkMixin):
    """What DriverLinkMixin's heartbeat uses of the context."""

    def __init__(self, address: str, codec: Codec) -> None:
        self.settings = SimpleNamespace(driver_address=address)
        self._codec = codec
        self.worker_id = "w1"
        self._shutdown = threading.Event()
        self.progress = Progress()
        self._seen_round = self._seen_update = self._seen_abort = 0
        self.commits, self.commit_seq = 4, 4
        self.heartbeat_timeout_s = 5.0
        self.driver_lost = False
        self.driver_grace_s = 15.0
        self._stacks_sent = 0
        self._notice_watcher = None


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
