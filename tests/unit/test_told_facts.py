"""A round's first sync is told its facts at rendezvous (``protocol.Assignment.facts``, ``driver.job.ranks``):
rank 0 learns every member's commit, whether it holds it and its host, exactly as each said when it asked, and
skips the gather (``worker.commit.sync_facts``); the other members learn only that it is so. A round with a member
that does not read them (an older worker) gathers as before, and a malformed account is refused in one line."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol import RendezvousRequest
from cloud_elastic.protocol_reports import MAX_TOLD_FACTS
from tests.unit.test_job import KILLED, Sim, assert_round
from tests.unit.test_job_next_round import formed

pytestmark = pytest.mark.timeout(10)


def asks(sim: Sim, accounts: dict[str, tuple[int, bool]], reason: str = "start", takes: bool = True) -> dict:
    """These workers come to rendezvous holding commit ``seq`` (exactly, or not), reading told facts or not."""
    for slot, (seq, holds) in accounts.items():
        wid = sim.id(slot)
        w = sim.job.workers[wid]
        if not w.registered:
            assert sim.job.registered(wid, sim.now)
        sim.job.rendezvous(wid, w.round, reason, sim.now, seq, 0, seq, holds, addresses=(sim.address(w.slot.host),),
                           takes_facts=takes)
    sim._collect()
    return {slot: sim.reply(slot) for slot in accounts}


def test_rank_0_is_told_each_members_account_as_it_said_it_and_the_others_that_it_is_told() -> None:
    sim = Sim(3)
    sim.discover({"a": 2, "b": 1})
    replies = asks(sim, {"a[0]": (0, True), "a[1]": (0, True), "b[0]": (0, True)})
    assert_round(replies, 1, needs_sync=True)
    by_rank = {r.ranks.rank: (slot, r) for slot, r in replies.items()}
    assert by_rank[0][1].facts == ((0, 1, 0), (0, 1, 0), (0, 1, 1))  # two hosts: a's two workers share an index
    assert by_rank[1][1].facts == () and by_rank[2][1].facts == ()
    # The wire form comes back the same to each rank (what a worker parses).
    assert all(Assignment.from_wire(r.to_wire()).facts == r.facts for r in replies.values())


def test_a_round_with_a_member_that_does_not_read_them_gathers_its_facts() -> None:
    sim = Sim(2)
    sim.discover({"a": 2})
    asks(sim, {"a[0]": (0, True)})
    replies = asks(sim, {"a[1]": (0, True)}, takes=False)  # an older worker
    replies = {slot: sim.reply(slot) for slot in ("a[0]", "a[1]")}
    assert_round(replies, 1, needs_sync=True)
    assert all(r.facts is None for r in replies.values())


def test_a_recovery_round_tells_rank_0_who_lost_its_commit_and_who_is_behind() -> None:
    sim = Sim(3, min_np=2)
    sim.discover({"a": 3})
    asks(sim, {"a[0]": (0, True), "a[1]": (0, True), "a[2]": (0, True)})
    sim.commit("a[0]", "a[1]", "a[2]")
    sim.exit("a[2]", KILLED)
    replies = asks(sim, {"a[0]": (7, True), "a[1]": (6, False)}, reason="failure")
    assert_round(replies, 2, needs_sync=True)
    rank0 = next(r for r in replies.values() if r.ranks.rank == 0)
    assert rank0.facts == ((7, 1, 0), (6, 0, 0))


def test_a_planned_rounds_newcomer_learns_it_is_told_before_the_round_forms_and_rank_0_then_gets_its_account() -> None:
    sim = Sim(2, max_np=3, plan_admissions=True)
    sim.discover({"a": 2})
    assert_round(asks(sim, {"a[0]": (0, True), "a[1]": (0, True)}), 1, needs_sync=True)
    sim.commit("a[0]", "a[1]")
    sim.discover({"a": 2, "b": 1})
    newcomer = asks(sim, {"b[0]": (0, True)})["b[0]"]
    assert isinstance(newcomer, Assignment) and newcomer.planned == 1 and newcomer.facts == ()
    formed(sim, "a[0]", "a[1]", "b[0]")
    sim.advance(1)
    replies = asks(sim, {"a[0]": (5, True), "a[1]": (5, True)}, reason="update")
    assert_round(replies, 2, needs_sync=True)
    rank0 = next(r for r in replies.values() if r.ranks.rank == 0)
    assert rank0.planned == 1 and rank0.facts == ((5, 1, 0), (5, 1, 0), (0, 1, 1))


@pytest.mark.parametrize("facts, rank", [
    ([[1, 1, 0]], 0),  # rank 0 of two given one row
    ([[1, 1, 0], [1, 2, 0]], 0),  # holds is 0 or 1
    ([[1, 1, 0], [-1, 1, 0]], 0),  # no negative commit
    ([[1, 1, 0], [True, 1, 0]], 0),  # numbers, not booleans
    ([[1, 1, 0], [1, 1]], 0),  # three numbers a row
    ([[1, 1, 0], [1, 1, 0]], 1),  # rows are for rank 0 only
    ("all", 0),
])
def test_a_malformed_account_is_refused_in_one_line(facts, rank) -> None:
    ranks = dict(rank=rank, size=2, local_rank=rank, local_size=2, cross_rank=0, cross_size=1)
    wire = dict(ranks, status="assigned", round=1, needs_sync=True, update_gen=0, facts=facts)
    with pytest.raises(ControlPlaneError, match=r"^malformed rendezvous assignment: 'facts' must be") as info:
        Assignment.from_wire(wire)
    assert "\n" not in str(info.value)


def test_rank_0_of_a_round_bigger_than_the_bound_is_refused_rows_it_would_have_to_allocate() -> None:
    size = MAX_TOLD_FACTS + 1
    wire = dict(rank=0, size=size, local_rank=0, local_size=1, cross_rank=0, cross_size=size, status="assigned",
                round=1, needs_sync=True, update_gen=0, facts=[[0, 1, 0]] * size)
    with pytest.raises(ControlPlaneError, match="'facts' must be"):
        Assignment.from_wire(wire)


def test_a_worker_says_it_reads_told_facts_and_an_older_ones_request_says_nothing() -> None:
    request = RendezvousRequest(0, "start", takes_facts=True)
    assert RendezvousRequest.from_wire(request.to_wire()).takes_facts
    older = {k: v for k, v in request.to_wire().items() if k != "takes_facts"}
    assert not RendezvousRequest.from_wire(older).takes_facts
