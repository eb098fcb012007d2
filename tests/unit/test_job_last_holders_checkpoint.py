"""The last holders of the state sent away with no successor (a one-host Spot job, a zone-wide reclaim): with
``--checkpoint-dir`` their rank 0 is told to checkpoint the commit they leave at, in the time left before its
host's deadline, and no round resumes from a checkpoint before it has exited. Found by review: they left with
no checkpoint written (the next round lost up to --checkpoint-interval of training), and the driver logged
"0 steps lost"."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder, WorkerState
from cloud_elastic.driver.job.leaving import CHECKPOINT_MARGINS, HOLD_MARGINS
from cloud_elastic.driver.launch.api import ExitStatus
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.providers.api import Drain
from tests.unit.test_control_plane import plane
from tests.unit.test_job import T0, Sim, assert_round

pytestmark = pytest.mark.timeout(10)

DEADLINE = T0 + 60


def one_host_job(checkpointing: bool = True, notice_after: float = 0.0) -> Sim:
    """A job on host a, committed up to commit 7; ``notice_after`` seconds later, a notice for a."""
    sim = Sim(1, min_np=1, checkpointing=checkpointing)
    sim.discover({"a": 1})
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    sim.job.heartbeat(sim.id("a[0]"), sim.now, 7, 7)
    sim.advance(notice_after)
    sim.discover({}, {"a": Drain(DEADLINE, "spot interruption")})
    return sim


def leave_at_commit(sim: Sim, seq: int) -> ExitOrder:
    """The holder, draining, commits ``seq`` and comes to rendezvous: its exit order."""
    a = sim.id("a[0]")
    assert sim.job.workers[a].state is WorkerState.DRAINING
    sim.job.heartbeat(a, sim.now, seq, seq)
    sim.job.rendezvous(a, 1, "update", sim.now, seq, 0, seq)
    order = sim.reply("a[0]")
    assert isinstance(order, ExitOrder)
    return order


def drained(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "drained" in r.getMessage()]


def test_the_last_holder_is_told_to_checkpoint_with_the_time_left_before_its_deadline_less_a_margin() -> None:
    sim = one_host_job()
    margin = sim.job.policy.deadline_margin_s
    hold = (HOLD_MARGINS + CHECKPOINT_MARGINS) * margin
    sim.advance(60 - hold - 1 - sim.now + T0)
    assert sim.job.workers[sim.id("a[0]")].state is WorkerState.RUNNING  # trains on until the hold ends
    sim.advance(2)
    order = leave_at_commit(sim, 9)
    assert order.checkpoint_s == pytest.approx(DEADLINE - sim.now - margin)
    assert order.checkpoint_s >= CHECKPOINT_MARGINS * margin  # it left at the hold's end: time to write


def test_a_late_notice_still_asks_for_the_checkpoint_with_no_negative_time() -> None:
    sim = one_host_job(notice_after=57)  # 3 s before the deadline: less than one margin
    sim.advance(1)
    assert leave_at_commit(sim, 9).checkpoint_s == 0.0


def test_no_round_forms_without_the_state_while_the_last_holder_still_trains_with_it_or_checkpoints_it() -> None:
    # The spare is ready only after the holder's hold ended: the round it forms loads the checkpoint, but not
    # while the holder still trains, nor while it writes the checkpoint of the commit it left at.
    sim = Sim(1, spares=1, min_np=1, checkpointing=True)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    sim.commit("a[0]")
    sim.discover({"b": 1}, {"a": Drain(T0 + 60, "spot interruption")})
    sim.advance(60 - (HOLD_MARGINS + CHECKPOINT_MARGINS) * sim.job.policy.deadline_margin_s - sim.now + T0 + 1)
    assert sim.job.workers[sim.id("a[0]")].state is WorkerState.DRAINING
    assert sim.join("b[0]") == {"b[0]": None}
    sim.advance(1)
    assert sim.reply("b[0]") is None and sim.job.round == 1 and sim.outcome is None
    order = sim.join("a[0]", reason="update")["a[0]"]
    assert isinstance(order, ExitOrder) and order.checkpoint_s is not None
    sim.advance(1)
    assert sim.reply("b[0]") is None and sim.job.round == 1  # it would load the checkpoint before that one
    sim.exit("a[0]", ExitStatus(0))
    assert_round({"b[0]": sim.reply("b[0]")}, 2, needs_sync=True)
    assert [f for kind, f in sim.events if kind == "round_formed"][-1]["from_checkpoint"] is True


def test_no_round_resumes_from_a_checkpoint_until_the_leaving_holder_wrote_it_and_exited(caplog) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = one_host_job()
    sim.advance(50)
    leave_at_commit(sim, 9)
    sim.discover({"b": 1}, {"a": Drain(DEADLINE, "spot interruption")})
    assert sim.join("b[0]") == {"b[0]": None}
    sim.advance(1)
    assert sim.reply("b[0]") is None and sim.job.round == 1  # it would load the older checkpoint
    sim.job.leavers.checkpoint_saved(90, 9)  # the leaver's "saved" report: step 90, commit 9
    sim.exit("a[0]", ExitStatus(0))
    sim.advance(0.5)
    reply = sim.reply("b[0]")
    assert isinstance(reply, Assignment) and reply.from_checkpoint and reply.round == 2
    assert drained(caplog) == [
        f"job t: host a drained (spot interruption, notice from the provider), {DEADLINE - 1051:.1f}s before its "
        "deadline: its workers left at a commit, holding the last copy of the training state: the checkpoint of "
        "step 90 holds that commit and the next round resumes from it; 0 steps lost"]


def test_without_a_checkpoint_of_that_commit_the_drain_logs_the_steps_since_the_latest_checkpoint(caplog) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = one_host_job()
    sim.job.leavers.checkpoint_saved(10, 1)  # the periodic checkpoint of commit 1 (step 10)
    sim.advance(50)
    leave_at_commit(sim, 38)
    sim.exit("a[0]", ExitStatus(0))  # its write did not finish in time: no report
    assert drained(caplog)[0].endswith(
        "holding the last copy of the training state: no checkpoint of that commit was written on the way out: "
        "the next round resumes from the latest; 37 committed step(s) since the checkpoint of step 10 are lost")


def test_without_checkpoints_the_last_holder_is_not_told_to_checkpoint_and_the_loss_is_said() -> None:
    sim = one_host_job(checkpointing=False)
    sim.advance(50)
    assert leave_at_commit(sim, 9).checkpoint_s is None
    sim.exit("a[0]", ExitStatus(0))
    assert sim.outcome is not None and "training state lost" in sim.outcome.reason


def test_the_exit_orders_time_to_checkpoint_travels_and_an_older_drivers_order_has_none() -> None:
    assert ExitOrder.from_wire(ExitOrder("host a is draining", 12.5).to_wire()) == ExitOrder("host a is draining", 12.5)
    assert ExitOrder.from_wire(ExitOrder("a", 12.5, True).to_wire()).writer is True
    assert ExitOrder.from_wire({"status": "exit", "reason": "a", "writer": "yes"}).writer is False
    assert ExitOrder.from_wire({"status": "exit", "reason": "host a is draining"}).checkpoint_s is None
    with pytest.raises(ControlPlaneError, match="checkpoint_s"):
        ExitOrder.from_wire({"status": "exit", "reason": "x", "checkpoint_s": -1})


def test_a_leaver_whose_state_another_member_keeps_is_not_told_to_checkpoint(caplog) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = Sim(2, min_np=1, checkpointing=True)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.commit("a[0]", "b[0]")
    sim.discover({"b": 1}, {"a": Drain(DEADLINE, "spot interruption")})
    order = sim.join("a[0]", reason="update")["a[0]"]
    assert isinstance(order, ExitOrder) and order.checkpoint_s is None
    assert_round(sim.join("b[0]", reason="update"), 2, needs_sync=False)  # b holds it: no wait for a checkpoint
    sim.exit("a[0]", ExitStatus(0))
    assert drained(caplog)[0].endswith("its workers left at a commit; 0 steps lost")


def test_a_saved_checkpoints_commit_reaches_the_job() -> None:
    p, job, _, _ = plane()
    worker = sorted(job.workers)[0]
    assert p.handle("checkpoint", {"worker": worker, "event": "saved", "step": 380, "path": "p",
                                   "commit_seq": 38}) == {"ok": True}
    assert job.saved == [(380, 38)]
