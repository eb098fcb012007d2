"""A round's members learn each other's addresses from their group's own store (``worker.rounds.peers``), not from
the driver: the assignment names no other member, so its size does not grow with the round's.

Real Gloo groups of real worker contexts over a real TCPStore, each member on a loopback address of its own.
"""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from cloud_elastic.control import round_namespace
from cloud_elastic.protocol import Assignment, RankInfo, RendezvousRequest
from cloud_elastic.worker.context import RoundInfo, WorkerContext
from cloud_elastic.worker.rounds.groups import RoundStore
from cloud_elastic.worker.interface import interface_addresses
from cloud_elastic.worker.rounds.peers import OwnAddresses, Peers, own_addresses
from cloud_elastic.worker.rounds.signed_store import SignedStore
from cloud_elastic.worker.settings import WorkerSettings
from tests.unit.test_job import started

pytestmark = pytest.mark.timeout(60)

SECRET = "s" * 64


@pytest.fixture
def server():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)


def _worker(server, name: str, host: str, **settings) -> WorkerContext:
    ctx = WorkerContext(WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address=f"127.0.0.1:{server.port}", job_id="peers",
        worker_id=name, hostname=host, secret=SECRET, backend="gloo", collective_timeout_s=30.0, malloc_tuning=False,
        **settings))
    ctx._store = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=30))
    return ctx


def test_the_members_of_a_group_know_every_members_address_once_it_formed_and_it_works(server):
    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    workers = [_worker(server, f"w{rank}", host) for rank, host in enumerate(hosts)]
    infos = [RoundInfo(r, 3, 0, 1, r, 3, round=1, needs_sync=False, update_gen=0, peers_in_store=True) for r in range(3)]
    forming = [threading.Thread(target=w._form_group, args=(info,)) for w, info in zip(workers[1:], infos[1:])]
    for t in forming:
        t.start()
    workers[0]._form_group(infos[0])
    for t in forming:
        t.join(30)
    works = [w.pg.allreduce([torch.ones(2)]) for w in workers[1:]]
    total = torch.ones(2)
    workers[0].wait(workers[0].pg.allreduce([total]), "allreduce")
    for work in works:
        work.wait()
    assert total.tolist() == [3.0, 3.0]
    for w in workers:
        assert w._group.store.peers.addresses() == set(hosts)
        assert w._member_addresses(w._group.store) == set(hosts)
        assert len(w._group.sockets) >= 1  # its connections to the members, found by address
    for w in workers:  # let go of, and destroyed before the test ends (as the worker's exit hook does)
        group, w._group = w._group, None
        w._reaper.release(group, after_s=0.0)
        del group
        assert w._reaper.drain(10)


def test_a_value_without_a_members_envelope_passes_unchanged_and_leaves_the_members_unknown(server):
    """An older worker writes no envelope: its value reaches torch as it was, and every connection the formation
    opened counts as the group's (as when no member's address was known)."""
    client = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=30))
    older = RoundStore(client, "r1-ns", SECRET, 5.0)  # no rank: no envelope
    older.set("0/1", b"\x02\x00gloo's address")
    reader = RoundStore(client, "r1-ns", SECRET, 5.0, Peers(0, 2, ("127.0.0.2",)))
    assert reader.get("0/1") == b"\x02\x00gloo's address"
    assert reader.peers.addresses() is None
    reader.set("0/0", b"mine")
    assert older.get("0/0") == b"mine" and older.peers.addresses() is None  # no rank of its own: it asks no one
    assert bytes(SignedStore(client, "r1-ns", SECRET).get("0/0")).endswith(b"mine")  # the envelope is signed


def test_a_malformed_envelope_fails_the_read_naming_the_key(server):
    client = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=30))
    envelope = Peers(1, 2, ("127.0.0.3",)).wrap(b"data")
    SignedStore(client, "r1-ns", SECRET).set("0/1", envelope.replace(b'"r":1', b'"r":"x"'))
    with pytest.raises(RuntimeError, match="'0/1': a malformed member envelope"):
        RoundStore(client, "r1-ns", SECRET, 5.0, Peers(0, 2)).get("0/1")


def test_a_workers_rendezvous_request_gives_its_hosts_addresses_and_the_ones_its_formation_could_not_reach(server):
    ctx = _worker(server, "w0", "127.0.0.5")
    ctx._client = object()  # every driver call goes through _call, answered below
    ctx._form_group = lambda info: setattr(ctx, "info", info)
    sent = []
    reply = Assignment(1, RankInfo(0, 1, 0, 1, 0, 1), True, 0).to_wire()
    ctx._call = lambda kind, payload=None, timeout_s=0.0: sent.append(payload) or reply
    ctx.unreachable = ("127.0.0.9",)  # what a formation given up at its deadline left (Peers.unreached)
    ctx.rendezvous("failure")
    request = RendezvousRequest.from_wire(sent[0])
    assert request.addresses == own_addresses("127.0.0.5") == ("127.0.0.5",)
    assert request.unreachable == ("127.0.0.9",)


def _older_worker(server, rank: int, size: int, out: dict) -> None:
    """A worker of a version before this change: plain signed values, whatever the store holds handed to Gloo."""
    client = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=30))
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timedelta(seconds=10)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    try:
        store = SignedStore(client, round_namespace(SECRET, "peers", 1), SECRET)
        pg = dist.ProcessGroupGloo(store, rank, size, opts)
        store.set(f"formed/{rank}", b"1")  # as its own formation says it formed (groups._formed)
        total = torch.ones(1)
        pg.allreduce([total]).wait()
        out["sum"] = total.item()
    except (RuntimeError, ValueError) as exc:
        out["error"] = str(exc)


@pytest.mark.parametrize("told", [False, True], ids=["told-no", "told-yes"])
def test_a_member_writes_its_addresses_only_when_told_every_member_reads_them(server, told):
    """A round with an older worker (one that gave no addresses at rendezvous) is assigned without
    ``peers_in_store``: the newer member writes plain values, and the group forms (its connections all count
    as the group's). Told otherwise, the older member hands the envelope to Gloo and cannot form the group."""
    older: dict = {}
    thread = threading.Thread(target=_older_worker, args=(server, 1, 2, older))
    thread.start()
    newer = _worker(server, "w0", "127.0.0.1", group_form_timeout_s=5.0)
    try:
        newer._form_group(RoundInfo(0, 2, 0, 1, 0, 2, round=1, needs_sync=False, update_gen=0, peers_in_store=told))
        newer.wait(newer.pg.allreduce([torch.ones(1)]), "allreduce")
    except Exception as exc:  # noqa: BLE001 - told-yes: the newer side fails with its peer
        assert told, exc
    thread.join(30)
    if told:
        assert "error" in older, older
        return
    assert older == {"sum": 2.0}
    assert newer._member_addresses(newer._group.store) is None
    group, newer._group = newer._group, None
    newer._reaper.release(group, after_s=0.0)
    del group
    assert newer._reaper.drain(10)


def test_the_driver_tells_a_round_to_write_addresses_in_its_store_only_when_every_member_gave_its_own() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1)  # Sim's workers give their host's address at rendezvous
    assert sim.reply("a[0]").peers_in_store and sim.reply("b[0]").peers_in_store
    older = sim.id("b[0]")  # back from a failure, as a worker of a version that gives none
    sim.job.rendezvous(sim.id("a[0]"), 1, "failure", sim.now, addresses=("10.77.0.1",))
    sim.job.rendezvous(older, 1, "failure", sim.now)
    sim._collect()
    assert sim.job.round == 2 and sim.reply("b[0]").ranks.size == 2
    assert not sim.reply("a[0]").peers_in_store and not sim.reply("b[0]").peers_in_store


def test_a_host_name_that_does_not_resolve_is_asked_again_only_after_a_while_and_a_resolved_one_never() -> None:
    """A name only the driver knows cost a resolver timeout (10 s by glibc's defaults) at every rendezvous and every
    round's store: a failure is kept ``retry_s``; the resolver stands in for a DNS server that never answers."""
    asked: list[str] = []
    now = [0.0]

    def resolver(name, port, proto=0):
        asked.append(name)
        if name.startswith("gpu-"):
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return [(socket.AF_INET, socket.SOCK_STREAM, proto, "", ("10.0.0.7", 0))]

    own = OwnAddresses(resolver, lambda: now[0], retry_s=60.0, limit=2)
    assert [own("gpu-a") for _ in range(5)] == [()] * 5 and asked == ["gpu-a"]
    now[0] = 59.9
    assert own("gpu-a") == () and asked == ["gpu-a"]
    now[0] = 60.0  # a name may come to resolve (a DNS record added): asked again once the failure expired
    assert own("gpu-a") == () and asked == ["gpu-a"] * 2
    assert own("node-7") == own("node-7") == ("10.0.0.7",) and asked.count("node-7") == 1
    now[0] = 10_000.0
    assert own("node-7") == ("10.0.0.7",) and asked.count("node-7") == 1  # a resolved name is kept
    assert own("gpu-a") == () and asked.count("gpu-a") == 3
    own("gpu-b")  # past ``limit`` names: the oldest (node-7) is dropped, and asked again
    assert own("node-7") == ("10.0.0.7",) and asked.count("node-7") == 2 and asked.count("gpu-a") == 3


def test_with_a_network_interface_a_worker_gives_the_interfaces_addresses_and_resolves_nothing(server):
    """--network-interface: Gloo binds the interface's address, whatever the host's name resolves to (here nothing:
    a name only the driver knows), so that is what the worker gives at rendezvous and in its round's store."""
    lo = interface_addresses("lo")
    assert "127.0.0.1" in lo
    ctx = _worker(server, "w0", "gpu-only-the-driver-knows.invalid", network_interface="lo")
    ctx._client = object()
    ctx._form_group = lambda info: setattr(ctx, "info", info)
    sent = []
    reply = Assignment(1, RankInfo(0, 1, 0, 1, 0, 1), True, 0).to_wire()
    ctx._call = lambda kind, payload=None, timeout_s=0.0: sent.append(payload) or reply
    ctx.rendezvous("start")
    assert RendezvousRequest.from_wire(sent[0]).addresses == lo
    info = RoundInfo(0, 2, 0, 1, 0, 2, round=1, needs_sync=False, update_gen=0, peers_in_store=True)
    assert ctx._round_store(info, "").peers.own == lo
