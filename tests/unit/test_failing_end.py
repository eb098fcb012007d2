"""A job that fails while a live worker holds a commit newer than the last checkpoint checkpoints that commit first,
through the graceful stop's path, and its end line says what the same command resumes from. Found by review
(f6_minnp_end.sh): below --min-np, rank 0 still held step 11, the job ended at once, and the only checkpoint was of
step 1: the rerun repeated 10 steps without a word."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import ExitOrder, WorkerState
from cloud_elastic.driver.job.stopping import STOP_GRACE_S
from cloud_elastic.driver.launch.api import ExitStatus
from tests.unit.test_job import CLEAN, Sim, assert_round
from tests.unit.test_job_resume import resumed_sim

pytestmark = pytest.mark.timeout(10)


def back_with(sim: Sim, slot: str, seq: int, round_: int = 1) -> None:
    """``slot`` comes back to rendezvous after a failure, holding commit ``seq``."""
    sim.job.rendezvous(sim.id(slot), round_, "failure", sim.now, seq, 0, seq)
    sim._collect()


def below_min_np(np: int = 2, checkpointing: bool = True) -> Sim:
    """Round 1 of ``np`` workers on a; the checkpoint of step 1 (commit 1) is stored; the last one crashes, and its
    slot stays blacklisted: the others are back at rendezvous, below --min-np."""
    sim = Sim(np, cooldown=(300, 300), elastic_timeout_s=5, checkpointing=checkpointing)
    assert_round(sim.start({"a": np}), 1, needs_sync=True)
    sim.job.checkpoint_saved(1, 1)
    sim.exit(f"a[{np - 1}]", ExitStatus(-6))
    return sim


#: The reason of the failure ending the job in :func:`failing_while_training` (any ``ElasticJob.end`` that is not a
#: success takes the failing end: see cloud_elastic.driver.job.ending).
FAILED = "round 1 stalled 3 times in a row"


def failing_while_training(hosts: dict[str, int] | None = None, **policy: float) -> Sim:
    """Round 1 of the workers on ``hosts`` (default a[0], a[1]) trains, each at commit 9 as its heartbeats tell (the
    checkpoint holds commit 1); discovery fails past --elastic-timeout, which ends nothing (the job trains on with
    its hosts); then a failure ends the job: the failing stop begins and aborts the round."""
    hosts = hosts or {"a": 2}
    sim = Sim(sum(hosts.values()), elastic_timeout_s=5, checkpointing=True, **policy)
    assert_round(sim.start(hosts), 1, needs_sync=True)
    for slot in (f"{h}[{i}]" for h, n in hosts.items() for i in range(n)):
        sim.job.heartbeat(sim.id(slot), sim.now, 9, 9)
    sim.job.checkpoint_saved(10, 1)
    sim.discovery_failed("throttled")
    sim.advance(6)
    sim.discovery_failed("throttled")
    assert sim.outcome is None and sim.job.abort_round == 0 and sim.stops == []
    sim.job.end(False, FAILED, 1)
    assert sim.outcome is None and sim.job.abort_round == 1
    return sim


def test_below_min_np_the_survivor_checkpoints_its_last_commit_before_the_job_fails() -> None:
    sim = below_min_np()
    back_with(sim, "a[0]", 11)
    sim.advance(6)  # past --elastic-timeout
    assert sim.outcome is None  # not yet: a[0] holds commit 11, the checkpoint only commit 1
    order = sim.reply("a[0]")
    assert isinstance(order, ExitOrder) and order.writer, order
    assert 0 < order.checkpoint_s <= STOP_GRACE_S
    assert "fewer than --min-np 2" in order.reason
    sim.job.checkpoint_saved(11, 11)  # its report of the checkpoint it wrote on its way out
    sim.exit("a[0]", CLEAN)
    outcome = sim.outcome
    assert outcome is not None and (outcome.success, outcome.exit_code) == (False, 1)
    assert outcome.reason.startswith("fewer than --min-np 2 worker(s) for 5s (elastic timeout); last failure: ")
    assert outcome.reason.endswith("checkpoint of step 11 written; the same command resumes from it")


def test_a_checkpoint_not_written_in_time_ends_the_job_at_the_bound_saying_the_steps_to_redo() -> None:
    sim = below_min_np()
    back_with(sim, "a[0]", 11)
    sim.advance(6)
    assert isinstance(sim.reply("a[0]"), ExitOrder)
    sim.advance(STOP_GRACE_S + 1)  # storage too slow: no report, no exit
    outcome = sim.outcome
    assert outcome is not None and outcome.exit_code == 1 and "fewer than --min-np 2" in outcome.reason
    assert outcome.reason.endswith("1 worker(s) had not exited in time; the last checkpoint is of step 1, the last "
                                   "commit 11: the same command resumes from that checkpoint, and 10 committed step(s) "
                                   "will be redone")


def test_the_reset_limit_checkpoints_the_survivors_commit_before_the_job_fails() -> None:
    sim = Sim(3, min_np=1, reset_limit=1, checkpointing=True)
    assert_round(sim.start({"a": 3}), 1, needs_sync=True)
    sim.exit("a[0]")
    back_with(sim, "a[1]", 4)
    back_with(sim, "a[2]", 4)
    assert sim.job.round == 2
    sim.exit("a[1]")
    back_with(sim, "a[2]", 9, round_=2)
    assert sim.outcome is None
    order = sim.reply("a[2]")
    assert isinstance(order, ExitOrder) and order.checkpoint_s and order.writer
    sim.job.checkpoint_saved(90, 9)
    sim.exit("a[2]", CLEAN)
    assert sim.outcome is not None and sim.outcome.exit_code == 1
    assert sim.outcome.reason == ("reset limit exceeded: reset 2 would exceed --reset-limit 1; checkpoint of step 90 written; "
                                  "the same command resumes from it")


def test_a_survivor_holding_an_older_commit_never_writes_the_checkpoint() -> None:
    sim = below_min_np(3)
    back_with(sim, "a[1]", 10)  # it could restore only an older commit (synced to an older rank 0)
    back_with(sim, "a[0]", 11)
    sim.advance(6)
    older, newest = sim.reply("a[1]"), sim.reply("a[0]")
    assert isinstance(older, ExitOrder) and not older.checkpoint_s and not older.writer
    assert isinstance(newest, ExitOrder) and newest.checkpoint_s and newest.writer


def test_a_job_whose_checkpoint_holds_the_last_commit_fails_at_once_saying_it_resumes_from_it() -> None:
    sim = below_min_np()
    back_with(sim, "a[0]", 11)
    sim.job.checkpoint_saved(110, 11)
    sim.advance(6)
    outcome = sim.outcome
    assert outcome is not None and outcome.exit_code == 1
    assert outcome.reason.endswith("; the checkpoint of step 110 holds the last commit: the same command resumes "
                                   "from it")
    assert sim.job.workers[sim.id("a[0]")].state is WorkerState.EXITING


def test_without_a_checkpoint_dir_the_job_fails_at_once_as_before() -> None:
    sim = below_min_np(checkpointing=False)
    back_with(sim, "a[0]", 11)
    sim.advance(6)
    assert sim.outcome is not None and sim.outcome.reason == (
        "fewer than --min-np 2 worker(s) for 5s (elastic timeout); last failure: worker "
        f"{sim.id('a[1]')} (rank 1) killed by signal 6")


def test_a_failure_while_a_round_trains_aborts_it_and_a_member_checkpoints_the_commit_it_rolls_back_to() -> None:
    """A failure ending a job whose round still trains (or a round stalled in a collective that will never
    complete: it would never reach a next commit; discovery failing past --elastic-timeout did so until review s64
    rvK). The round is aborted: its members roll back to their last commit and leave with it from rendezvous, the
    first to leave writing it."""
    sim = failing_while_training()
    assert sim.outcome is None and sim.job.abort_round == 1
    back_with(sim, "a[1]", 9)  # freed from its collective by the abort, holding commit 9
    assert sim.reply("a[1]") is None  # it waits for a[0]: who holds the newest commit is known once both are back
    back_with(sim, "a[0]", 9)
    orders = [sim.reply("a[1]"), sim.reply("a[0]")]
    assert all(isinstance(o, ExitOrder) and o.checkpoint_s for o in orders), orders
    assert [o.writer for o in orders].count(True) == 1, orders
    sim.job.checkpoint_saved(90, 9)
    sim.exit("a[1]", CLEAN)
    sim.exit("a[0]", CLEAN)
    assert sim.outcome is not None and sim.outcome.exit_code == 1
    assert sim.outcome.reason == f"{FAILED}; checkpoint of step 90 written; the same command resumes from it"


def test_discovery_retried_every_second_during_the_failing_stop_leaves_the_writer_its_time() -> None:
    """Review rv5 (g2_discovery_bigstate.sh, a 600 MB state): the discovery loop's next retry, a second into the
    stop, ended the job again, at once: the writer had 1 s, not 20, and only an older checkpoint was left. Discovery
    failing on during a failing stop still ends nothing."""
    sim = failing_while_training()
    back_with(sim, "a[1]", 9)
    back_with(sim, "a[0]", 9)
    writer, other = ("a[0]", "a[1]") if sim.reply("a[0]").writer else ("a[1]", "a[0]")
    assert sim.reply(writer).checkpoint_s
    sim.exit(other, CLEAN)
    for _ in range(int(STOP_GRACE_S) - 5):  # the writer takes 15 s; discovery is retried every second meanwhile
        sim.advance(1)
        sim.discovery_failed("throttled")
        assert sim.outcome is None, sim.outcome
    sim.job.checkpoint_saved(90, 9)
    sim.exit(writer, CLEAN)
    assert sim.outcome is not None and sim.outcome.exit_code == 1
    assert sim.outcome.reason == f"{FAILED}; checkpoint of step 90 written; the same command resumes from it"


def test_a_resumed_job_failing_before_its_first_commit_writes_nothing_and_resumes_from_what_it_loaded() -> None:
    """Review rv5 (g4_rerun_duplicate.sh): the rerun of a failed job loaded the checkpoint of step 11, failed the
    same way before any new commit, and wrote step 11 again (pruning the older checkpoint): the checkpoint it had
    loaded was not known as stored."""
    sim = resumed_sim(2, elastic_timeout_s=5)
    sim.start({"a": 1, "b": 1})
    sim.job.checkpoint_loaded(11, 11, "/ck/ckpt-step11")  # rank 0 of the first round loaded it
    for slot in ("a[0]", "b[0]"):
        sim.job.heartbeat(sim.id(slot), sim.now, 0, 11)
    sim.exit("b[0]", ExitStatus(-6))
    back_with(sim, "a[0]", 11)
    sim.advance(6)  # below --min-np past --elastic-timeout (b's slot is blacklisted)
    outcome = sim.outcome
    assert outcome is not None and outcome.exit_code == 1
    assert outcome.reason.endswith("; the checkpoint of step 11 holds the last commit: the same command resumes "
                                   "from it"), outcome.reason
    order = sim.reply("a[0]")
    assert isinstance(order, ExitOrder) and not order.checkpoint_s and not order.writer


def split_round() -> Sim:
    """Round 1 of a[0] and b[0], aborted by a failing stop (see failing_while_training)."""
    return failing_while_training({"a": 1, "b": 1})


def test_members_back_one_commit_apart_only_the_newer_commit_is_written() -> None:
    """Review rv5: the abort overtook a[0]'s commit 10 but not b[0]'s; b[0], back first with commit 9, wrote it
    (its checkpoint, named later than any of 10, would be what a rerun loads), and the end line said it held the
    job. The holders now leave once both are back, the newest commit's first."""
    sim = split_round()
    back_with(sim, "b[0]", 9)
    assert sim.reply("b[0]") is None  # a[0] is not back: nobody writes yet
    back_with(sim, "a[0]", 10)
    older, newer = sim.reply("b[0]"), sim.reply("a[0]")
    assert isinstance(older, ExitOrder) and not older.writer and not older.checkpoint_s, older
    assert isinstance(newer, ExitOrder) and newer.writer and newer.checkpoint_s, newer
    sim.exit("b[0]", CLEAN)
    sim.exit("a[0]", CLEAN)  # its checkpoint's report was lost
    assert sim.outcome is not None and sim.outcome.reason.endswith(
        "the last checkpoint is of step 10, the last commit 10: the same command resumes from that checkpoint, and 9 "
        "committed step(s) will be redone"), sim.outcome.reason


def test_a_member_that_never_comes_back_holds_the_others_for_half_the_stop_at_most() -> None:
    sim = split_round()
    back_with(sim, "b[0]", 9)
    sim.advance(STOP_GRACE_S / 2 - 1)
    assert sim.reply("b[0]") is None
    sim.advance(1.5)  # a[0] is still in its round (a collective the abort did not free): b[0] writes commit 9
    order = sim.reply("b[0]")
    assert isinstance(order, ExitOrder) and order.writer and order.checkpoint_s, order


def test_under_whole_hosts_every_host_mate_of_the_writer_checkpoints_its_shard_and_none_is_stopped() -> None:
    """Review rv8 (s_sharded_disc.sh, a sharded state, --whole-hosts, 2 hosts x 2 slots): the first holder let go
    took its host-mate along to its exit order, and the release loop, reaching that mate, stopped it (it was no
    longer at rendezvous as it saw it): the writer's save needed that mate's shard, no checkpoint was written, and
    a rerun went back to step 1."""
    sim = failing_while_training({"a": 2, "b": 2}, whole_host_slots=2)
    slots = ("a[0]", "a[1]", "b[0]", "b[1]")
    for slot in slots:
        back_with(sim, slot, 9)
    orders = {slot: sim.reply(slot) for slot in slots}
    assert all(isinstance(o, ExitOrder) for o in orders.values()), orders
    assert sim.stops == []  # every holder leaves from rendezvous on its exit order: none is killed
    writers = [s for s, o in orders.items() if o.checkpoint_s]
    assert writers in (["a[0]", "a[1]"], ["b[0]", "b[1]"]), orders  # one whole host writes: each its shards
    assert [o.writer for o in orders.values()].count(True) == 1, orders


def test_under_whole_hosts_a_host_mate_sent_away_first_does_not_drain_the_holder_untold() -> None:
    """Review rv8: the failing stop sends non-holders away at once and keeps the holders back; a[1], back without
    its commit (it could not restore it), was sent away and took its host-mate a[0] along (--whole-hosts): a[0],
    the only holder of commit 9, drained and left without being told to checkpoint it (the checkpoint holds 1)."""
    sim = Sim(2, elastic_timeout_s=5, checkpointing=True, whole_host_slots=2)
    assert_round(sim.start({"a": 2}), 1, needs_sync=True)
    for slot in ("a[0]", "a[1]"):
        sim.job.heartbeat(sim.id(slot), sim.now, 9, 9)
    sim.job.checkpoint_saved(1, 1)
    sim.advance(5)
    sim.job.rendezvous(sim.id("a[1]"), 1, "failure", sim.now, 9, 0, 9, holds_commit=False)
    sim.advance(1)
    sim.job.end(False, FAILED, 1)  # the failing stop begins while a[0] is still in its (aborted) round
    back_with(sim, "a[0]", 9)
    holder, mate = sim.reply("a[0]"), sim.reply("a[1]")
    assert isinstance(holder, ExitOrder) and holder.writer and holder.checkpoint_s, holder
    assert isinstance(mate, ExitOrder) and not mate.checkpoint_s, mate
    sim.job.checkpoint_saved(90, 9)
    sim.exit("a[1]", CLEAN)
    sim.exit("a[0]", CLEAN)
    assert sim.outcome is not None and sim.outcome.reason.endswith(
        "checkpoint of step 90 written; the same command resumes from it"), sim.outcome.reason
