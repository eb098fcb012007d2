"""A worker joining a running job refuses a collective before ``hvd.elastic.run`` (``worker.joining``) exactly
when its round's other members are inside ``hvd.elastic.run``: they mark the round before forming its group
(at rendezvous, or in the background for a planned round), signed with the job secret. Workers that resume
a job every worker of which was lost run their set-up collectives; the refusal is one line.
The whole path, a real newcomer refused while the job trains on, is tests/integration/test_newcomer_setup_collective.py.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from cloud_elastic.control import round_namespace
from cloud_elastic.driver.net.store_server import StoreServer, round_keys
from cloud_elastic.protocol import Assignment, NextRound, RankInfo
from cloud_elastic.worker import joining
from cloud_elastic.worker.comm.ops import UnsupportedError
from cloud_elastic.worker.context import WorkerContext
from cloud_elastic.worker.rounds.next_group import _Pending
from cloud_elastic.worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(30)

SECRET = "s" * 64
SETUP = "broadcast resume_from_epoch"


def _server() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def _worker(name: str, store: dist.TCPStore, *, store_address: str | None = None) -> WorkerContext:
    """A worker context on the driver's store ``store``, whose driver's rendezvous replies the test gives."""
    ctx = WorkerContext(WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address=store_address or f"127.0.0.1:{store.port}",
        job_id="j", worker_id=name, secret=SECRET, backend="gloo", collective_timeout_s=10.0, malloc_tuning=False))
    ctx._store = store
    ctx._client = object()  # every driver call goes through _call, answered below
    ctx._form_group = lambda info: setattr(ctx, "info", info)  # the group's forming is not what is tested here
    return ctx


def _assigned(ctx: WorkerContext, round_: int, rank: int, size: int, *, from_checkpoint: bool = False,
              planned: int = 0) -> None:
    """The driver's next rendezvous reply to ``ctx``: round ``round_``, which syncs (it has a newcomer)."""
    reply = Assignment(round_, RankInfo(rank, size, rank, size, 0, 1), True, 0, from_checkpoint, planned).to_wire()
    ctx._call = lambda kind, payload=None, timeout_s=0.0: reply


def _in_elastic_run(ctx: WorkerContext, round_: int) -> None:
    """``ctx`` trained inside ``hvd.elastic.run`` and joins round ``round_`` from there (a survivor)."""
    _assigned(ctx, round_ - 1, 0, 1)
    ctx.rendezvous("start")
    ctx.elastic_entered = True
    _assigned(ctx, round_, 0, 2)
    ctx.rendezvous("update")


def _newcomer(store: dist.TCPStore, round_: int, **assignment) -> WorkerContext:
    """A worker that registered while the job ran and joins round ``round_`` at its first collective."""
    ctx = _worker("newcomer", store)
    ctx.join_pending = True
    _assigned(ctx, round_, 1, 2, **assignment)
    ctx.join_if_pending()
    assert ctx.info is not None and ctx.info.round == round_
    return ctx


def test_a_newcomer_joining_workers_inside_elastic_run_is_refused():
    store = _server()
    _in_elastic_run(_worker("survivor", store), 5)
    with pytest.raises(UnsupportedError, match="'broadcast resume_from_epoch' called before hvd.elastic.run"):
        _newcomer(store, 5).group(SETUP)


def _planned_in_elastic_run(store: dist.TCPStore, name: str, store_address: str | None = None) -> None:
    """A member inside elastic.run in round 5 forms plan 1's group for round 6 in the background."""
    member = _worker(name, store, store_address=store_address)
    _assigned(member, 5, 0, 1)
    member.rendezvous("start")
    member.elastic_entered = True

    def unformed(*_):
        raise RuntimeError("no peer in this test")

    member._new_group = unformed  # the mark comes before the group, which is not what is tested here
    member._form_next(_Pending(NextRound(1, 6, RankInfo(0, 2, 0, 2, 0, 1))))


def test_a_newcomer_of_a_planned_round_is_refused():
    """The running member formed the plan's group in the background while it trained inside elastic.run."""
    store = _server()
    _planned_in_elastic_run(store, "survivor")
    with pytest.raises(UnsupportedError):
        _newcomer(store, 6, planned=1).group(SETUP)


@pytest.mark.parametrize("from_checkpoint", [True, False], ids=["from-the-checkpoint", "nothing-committed"])
def test_workers_that_resume_a_job_whose_every_worker_was_lost_run_their_set_up_collectives(from_checkpoint):
    """Every spot host reclaimed at once: the dead workers were inside elastic.run in their rounds; the fresh
    workers' round starts over (from the checkpoint, or from initial weights if nothing was committed), so
    their set-up broadcast must run, or the job could never recover."""
    store = _server()
    _in_elastic_run(_worker("lost", store), 5)
    fresh = _newcomer(store, 7, from_checkpoint=from_checkpoint)
    assert fresh.group(SETUP) is fresh.pg  # not refused: its peers are fresh workers, at the same set-up


def test_fresh_workers_of_a_recovery_numbered_as_a_dropped_plan_are_not_refused():
    """Found by review: the members formed plan 1's group for round 6 in the background, then every one was
    lost; the driver dropped the plan and the recovery round from the checkpoint took the number 6 too."""
    store = _server()
    _planned_in_elastic_run(store, "lost")
    fresh = _newcomer(store, 6, from_checkpoint=True)
    assert fresh.group(SETUP) is fresh.pg


def test_workers_adopted_by_a_restarted_driver_mark_their_next_round_in_its_new_store():
    """A restarted driver serves a new, empty store; its adopted workers reconnect to it before their next
    round forms, and mark that round there: a newcomer of it is refused as with the first driver."""
    old, new = _server(), _server()
    survivor = _worker("survivor", old, store_address=f"127.0.0.1:{new.port}")
    _in_elastic_run(survivor, 5)
    survivor._store_stale = True  # adopted by the restarted driver (link.driver_link._reregister)
    _assigned(survivor, 6, 0, 2)
    survivor.rendezvous("update")
    with pytest.raises(UnsupportedError):
        _newcomer(new, 6).group(SETUP)


def _holder(store, secret: str = SECRET, standalone: bool = False):
    return SimpleNamespace(_store=store, standalone=standalone, settings=SimpleNamespace(secret=secret), worker_id="w",
                           job_id="j")


def test_a_mark_written_without_the_job_secret_is_not_believed():
    store = dist.HashStore()
    joining.mark_round(_holder(store, secret="a stranger's"), 3)
    assert not joining.peers_in_round(_holder(store), 3)
    dist.PrefixStore(round_namespace(SECRET, "j", 3) + joining._SUFFIX, store).set(joining._key(0), b"1")  # raw
    assert not joining.peers_in_round(_holder(store), 3)
    joining.mark_round(_holder(store), 3)
    assert joining.peers_in_round(_holder(store), 3) and not joining.peers_in_round(_holder(store), 4)
    assert not joining.peers_in_round(_holder(store), 3, plan=2)  # another formation of round 3


@pytest.fixture
def driver_store():
    """The driver's own store server (bounded at 1 MiB here: strangers' quarter 256 KiB), as it proves the job's
    connections; its address, the server (to ``forget`` rounds), and a new torch client on each call."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = StoreServer(sock, max_bytes=1 << 20, proves=round_keys(SECRET, "j")).start()
    client = lambda: dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=10))
    yield f"127.0.0.1:{server.port}", server, client
    server.close()


def test_a_strangers_flood_of_the_store_does_not_evict_a_mark_so_the_newcomer_is_still_refused(driver_store):
    """Found last session: the mark was written on a fresh connection that had named no key of the job's rounds,
    so the store counted it among a stranger's keys; an unauthenticated client's 400 KiB of junk evicted it, and
    the newcomer's set-up broadcast waited the collective timeout instead of the one-line refusal."""
    address, _, client = driver_store
    _planned_in_elastic_run(client(), "survivor", store_address=address)  # marks on a client of its own
    stranger = client()
    for i in range(400):
        stranger.set(f"junk{i}", b"x" * 1024)
    assert not stranger.check(["junk0"])  # the flood did push out the oldest of what unproven connections wrote
    with pytest.raises(UnsupportedError, match="called before hvd.elastic.run"):
        _newcomer(client(), 6, planned=1).group(SETUP)


def test_the_marks_go_with_their_rounds_keys(driver_store):
    """A job's marks do not pile up in the store over its rounds: the driver's forget of a round deletes them."""
    address, server, client = driver_store
    for round_ in (1, 2, 3):
        joining.mark_round(_holder(client()), round_)
    _planned_in_elastic_run(client(), "survivor", store_address=address)  # round 6, plan 1
    for round_ in (1, 2, 6):
        server.forget(round_namespace(SECRET, "j", round_))
    store = client()
    assert not joining.peers_in_round(_holder(store), 1) and not joining.peers_in_round(_holder(store), 6, 1)
    assert joining.peers_in_round(_holder(store), 3)  # a round not forgotten keeps its mark
    assert store.num_keys() == 1


def test_a_standalone_script_has_no_peers():
    joining.mark_round(_holder(None, standalone=True), 1)
    assert not joining.peers_in_round(_holder(None, standalone=True), 1)


def test_the_refusal_names_the_call_in_one_line():
    with pytest.raises(UnsupportedError) as raised:
        joining.refuse(SETUP)
    message = str(raised.value)
    assert "'broadcast resume_from_epoch' called before hvd.elastic.run" in message and "\n" not in message
    assert "move this call into the function hvd.elastic.run runs" in message
