"""Worker hosts that cannot reach each other (both still reach the driver): the job never loops forever.

Every member of a round comes back with reason ``failure`` at the formation deadline, nobody died, and
nobody committed: after two such rounds in a row with members naming the peers they could not reach,
the side without rank 0 is excluded; without that evidence (or with too few workers left) the job ends
after three that lasted the elastic timeout, with one line naming the hosts (see
cloud_elastic.driver.job.partitions). Members name the addresses they could not reach, and the driver names
their hosts by the addresses each worker gives for its own host: no assignment lists the round's hosts.
"""

from __future__ import annotations

import socket
import time

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder
from cloud_elastic.driver.job.partitions import (
    BACKOFF_CAP_S, EXCLUDE_AFTER, FAILED_FORMATIONS_LIMIT, Partitions, backoff_s, hosts_to_exclude,
)
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol import RendezvousRequest
from cloud_elastic.worker.rounds.peers import Peers
from tests.unit.test_job import Sim, failed, started

pytestmark = pytest.mark.timeout(10)

FORM_DEADLINE_S = 60.0  # CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S's default
#: An elastic timeout that three failed formations (judged 60 s apart) outlast: the first is judged at 60 s.
SHORT = {"elastic_timeout_s": 2 * FORM_DEADLINE_S}


def formation_fails(sim: Sim, named: dict[str, tuple[str, ...]] | None = None) -> None:
    """The round's group does not form: at the deadline every member comes back with reason failure, its request
    (through the wire) saying the addresses of the hosts ``named[slot]`` it was still trying to reach, and its own."""
    sim.advance(FORM_DEADLINE_S)
    members = [str(w.slot) for w in sim.job.workers.values() if w.alive and w.round == sim.job.round and w.rank is not None]
    for slot in members:
        w = sim.job.workers[sim.id(slot)]
        request = RendezvousRequest.from_wire(RendezvousRequest(
            w.round, "failure", sim.commits.get(w.worker_id, 0), addresses=(sim.address(w.slot.host),),
            unreachable=tuple(sim.address(h) for h in (named or {}).get(slot, ()))).to_wire())
        sim.job.rendezvous(w.worker_id, w.round, "failure", sim.now, sim.commits.get(w.worker_id),
                           unreachable=request.unreachable, addresses=request.addresses)
    sim._collect()
    sim.advance(backoff_s(sim.job.rounds.partitions.streak))  # the next round forms once the back-off is over


def test_a_partition_with_no_evidence_ends_the_job_after_three_failed_formations_naming_the_hosts() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, **SHORT)
    for _ in range(FAILED_FORMATIONS_LIMIT - 1):
        formation_fails(sim)
        assert sim.outcome is None  # a formation may fail once or twice for other reasons
    assert sim.layout() == ["a[0]", "b[0]"] and sim.job.round == FAILED_FORMATIONS_LIMIT
    formation_fails(sim)
    failed(sim, "round formation failed 3 times in a row over 120s (--elastic-timeout 120s)", "hosts a, b",
           "no commit between them",
           "firewall or security group between worker hosts")
    assert "\n" not in sim.outcome.reason
    assert isinstance(sim.reply("a[0]"), ExitOrder) and isinstance(sim.reply("b[0]"), ExitOrder)


def test_a_group_that_cannot_form_on_one_host_ends_the_job_naming_what_the_workers_logged_not_a_firewall() -> None:
    # A mistyped --network-interface: every member is back at once, round after round, on a single host.
    sim = started(2, {"a": 2}, **SHORT)
    for _ in range(FAILED_FORMATIONS_LIMIT - 1):
        formation_fails(sim)
        assert sim.outcome is None
    formation_fails(sim)
    failed(sim, "round formation failed 3 times in a row over 120s", "on host a alone",
           "could not form the process group of round N", "--network-interface")
    assert "firewall" not in sim.outcome.reason and "\n" not in sim.outcome.reason


def test_failed_formations_in_a_row_back_the_next_round_off_short_growing_and_capped() -> None:
    from tests.unit.job_view import FakeJob, S

    assert [backoff_s(n) for n in range(9)] == [0.0, 0.0, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, BACKOFF_CAP_S]
    assert backoff_s(10_000) == BACKOFF_CAP_S
    job = FakeJob(2, elastic_timeout_s=600.0)
    members = [job.worker("a", i, S.WAITING, round_=1, rank=i) for i in range(2)]
    partitions, now = Partitions(job, lambda w, why: None), 1000.0
    for streak in (1, 2, 3):
        job.round = job.abort_round = streak
        for w in members:
            w.round, w.rdzv_reason = streak, "failure"
        partitions.formed(streak, members)
        assert partitions.check(members, now) and partitions.streak == streak
        assert partitions.holding(now + backoff_s(streak) - 0.01) and not partitions.holding(now + backoff_s(streak))
        now += 1.0
    job.round += 1
    partitions.formed(job.round, members)  # this round trains: no back-off before the next one
    for w in members:
        w.round, w.rdzv_reason = job.round, "update"
    assert partitions.check(members, now) and partitions.streak == 0 and not partitions.holding(now)


def test_a_round_whose_group_fails_at_once_is_formed_again_only_after_the_back_off() -> None:
    """A mistyped --network-interface fails every formation at once: the job formed thousands of rounds a
    second (2,559 rounds and 1.9 MB of log in 53 s) until it ended."""
    sim = started(2, {"a": 2}, **SHORT)
    for streak in (1, 2, 3):
        round_ = sim.job.round
        if streak == 1:  # the first failure is retried at once (a transient one recovers without a wait)
            formation_fails(sim)
            continue
        for slot in ("a[0]", "a[1]"):
            w = sim.job.workers[sim.id(slot)]
            sim.job.rendezvous(w.worker_id, w.round, "failure", sim.now, None)
        sim._collect()
        sim.advance(backoff_s(streak) * 0.9)
        assert sim.job.round == round_, streak  # backing off
        sim.advance(backoff_s(streak) * 0.2)
        assert sim.job.round == round_ + 1, streak


def test_a_partition_that_heals_within_the_elastic_timeout_trains_on_from_the_workers_state() -> None:
    # The default --elastic-timeout (600 s): three failed formations (3 minutes) do not end the job, whose
    # trained state lives only in its workers; the network comes back and the next round trains on.
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    sim.commit("a[0]", "b[0]")
    for _ in range(FAILED_FORMATIONS_LIMIT + 2):
        formation_fails(sim)
        assert sim.outcome is None
    assert sim.layout() == ["a[0]", "b[0]"]
    sim.commit("a[0]", "b[0]")  # the partition healed: this round formed and trained
    assert sim.outcome is None
    # Left unhealed, failed formations end the job once they have lasted the elastic timeout.
    while sim.outcome is None and sim.now < 3000:
        formation_fails(sim)
    failed(sim, "(--elastic-timeout 600s)")


def test_members_naming_the_peer_they_cannot_reach_exclude_the_side_without_rank_0() -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    assert sim.layout() == ["a[0]", "b[0]", "c[0]"]
    # b and c cannot reach each other; both reach a (rank 0, holding the state) and the driver.
    evidence = {"b[0]": ("c",), "c[0]": ("b",)}
    for _ in range(EXCLUDE_AFTER - 1):
        formation_fails(sim, evidence)
        assert not sim.blocked("c[0]")
    formation_fails(sim, evidence)
    assert sim.outcome is None
    assert isinstance(sim.reply("c[0]"), ExitOrder) and "partitioned" in sim.reply("c[0]").reason
    assert sim.blocked("c[0]") and not sim.blocked("b[0]") and not sim.blocked("a[0]")
    assert sim.layout() == ["a[0]", "b[0]"]  # the round formed without c, at a smaller size
    assert isinstance(sim.reply("a[0]"), Assignment) and sim.reply("a[0]").ranks.size == 2
    # The round trains: a later failed formation starts the count over instead of ending the job.
    sim.commit("a[0]", "b[0]")
    formation_fails(sim)
    formation_fails(sim)
    assert sim.outcome is None and sim.layout() == ["a[0]", "b[0]"]


def test_excluding_a_side_below_min_np_ends_the_job_naming_who_cannot_reach_whom() -> None:
    sim = started(2, {"a": 1, "b": 1}, **SHORT)  # --min-np 2: neither side may be left alone
    for _ in range(FAILED_FORMATIONS_LIMIT):
        formation_fails(sim, {"b[0]": ("a",)})
    failed(sim, "round formation failed 3 times", "b cannot reach a", "fewer than --min-np 2")
    assert not sim.blocked("b[0]")


def test_a_commit_between_failed_formations_starts_the_count_over() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, **SHORT)
    for _ in range(FAILED_FORMATIONS_LIMIT - 1):
        formation_fails(sim)
    sim.commit("a[0]", "b[0]")  # the round formed this time and trained, then failed: it does not count
    for _ in range(FAILED_FORMATIONS_LIMIT):
        formation_fails(sim)
        assert sim.outcome is None
    formation_fails(sim)
    failed(sim, f"failed {FAILED_FORMATIONS_LIMIT} times in a row")


def test_a_member_that_died_is_a_failure_not_a_partition() -> None:
    sim = started(2, {"a": 1, "b": 1}, cooldown=(0.0, 1.0), **SHORT)  # 0 1: a failed slot is retried at once
    for i in range(FAILED_FORMATIONS_LIMIT + 1):
        round_ = sim.job.round
        sim.job.heartbeat(sim.id("a[0]"), sim.now, commit_seq=i + 1)  # a step trained: not the same failure again
        sim.exit("b[0]")  # crashes before committing; relaunched on its slot, the round re-forms with it
        sim.join("a[0]", reason="failure")
        sim.advance(1)
        sim.join("b[0]")
        assert sim.job.round == round_ + 1 and sim.layout() == ["a[0]", "b[0]"]
    # None of those rounds counted: only the next three failed formations end the job.
    for _ in range(FAILED_FORMATIONS_LIMIT - 1):
        formation_fails(sim)
        assert sim.outcome is None
    formation_fails(sim)
    failed(sim, f"failed {FAILED_FORMATIONS_LIMIT} times in a row")


@pytest.mark.parametrize("edges, keep, gone", [
    ([("b", "c"), ("c", "b")], "a", ["c"]),  # a tie between b and c: the newer host goes
    ([("a", "b")], "a", ["b"]),  # rank 0's host is never excluded
    ([("a", "c"), ("b", "c"), ("d", "c")], "a", ["c"]),  # the host nobody reaches
    ([("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")], "a", ["d", "c"]),  # {a, b} | {c, d}
])
def test_hosts_to_exclude_keep_rank_0_and_cut_every_unreachable_pair(edges, keep, gone) -> None:
    assert hosts_to_exclude(edges, keep, "abcd".index) == gone


def test_the_rendezvous_request_carries_unreachable_and_own_addresses_within_bounds() -> None:
    request = RendezvousRequest(3, "failure", unreachable=("10.0.0.2", "fd00::0:7"), addresses=("10.0.0.1",))
    parsed = RendezvousRequest.from_wire(request.to_wire())
    assert parsed.unreachable == ("10.0.0.2", "fd00::7") and parsed.addresses == ("10.0.0.1",)
    older = {k: v for k, v in request.to_wire().items() if k not in ("unreachable", "addresses")}
    assert RendezvousRequest.from_wire(older).unreachable == ()
    assert RendezvousRequest.from_wire(older).addresses is None  # an older worker: it reads no peer's in the store
    for field in ("unreachable", "addresses"):
        for bad in ([f"10.0.0.{i}" for i in range(17)], [3], [""], ["b"], ["10.0.0.256"], ["x" * 256], "10.0.0.2"):
            with pytest.raises(ControlPlaneError, match=f"'{field}' must be a list of at most 16 IP addresses"):
                RendezvousRequest.from_wire({**request.to_wire(), field: bad})


def test_a_partition_is_named_by_host_from_the_addresses_the_members_report() -> None:
    """A member names addresses (its group's peers), not hosts: the driver names the hosts, from the addresses
    each worker gave for its own host. An address no member gave (another thread's connection) names nobody."""
    sim = started(3, {"a": 1, "b": 1, "c": 1}, **SHORT)  # --min-np 3: no side may go
    for _ in range(FAILED_FORMATIONS_LIMIT):
        formation_fails(sim, {"a[0]": ("stranger",), "b[0]": ("c",)})
    failed(sim, "hosts a, b, c", "members reported b cannot reach c, and excluding a side would leave fewer")
    assert "stranger" not in sim.outcome.reason and "10.77." not in sim.outcome.reason


def test_a_worker_names_the_peer_address_its_connection_is_unanswered_by() -> None:
    # A listener whose accept queue is full drops new SYNs, as a firewall dropping packets does.
    listener = socket.socket()
    listener.bind(("127.0.0.3", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    tries = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.3", port))
            tries.append(s)
        found: tuple[str, ...] = ()
        deadline = time.monotonic() + 5
        while not found and time.monotonic() < deadline:  # the kernel answers the first connections at once
            found = Peers(0, 3, ("127.0.0.2",)).unreached()
            time.sleep(0.05)
        assert found == ("127.0.0.3",)
        assert Peers(0, 2, ("127.0.0.3",)).unreached() == ()  # never its own host's
    finally:
        for s in tries:
            s.close()
        listener.close()


# ------------------------------------------------- an older worker among the members (versions mix in a rollout)
def _address(sim: Sim, host: str) -> str:
    """The address a peer's Gloo connects to on ``host``: its name when that is an IP address, as discovery names most
    hosts, else what it resolves to (an address only the host's own workers can give the driver)."""
    return host if host[0].isdigit() else sim.address(host)


def _older_request(sim: Sim, slot: str, last_round: int, reason: str, cut: tuple[str, ...]) -> RendezvousRequest:
    """The rendezvous request of a worker before addresses (c25ce36's, on the wire): no ``addresses``, and for
    evidence the hosts of its assignment's ``hosts`` it was still trying to reach (its ``unreached_hosts``)."""
    reply = sim.reply(slot)
    hosts = reply.to_wire().get("hosts") or [] if isinstance(reply, Assignment) else []
    return RendezvousRequest.from_wire({"last_round": last_round, "reason": reason, "commits": 0, "rolled_back": 0,
                                        "commit_seq": 0, "holds_commit": True,
                                        "unreachable": [h for h in hosts if h in cut]})


def _started_mixed(hosts: str, older: str, **kwargs) -> Sim:
    """A job on one-slot ``hosts``, the worker on ``older`` of a version that gives no addresses, its first round
    formed."""
    sim = Sim(3, **kwargs)
    sim.discover({h: 1 for h in hosts.split()})
    for w in list(sim.job.workers.values()):
        assert sim.job.registered(w.worker_id, sim.now)
        if w.slot.host == older:
            request = _older_request(sim, str(w.slot), 0, "start", ())
            sim.job.rendezvous(w.worker_id, 0, "start", sim.now, unreachable=request.unreachable,
                               addresses=request.addresses)
        else:
            sim.job.rendezvous(w.worker_id, 0, "start", sim.now, addresses=(_address(sim, w.slot.host),))
    sim._collect()
    assert sim.job.round == 1
    return sim


def _mixed_formation_fails(sim: Sim, older: str, cut: dict[str, tuple[str, ...]]) -> None:
    """As :func:`formation_fails`, each member still trying to reach the hosts ``cut[slot]`` (the side that connects:
    its peer, which only accepts, says nothing), the worker on host ``older`` speaking as an older worker does."""
    sim.advance(FORM_DEADLINE_S)
    for w in [w for w in sim.job.workers.values() if w.alive and w.round == sim.job.round and w.rank is not None]:
        slot = str(w.slot)
        if w.slot.host == older:
            request = _older_request(sim, slot, w.round, "failure", cut.get(slot, ()))
        else:
            request = RendezvousRequest.from_wire(RendezvousRequest(
                w.round, "failure", addresses=(_address(sim, w.slot.host),),
                unreachable=tuple(_address(sim, h) for h in cut.get(slot, ()))).to_wire())
        sim.job.rendezvous(w.worker_id, w.round, "failure", sim.now, unreachable=request.unreachable,
                           addresses=request.addresses)
    sim._collect()
    sim.advance(backoff_s(sim.job.rounds.partitions.streak))


@pytest.mark.parametrize("hosts, connecting", [
    ("a b c", "c[0]"),  # hosts by name: only the older worker's own evidence can name the cut
    ("10.0.0.2 10.0.0.3 10.0.0.4", "10.0.0.3[0]"),  # by IP: the newer worker's names the older's host
    ("10.0.0.2 10.0.0.3 10.0.0.4", "10.0.0.4[0]"),
], ids=["names-older-connects", "ips-newer-connects", "ips-older-connects"])
def test_a_partition_with_an_older_worker_excludes_its_side_as_with_newer_workers(hosts, connecting) -> None:
    """The two hosts without rank 0 cannot reach each other, one of them runs a worker before addresses (a
    rollout), and whichever side is left connecting reports: its host is excluded and the job trains on at two
    (the job used to end: 'round formation failed 5 times')."""
    a, b, c = hosts.split()
    sim = _started_mixed(hosts, older=c, min_np=1, **SHORT)
    assert sim.layout() == [f"{a}[0]", f"{b}[0]", f"{c}[0]"]
    # Only the older worker is told the round's hosts (what it names its evidence from); a newer one reads none.
    assert sim.reply(f"{c}[0]").to_wire()["hosts"] == [a, b, c]
    assert "hosts" not in sim.reply(f"{a}[0]").to_wire() and "hosts" not in sim.reply(f"{b}[0]").to_wire()
    peer = {f"{b}[0]": c, f"{c}[0]": b}[connecting]
    for _ in range(EXCLUDE_AFTER):
        assert sim.outcome is None
        _mixed_formation_fails(sim, c, {connecting: (peer,)})
    assert sim.outcome is None, sim.outcome
    assert isinstance(sim.reply(f"{c}[0]"), ExitOrder) and "partitioned" in sim.reply(f"{c}[0]").reason
    assert sim.layout() == [f"{a}[0]", f"{b}[0]"] and sim.blocked(f"{c}[0]")
    assert "hosts" not in sim.reply(f"{b}[0]").to_wire()  # every member gives addresses again: none listed


def test_an_older_workers_evidence_by_host_name_is_read_and_bounded() -> None:
    older = {"last_round": 1, "reason": "failure", "unreachable": ["gpu-b", "10.0.0.3"]}
    request = RendezvousRequest.from_wire(older)
    assert request.addresses is None and request.unreachable == ("gpu-b", "10.0.0.3")
    for bad in ([f"h{i}" for i in range(17)], [""], ["x" * 256], [3], "gpu-b"):
        with pytest.raises(ControlPlaneError, match="'unreachable' must be a list of at most 16 host names"):
            RendezvousRequest.from_wire({**older, "unreachable": bad})
    # A newer worker's (it gives its addresses) still names addresses only.
    with pytest.raises(ControlPlaneError, match="'unreachable' must be a list of at most 16 IP addresses"):
        RendezvousRequest.from_wire({**older, "addresses": ["10.0.0.1"]})


def test_a_partition_no_one_could_name_next_to_an_older_worker_ends_the_job_naming_the_older_workers_hosts() -> None:
    """Hosts by name, and only the newer side connecting: its report of the older worker's address names no host
    (the older worker gives none), so the job ends, and its line says which hosts run an older version."""
    sim = _started_mixed("a b c", older="c", min_np=1, **SHORT)
    while sim.outcome is None and sim.now < 3000:
        _mixed_formation_fails(sim, "c", {"b[0]": ("c",)})
    failed(sim, "round formation failed 3 times", "hosts a, b, c", "the workers on c run an older cloud-elastic",
           "firewall")
    assert "\n" not in sim.outcome.reason
