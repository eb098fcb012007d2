"""``--whole-hosts``: a host's slots start, join rounds and leave together (scripted timelines, as in test_job.py).

The rule a model sharded across a host's slots needs: without one of its workers, a host's replica is
incomplete, so its other workers leave too, and a round only ever holds whole hosts, side by side.
"""

from __future__ import annotations

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.capacity import whole_hosts
from cloud_elastic.driver.job.health import faster_without
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.elastic_job import EARLY_RETURN_WAIT_S, ExitOrder, WorkerState
from cloud_elastic.driver.job.plan import Candidate, plan_round
from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import CLEAN, CRASH, KILLED, PAST_FIRST_COOLDOWN_S, Sim, assert_round
from tests.unit.test_job_health import beat

pytestmark = pytest.mark.timeout(10)


def whole(np: int, ready: dict[str, int], **kwargs) -> Sim:
    """A job with 2-slot whole hosts whose first round formed on ``ready``."""
    sim = Sim(np, whole_host_slots=2, **kwargs)
    assert_round(sim.start(ready), 1, needs_sync=True)
    return sim


def test_launches_fill_whole_hosts_only() -> None:
    sim = Sim(4, whole_host_slots=2)
    sim.discover({"a": 2, "b": 1, "c": 3})  # b is short of a slot; c's third slot is not used
    assert sim.slots_launched() == ["a[0]", "a[1]", "c[0]", "c[1]"]
    # Hosts in the order their first free slot comes; a host's slots in slot order.
    assert whole_hosts([Slot("a", 1), Slot("b", 0), Slot("c", 1), Slot("b", 1), Slot("a", 0)], 2) == [
        Slot("a", 0), Slot("a", 1), Slot("b", 0), Slot("b", 1)]


def test_room_for_part_of_a_host_launches_nothing_there() -> None:
    sim = whole(2, {"a": 2}, max_np=3)  # room for one more worker: not a whole host
    sim.discover({"a": 2, "b": 2})
    assert sim.slots_launched() == ["a[0]", "a[1]"]


def test_a_failure_takes_its_whole_host_out_and_the_others_go_on() -> None:
    sim = whole(4, {"a": 2, "b": 2}, min_np=2)
    sim.exit("b[0]", KILLED)
    sibling = sim.job.workers[sim.id("b[1]")]
    assert sibling.state is WorkerState.DRAINING and "a host leaves whole" in sibling.why
    assert sim.blocked("b[0]") and sim.blocked("b[1]")  # the host is the unit of blacklisting too
    failed = [f for kind, f in sim.events if kind == "worker_failed"]
    assert [(f["worker"], f["whole_host"]) for f in failed] == [(sim.id("b[0]"), True)]
    assert_round(sim.join("a[0]", "a[1]", reason="failure"), 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]"]
    order = sim.join("b[1]", reason="failure")["b[1]"]
    assert isinstance(order, ExitOrder) and "a host leaves whole" in order.reason
    sim.exit("b[1]", CLEAN)
    assert sim.outcome is None
    # After the cooldown the host comes back whole: both slots at once.
    sim.advance(PAST_FIRST_COOLDOWN_S * 2)
    assert sim.slots_launched()[-2:] == ["b[0]", "b[1]"]


def test_a_job_whose_every_host_failed_ends_at_once_like_one_whose_every_worker_failed() -> None:
    """The host-mates a failure takes along are not survivors: the job ends as when every worker failed,
    instead of waiting --elastic-timeout while it relaunches the host at each cooldown."""
    sim = Sim(2, whole_host_slots=2)
    sim.discover({"a": 2})
    assert sim.slots_launched() == ["a[0]", "a[1]"]
    sim.exit("a[0]", CRASH)
    assert sim.outcome is not None and not sim.outcome.success
    assert sim.outcome.reason.startswith("all workers failed; last: worker " + sim.id("a[0]")), sim.outcome.reason


def test_a_failed_host_with_another_host_alive_does_not_end_the_job() -> None:
    sim = whole(4, {"a": 2, "b": 2}, min_np=2)
    sim.exit("b[0]", KILLED)
    assert sim.outcome is None  # a's workers survive: the job goes on with them


def test_a_newcomer_host_joins_only_once_all_its_workers_wait() -> None:
    sim = whole(2, {"a": 2}, max_np=4)
    sim.discover({"a": 2, "b": 2})
    sim.join("b[0]")
    assert sim.poll("a[0]").update_gen == 0  # half a host: the running round is not stopped for it
    sim.join("b[1]")
    assert sim.poll("a[0]").update_gen == 1
    assert_round(sim.join("a[0]", "a[1]", reason="update"), 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]", "b[0]", "b[1]"]


def test_a_spot_notice_drains_the_whole_host_at_a_commit() -> None:
    sim = whole(4, {"a": 2, "b": 2}, min_np=2)
    sim.discover({"a": 2}, {"b": Drain(reason="spot interruption")})
    states = {sim.job.workers[sim.id(s)].state for s in ("b[0]", "b[1]")}
    assert states == {WorkerState.DRAINING}
    assert_round(sim.join("a[0]", "a[1]", reason="update"), 2, needs_sync=False)
    assert sim.layout() == ["a[0]", "a[1]"]


def candidate(worker: str, host: str, slot: int, prev_rank: int | None, commit_seq: int = 0) -> Candidate:
    return Candidate(worker, host, slot, prev_rank, holds_state=prev_rank is not None, newcomer_key=(host, slot),
                     commit_seq=commit_seq)


def test_a_round_holds_whole_hosts_side_by_side_the_newest_commit_s_host_first() -> None:
    waiting = [
        candidate("a0", "a", 0, 0, commit_seq=4), candidate("b1", "b", 1, 1, commit_seq=5),
        candidate("a1", "a", 1, 2, commit_seq=4), candidate("b0", "b", 0, 3, commit_seq=5),
        candidate("c0", "c", 0, None),  # c[1] is still on its way: c waits for the next round
    ]
    plan = plan_round(waiting, max_np=8, state_committed=True, failure_since_last_round=True, checkpointing=False,
                      host_slots=2)
    assert [c.worker_id for c in plan.members] == ["b0", "b1", "a0", "a1"]
    cut = plan_round(waiting, max_np=3, state_committed=True, failure_since_last_round=True, checkpointing=False,
                     host_slots=2)
    assert [c.worker_id for c in cut.members] == ["b0", "b1"]  # max_np cuts at a host's end
    # A collective completed on b's slot 1 only: it holds the newest commit and is rank 0, whose state the
    # round syncs from; its host-mate follows, then the other hosts.
    waiting[1] = candidate("b1", "b", 1, 1, commit_seq=6)
    plan = plan_round(waiting, max_np=8, state_committed=True, failure_since_last_round=True, checkpointing=False,
                      host_slots=2)
    assert [c.worker_id for c in plan.members] == ["b1", "b0", "a0", "a1"] and plan.needs_sync
    assert plan_round(waiting[4:], max_np=8, state_committed=False, failure_since_last_round=False,
                      checkpointing=False, host_slots=2) is None


@pytest.mark.parametrize(("np", "min_np", "max_np", "wrong"), [
    (6, 4, 8, "-np 6"), (4, 3, 8, "--min-np 3"), (4, 4, 10, "--max-np 10"),
])
def test_counts_that_are_not_whole_hosts_are_a_one_line_error(np, min_np, max_np, wrong) -> None:
    with pytest.raises(ConfigError) as error:
        JobConfig(command=("python", "t.py"), num_proc=np, min_np=min_np, max_np=max_np, whole_host_slots=4)
    message = str(error.value)
    assert "\n" not in message and wrong in message and "--slots-per-host 4" in message


def test_a_straggler_s_whole_host_drains_with_it_when_the_job_is_faster_without_that_host() -> None:
    # Leaving alone, a worker at 0.18 s/step beside two at 0.1 s costs the job more than it gives; with its
    # host-mate going too it does not (4 at 0.18 s beat 2 at 0.1 s).
    assert faster_without(0.18, [0.1, 0.1]) and not faster_without(0.18, [0.1, 0.1], leaving=2)
    sim = whole(6, {"a": 2, "b": 2, "c": 2}, min_np=2, straggler_factor=1.5, straggler_window_s=5)
    beat(sim, 20, {"a[0]": 0.1, "a[1]": 0.1, "b[0]": 0.1, "b[1]": 0.1, "c[0]": 0.1, "c[1]": 0.5})
    states = [sim.job.workers[sim.id(s)].state for s in ("c[0]", "c[1]", "a[0]", "b[1]")]
    assert states == [WorkerState.DRAINING, WorkerState.DRAINING, WorkerState.RUNNING, WorkerState.RUNNING]


def test_a_straggler_is_kept_when_its_host_leaving_would_go_below_min_np(caplog) -> None:
    sim = whole(4, {"a": 2, "b": 2}, min_np=3, straggler_factor=1.5, straggler_window_s=5)
    beat(sim, 20, {"a[0]": 0.1, "a[1]": 0.1, "b[0]": 0.1, "b[1]": 0.5})
    assert sim.job.workers[sim.id("b[1]")].state is WorkerState.RUNNING
    assert "draining it would leave 2 worker(s), below --min-np 3" in caplog.text


def test_a_member_returning_early_takes_its_host_mates_along() -> None:
    sim = whole(4, {"a": 2, "b": 2}, min_np=2)
    sim.commit("a[0]", "a[1]", "b[0]", "b[1]", count=12)
    assert sim.job.completed(sim.id("b[1]"), sim.now, commit_seq=12, steps=12) == ("wait", "")
    sim.advance(1)
    sim.job.heartbeat(sim.id("a[0]"), sim.now, waiting_s=EARLY_RETURN_WAIT_S + 0.5)  # rank 0 trains on
    sim.advance(0.5)
    assert sim.job.workers[sim.id("b[1]")].state is WorkerState.EXITING
    mate = sim.job.workers[sim.id("b[0]")]
    assert mate.state is WorkerState.DRAINING and "a host leaves whole" in mate.why
    assert_round(sim.join("a[0]", "a[1]", reason="failure"), 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]"]


def test_draining_one_slot_by_hand_sends_its_whole_host_away_and_says_so() -> None:
    sim = whole(4, {"a": 2, "b": 2}, min_np=2)
    done, message = sim.job.drain("b", 1, sim.now)
    assert done and "with its host's other workers (--whole-hosts)" in message, message
    states = {sim.job.workers[sim.id(s)].state for s in ("b[0]", "b[1]")}
    assert states == {WorkerState.DRAINING}


def test_hosts_of_one_slot_plan_like_single_workers() -> None:
    waiting = [candidate("a0", "a", 0, 1, commit_seq=3), candidate("b0", "b", 0, 0, commit_seq=4),
               candidate("c0", "c", 0, None)]
    plan = plan_round(waiting, max_np=8, state_committed=True, failure_since_last_round=True, checkpointing=False,
                      host_slots=1)
    assert [c.worker_id for c in plan.members] == ["b0", "a0", "c0"]
