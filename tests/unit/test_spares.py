"""Spares (``--spares N``) in the pure job, on scripted timelines (cloud_elastic.driver.job.spares).

When a spare is used (a failure's recovery round, the round where a leaving host's
workers leave), when it becomes a member because ``--max-np`` allows it, which spare
goes first, and what a spare's own failure costs.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder, WorkerState
from cloud_elastic.driver.job.plan import Candidate
from cloud_elastic.driver.job.spares import admit, has_room, launch_room, spare_slots
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import CLEAN, KILLED, Sim, assert_round
from tests.unit.test_job_sourcing import Sourced

pytestmark = pytest.mark.timeout(10)

FOUR = {"a": 1, "b": 1, "c": 1, "d": 1}


def with_spare(np: int = 3, ready: dict[str, int] | None = None, **kwargs) -> Sim:
    """-np ``np`` and one spare; the first round has formed and the spare waits."""
    sim = Sim(np, spares=1, min_np=1, **kwargs)
    sim.discover(ready or FOUR)
    assert sim.slots_launched() == ["a[0]", "b[0]", "c[0]", "d[0]"][: np + 1]
    assert_round(sim.join("a[0]", "b[0]", "c[0]"), 1, needs_sync=True)
    assert sim.join("d[0]") == {"d[0]": None}
    return sim


def spares_events(sim: Sim) -> list[dict]:
    return [f for kind, f in sim.events if kind == "spares"]


def rounds_formed(sim: Sim) -> list[dict]:
    return [f for kind, f in sim.events if kind == "round_formed"]


def state(sim: Sim, slot: str) -> WorkerState:
    return sim.job.workers[sim.id(slot)].state


def test_a_spare_starts_beyond_the_job_size_and_waits_outside_the_full_round_without_stopping_it() -> None:
    sim = with_spare()
    assert sim.layout() == ["a[0]", "b[0]", "c[0]"]
    sim.advance(5)
    poll = sim.poll("a[0]")
    assert (poll.update_gen, poll.abort_round) == (0, 0)  # the full round is not stopped for the spare
    assert sim.reply("d[0]") is None and state(sim, "d[0]") is WorkerState.WAITING
    assert spares_events(sim) == [{"ready": 1, "wanted": 1, "workers": [sim.id("d[0]")]}]
    assert sim.job.rounds.spare_ids == (sim.id("d[0]"),)
    assert len(sim.launched) == 4  # nothing more: -np 3 and one spare


def test_the_first_round_takes_np_and_the_last_worker_ready_is_the_spare() -> None:
    sim = Sim(2, spares=1)
    sim.discover({"a": 1, "b": 1, "c": 1})
    sim.join("c[0]")
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    assert sim.layout() == ["a[0]", "c[0]"]
    assert sim.join("b[0]") == {"b[0]": None}


def test_a_failure_is_replaced_by_the_spare_in_the_same_recovery_and_the_spare_is_refilled() -> None:
    sim = with_spare()
    sim.exit("b[0]", KILLED)
    assert sim.poll("a[0]").abort_round == 1 and sim.blocked("b[0]")
    replies = sim.join("a[0]", "c[0]", reason="failure")
    # The recovery round has the size of the last one: the spare is in it and syncs from rank 0.
    assert_round({**replies, "d[0]": sim.reply("d[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "c[0]", "d[0]"]
    formed = rounds_formed(sim)[-1]
    assert (formed["size"], formed["spares_taken"]) == (3, 1)
    assert spares_events(sim)[-1]["ready"] == 0
    sim.discover({**FOUR, "e": 1})  # a new host: it is the next spare
    assert sim.slots_launched()[-1] == "e[0]"
    assert sim.join("e[0]") == {"e[0]": None}
    assert sim.poll("a[0]").update_gen == sim.reply("a[0]").update_gen  # no change is asked of round 2
    sim.advance(1)
    assert spares_events(sim)[-1] == {"ready": 1, "wanted": 1, "workers": [sim.id("e[0]")]}


def test_a_notice_is_replaced_at_the_commit_where_the_host_leaves_without_a_rollback() -> None:
    sim = with_spare(ready={**FOUR, "e": 1})
    sim.discover({"a": 1, "b": 1, "d": 1, "e": 1}, {"c": Drain(reason="spot interruption")})
    assert state(sim, "c[0]") is WorkerState.DRAINING
    assert sim.slots_launched()[-1] == "e[0]"  # the next spare starts while the host still runs
    poll = sim.poll("a[0]")
    assert (poll.update_gen, poll.abort_round) == (1, 0)
    replies = sim.join("a[0]", "b[0]", reason="update")
    assert isinstance(sim.join("c[0]", reason="update")["c[0]"], ExitOrder)
    assert_round({**replies, "d[0]": sim.reply("d[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "b[0]", "d[0]"]
    assert [f["size"] for f in rounds_formed(sim)] == [3, 3]
    assert not [kind for kind, _ in sim.events if kind == "rollback"]
    sim.exit("c[0]", CLEAN)
    assert sim.join("e[0]") == {"e[0]": None} and sim.poll("a[0]").update_gen == 1


def test_a_spare_that_fails_while_waiting_is_blacklisted_and_replaced_and_the_round_goes_on() -> None:
    sim = with_spare(ready={**FOUR, "e": 1})
    sim.advance(1)
    sim.exit("d[0]", KILLED)
    assert sim.blocked("d[0]")
    failed = [f for kind, f in sim.events if kind == "worker_failed"]
    assert [(f["worker"], f["rank"]) for f in failed] == [(sim.id("d[0]"), None)]
    poll = sim.poll("a[0]")
    assert (poll.update_gen, poll.abort_round, sim.job.round) == (0, 0, 1)
    assert sim.slots_launched()[-1] == "e[0]"
    sim.join("e[0]")
    sim.advance(1)
    assert [e["ready"] for e in spares_events(sim)] == [1, 0, 1]


def test_a_rollback_names_the_member_that_failed_not_a_spare_that_failed_beside_it() -> None:
    # Found by review (h4, 2026-12-01): a member and the waiting spare killed together; the rollback event said
    # "worker d[0]#4 (not yet ranked) killed by signal 9", the spare that aborted nothing.
    sim = with_spare(ready={**FOUR, "e": 1})
    sim.commit("a[0]", "b[0]", "c[0]")
    sim.exit("c[0]", KILLED)
    sim.exit("d[0]", KILLED)
    sim.join("a[0]", "b[0]", reason="failure")
    sim.advance(1)
    (rollback,) = [f for kind, f in sim.events if kind == "rollback"]
    assert rollback["reason"].startswith(f"worker {sim.id('c[0]')} "), rollback


def test_a_job_whose_state_is_lost_launches_no_replacement_spare() -> None:
    # Found by review (h4, 2026-12-01): -np 2 --spares 2, both members killed at once, no --checkpoint-dir: the job
    # failed "training state lost" and, in the same step, launched a worker in a spare's place.
    sim = Sim(2, spares=2, min_np=1)
    sim.discover({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.join("c[0]", "d[0]")
    sim.commit("a[0]", "b[0]")
    sim.advance(1)
    sim.exit("a[0]", KILLED)  # b still holds the state: a spare takes a's place, and e starts in the spare's
    launched = len(sim.launched)
    sim.exit("b[0]", KILLED)  # the last holder
    assert sim.outcome is not None and sim.outcome.reason.startswith("training state lost"), sim.outcome
    assert len(sim.launched) == launched, sim.slots_launched()[launched:]


def test_a_spare_drained_before_it_took_its_place_in_the_recovery_round_still_joins_then_leaves_at_a_commit(
        ) -> None:
    sim = with_spare()
    sim.exit("c[0]", KILLED)
    assert_round(sim.join("a[0]", "b[0]", reason="failure"), 2, needs_sync=True)
    assert "d[0]" in sim.layout()
    # A notice for d's host arrives before d's held rendezvous is answered: its peers wait for it in the group.
    sim.discover({"a": 1, "b": 1, "c": 1}, {"d": Drain(reason="spot")})
    reply = sim.reply("d[0]")
    assert isinstance(reply, Assignment) and reply.round == 2, reply
    assert sim.poll("a[0]").update_gen > reply.update_gen  # it leaves at the round's first commit
    rollbacks = [f for kind, f in sim.events if kind == "rollback"]
    sim.commit("a[0]", "b[0]", "d[0]")
    replies = sim.join("a[0]", "b[0]", reason="update")
    assert isinstance(sim.join("d[0]", reason="update")["d[0]"], ExitOrder)
    assert_round(replies, 3, needs_sync=False)  # the survivors hold the commit: nothing to sync
    assert sim.layout() == ["a[0]", "b[0]"]
    assert [f for kind, f in sim.events if kind == "rollback"] == rollbacks  # left at a commit: none rolled back


def test_the_spare_waiting_longest_goes_first() -> None:
    sim = Sim(3, spares=2, min_np=1)
    sim.discover({**FOUR, "e": 1})
    assert_round(sim.join("a[0]", "b[0]", "c[0]"), 1, needs_sync=True)
    sim.join("e[0]")
    sim.join("d[0]")
    sim.advance(1)
    assert sim.job.rounds.spare_ids == (sim.id("e[0]"), sim.id("d[0]"))
    sim.exit("a[0]", KILLED)
    sim.join("b[0]", "c[0]", reason="failure")
    assert sim.layout() == ["b[0]", "c[0]", "e[0]"]  # e waited longer than the older host d
    assert sim.reply("d[0]") is None


def test_a_spare_from_the_preferred_source_goes_first() -> None:
    sim = Sourced(2, spares=2, min_np=1)
    sim.groups(a=3, b=1)
    assert sim.slots_launched() == ["a0[0]", "a1[0]", "a2[0]", "b0[0]"]
    sim.join("a0[0]", "a1[0]")
    sim.join("b0[0]")  # ready first, but on the dearer source
    sim.join("a2[0]")
    sim.exit("a1[0]", KILLED)
    sim.join("a0[0]", reason="failure")
    assert sim.layout() == ["a0[0]", "a2[0]"]


def test_a_spare_becomes_a_member_at_the_next_commit_when_max_np_allows_it() -> None:
    sim = Sim(2, max_np=3, spares=1, min_np=1)
    assert_round(sim.start({"a": 2}), 1, needs_sync=True)
    sim.discover({"a": 2, "b": 1})
    sim.join("b[0]")  # below --max-np: a newcomer, not a spare; it joins at the next commit
    assert sim.poll("a[0]").update_gen == 1
    assert_round(sim.join("a[0]", "a[1]", reason="update"), 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]", "b[0]"]
    sim.discover({"a": 2, "b": 1, "c": 1})
    sim.join("c[0]")  # the round is at --max-np: c is a spare and stops nothing
    assert sim.poll("a[0]").update_gen == 1 and sim.reply("c[0]") is None
    sim.advance(1)
    assert spares_events(sim)[-1]["workers"] == [sim.id("c[0]")]


def test_with_whole_hosts_the_first_round_waits_for_np_slots_on_whole_hosts() -> None:
    sim = Sim(4, whole_host_slots=2, spares=1, min_np=2)
    sim.discover({"a": 2, "b": 2, "c": 2})
    # -np 4 workers are ready, but only host c is whole: no round of host c alone, then a reset to grow it.
    assert sim.join("a[0]", "b[0]", "c[0]", "c[1]") == {"a[0]": None, "b[0]": None, "c[0]": None, "c[1]": None}
    sim.join("a[1]")
    assert sorted(sim.layout()) == ["a[0]", "a[1]", "c[0]", "c[1]"] and sim.job.round == 1 and sim.job.resets == 0


def test_with_whole_hosts_a_spare_is_a_whole_host() -> None:
    sim = Sim(4, whole_host_slots=2, spares=1, min_np=2)
    sim.discover({"a": 2, "b": 2, "c": 2, "d": 2})
    assert sim.slots_launched() == ["a[0]", "a[1]", "b[0]", "b[1]", "c[0]", "c[1]"]
    assert_round(sim.join("a[0]", "a[1]", "b[0]", "b[1]"), 1, needs_sync=True)
    sim.join("c[0]", "c[1]")
    sim.advance(1)
    assert sim.poll("a[0]").update_gen == 0
    assert spares_events(sim)[-1]["ready"] == 2 and spares_events(sim)[-1]["wanted"] == 2
    sim.exit("b[0]", KILLED)  # the whole host b leaves; the spare host takes its place
    sim.join("a[0]", "a[1]", reason="failure")
    assert isinstance(sim.join("b[1]", reason="failure")["b[1]"], ExitOrder)
    assert sim.layout() == ["a[0]", "a[1]", "c[0]", "c[1]"]
    assert rounds_formed(sim)[-1]["spares_taken"] == 2
    sim.exit("b[1]", CLEAN)
    assert sim.slots_launched()[-2:] == ["d[0]", "d[1]"]  # the next spare host


def test_a_spare_is_told_to_exit_when_the_job_finishes() -> None:
    sim = with_spare()
    for slot in ("a[0]", "b[0]", "c[0]"):
        sim.complete(slot)
    order = sim.reply("d[0]")
    assert isinstance(order, ExitOrder)
    sim.exit("d[0]", CLEAN)
    for slot in ("a[0]", "b[0]", "c[0]"):
        sim.exit(slot, CLEAN)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome


def test_without_spares_nothing_starts_beyond_max_np() -> None:
    sim = Sim(3, min_np=1)
    sim.discover(FOUR)
    assert len(sim.launched) == 3 and not isinstance(sim.join("a[0]")["a[0]"], Assignment)
    assert not spares_events(sim)


# ------------------------------------------------------------------------------ the pure rules

def test_counts_room_and_launches() -> None:
    assert spare_slots(2, 0) == 2 and spare_slots(2, 4) == 8
    assert launch_room(3, max_np=3, spares=1, host_slots=0) == 1
    assert launch_room(4, max_np=4, spares=1, host_slots=2) == 2
    assert has_room(2, max_np=3, host_slots=0) and not has_room(3, max_np=3, host_slots=0)
    assert not has_room(3, max_np=4, host_slots=2) and has_room(2, max_np=4, host_slots=2)


def cand(worker: str, host: str, slot: int = 0, prev_rank: int | None = None) -> Candidate:
    return Candidate(worker, host, slot, prev_rank, prev_rank is not None, (), 5 if prev_rank is not None else 0)


def test_admit_keeps_survivors_and_takes_newcomers_by_key_whole_hosts_under_whole_hosts() -> None:
    waiting = [cand("s1", "a", 0, 0), cand("n1", "b"), cand("s2", "a", 1, 1), cand("n2", "c")]
    order = {"n1": 2, "n2": 1}
    picked = admit(waiting, max_np=3, host_slots=0, key=lambda c: order[c.worker_id])
    assert [c.worker_id for c in picked] == ["s1", "s2", "n2"]
    assert admit(waiting[:3], max_np=3, host_slots=0, key=lambda c: 0) == waiting[:3]
    hosts = [cand("s1", "a", 0, 0), cand("s2", "a", 1, 1), cand("x0", "x", 0), cand("y0", "y", 0),
             cand("x1", "x", 1), cand("y1", "y", 1)]
    order = {"x0": 3, "x1": 4, "y0": 1, "y1": 2}
    picked = admit(hosts, max_np=4, host_slots=2, key=lambda c: order.get(c.worker_id, 0))
    assert [c.worker_id for c in picked] == ["s1", "s2", "y0", "y1"]


def test_status_marks_the_spares_and_counts_them() -> None:
    from cloud_elastic.config import JobConfig
    from cloud_elastic.driver.job.status_reply import status_reply
    from cloud_elastic.status import StatusReply, render_status

    sim = with_spare()
    config = JobConfig(command=("python", "t.py"), num_proc=3, min_np=1, max_np=3, spares=1)
    reply = StatusReply.from_json(status_reply(sim.job, config, provider="static", now=sim.now, wall_now=sim.now,
                                               uptime_s=10).to_json())  # as it comes over the wire
    assert (reply.world_size, reply.spares, reply.spares_wanted) == (3, 1, 1)
    text = render_status(reply, now=sim.now)
    assert "world size 3 (-np 3, --min-np 1, --max-np 3), spares 1 of 1" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line[:2] in ("a ", "b ", "c ", "d ")}
    assert rows["d"].endswith("[0] spare") and "rank 0 training" in rows["a"]
    sim.complete("a[0]")  # rank 0 returned: the job finishes, and the spare is told to exit
    finishing = status_reply(sim.job, config, provider="static", now=sim.now, wall_now=sim.now, uptime_s=11)
    assert finishing.spares == 0 and "spare" not in render_status(finishing, now=sim.now).split("spares 0 of 1")[-1]
    assert spares_events(sim)[-1] == {"ready": 0, "wanted": 1, "workers": []}



def test_a_notice_for_the_spares_host_sends_the_spare_away_unblamed_and_another_takes_its_place() -> None:
    sim = with_spare(ready={**FOUR, "e": 1})
    sim.discover({"a": 1, "b": 1, "c": 1, "e": 1}, {"d": Drain(reason="spot interruption")})
    assert isinstance(sim.reply("d[0]"), ExitOrder)
    sim.exit("d[0]", CLEAN)
    assert not sim.blocked("d[0]") and sim.poll("a[0]").update_gen == 0  # the round did not stop for it
    assert sim.slots_launched()[-1] == "e[0]"
