"""The host's store while its group forms (``sharded.FormingStore``): a wait ends on the driver's word."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from cloud_elastic.protocol import PollReply
from cloud_elastic.worker.exceptions import WorkerRemoved
from cloud_elastic.worker.sharded import FormingStore
from cloud_elastic.worker.rounds.signed_store import SignedStore, host_namespace

pytestmark = pytest.mark.timeout(60)

SECRET = "k" * 64
NS = host_namespace(SECRET, "job", "host-a")


@pytest.fixture
def tcp():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)


def _later(seconds: float, fn) -> None:
    threading.Timer(seconds, fn).start()


def test_a_wait_returns_the_signed_value_once_the_host_mate_writes_it(tcp):
    store = FormingStore(tcp, NS, SECRET, sent_away=lambda: None, timeout_s=20)
    _later(0.3, lambda: SignedStore(tcp, NS, SECRET).set("rank1", b"address of rank 1"))
    assert store.get("rank1") == b"address of rank 1"


def test_torch_forming_a_group_with_a_host_mate_that_never_comes_ends_when_the_driver_sends_the_worker_away(tcp):
    # The real formation (Gloo, two ranks, rank 1 never arrives): without the driver's word it would wait 30 s.
    told: dict[str, str] = {}
    store = FormingStore(tcp, NS, SECRET, sent_away=lambda: told.get("why"), timeout_s=30)
    _later(0.5, lambda: told.update(why="worker h[1] of its host left (failed)"))
    began = time.monotonic()
    with pytest.raises(BaseException) as caught:
        dist.ProcessGroupGloo(store, 0, 2, timedelta(seconds=30))
    assert time.monotonic() - began < 20, "the formation waited on after the driver's word"
    assert "worker h[1] of its host left" in str(caught.value), caught.value


def test_without_the_driver_s_word_a_wait_ends_at_its_timeout_in_one_line(tcp):
    store = FormingStore(tcp, NS, SECRET, sent_away=lambda: None, timeout_s=0.3)
    with pytest.raises(RuntimeError, match=r"^timed out after 0.3s waiting for the host's group keys \['missing'\]$"):
        store.get("missing")
    with pytest.raises(WorkerRemoved, match="host going"):
        FormingStore(tcp, NS, SECRET, sent_away=lambda: "host going", timeout_s=10).wait(["missing"])


def test_once_formed_it_is_a_plain_signed_store(tcp):
    store = FormingStore(tcp, NS, SECRET, sent_away=lambda: "host going", timeout_s=10)
    store.set("k", b"v")
    store.forming = False
    assert store.get("k") == b"v"  # the driver's word no longer ends anything
    assert SignedStore(tcp, NS, SECRET).get("k") == b"v"


def test_the_poll_reply_carries_why_the_worker_is_sent_away():
    reply = PollReply(3, 1, 2, False, leave="its host is draining")
    assert PollReply.from_wire(reply.to_wire()) == reply
    assert PollReply.from_wire({**reply.to_wire(), "leave": 7}).leave is None  # malformed: not a reason
    assert PollReply.from_wire({"round": 3, "update_gen": 1, "abort_round": 2, "shutdown": False}).leave is None


def test_a_round_aborted_while_a_host_mate_is_missing_ends_the_formation_and_its_address_is_withdrawn(tcp):
    # The real formation again: rank 0 writes its address, waits for rank 1's, and its round is aborted (rank 1
    # is at rendezvous for the next round). The wait ends, and rank 0's address leaves the store, so a host-mate
    # still reading this round's keys cannot find a stale address.
    aborted = threading.Event()
    store = FormingStore(tcp, NS, SECRET, sent_away=lambda: None, aborted=aborted.is_set, timeout_s=30)
    _later(0.5, aborted.set)
    began = time.monotonic()
    with pytest.raises(BaseException):
        dist.ProcessGroupGloo(store, 0, 2, timedelta(seconds=30))
    assert time.monotonic() - began < 20 and store.gave_up
    written = list(store._written)
    assert written and SignedStore(tcp, NS, SECRET).check(written)
    store.withdraw()
    assert not any(SignedStore(tcp, NS, SECRET).check([key]) for key in written)


def test_a_host_mate_that_has_arrived_is_not_left_when_the_round_is_aborted(tcp):
    SignedStore(tcp, NS, SECRET).set("rank1", b"address of rank 1")
    store = FormingStore(tcp, NS, SECRET, sent_away=lambda: None, aborted=lambda: True, timeout_s=5)
    assert store.get("rank1") == b"address of rank 1" and not store.gave_up
