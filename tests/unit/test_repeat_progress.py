"""The repeat guards measure progress by what was trained, not by how many commits were made.

Horovod's elastic loop (``for state.batch in range(state.batch, ...): ...; state.commit()``) redoes the committed
batch after each restore and commits it again before a deterministic bug recurs: each relaunch adds a commit, so
guards keyed on the job's commit let it retrain the same batch for ever (review s60 rvS finding 1; rvV finding 2
with --checkpoint-dir). Each worker now reports the fingerprint of its committed state's plain attributes
(``worker.commit.fingerprint``); a worker's fingerprint that changed is progress, a redo changes nothing
(``repeats.Trained``). A job that gains one commit per relaunch, failing in other ways each time, progresses and is
never stopped (the first fix, af4dfd1, stopped those: rvV finding 1); nor is one whose attributes repeat while it
trains (``batch`` starting again each epoch, the epoch in a scheduler), or whose processes each commit once between
restores (review s62 rvR findings 1 and 2: the job's count of states never seen before froze).
"""

from __future__ import annotations

import re

import pytest
import torch

from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.repeats import REMEMBERED, REPEATS, UNTOLD, Trained
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol import FlightEntry, PollRequest, RendezvousRequest
from cloud_elastic.protocol_reports import CheckpointReport
from cloud_elastic.worker.commit.fingerprint import MAX_TEXT, fingerprint
from cloud_elastic.worker.ledger import CommitLedger
from cloud_elastic.worker.link.progress import Progress
from tests.unit.job_view import FakeJob
from tests.unit.test_job import Sim, failed, started
from tests.unit.test_job_repeats import BUG, crash, fixed, hangs, stalls

pytestmark = pytest.mark.timeout(30)

ALLREDUCE = FlightEntry(1, 9, "allreduce", "entered", 0.0)  # both ranks wait in it: it cannot complete


def fp(batch: int) -> str:
    """The fingerprint of the state committed after ``batch`` (16 hex digits, as a worker reports one)."""
    return f"{batch + 1:016x}"


def marked(batch: int) -> str:
    """``fp(batch)`` as a worker that saw its attributes move with training reports it."""
    return "+" + fp(batch)


def commits(sim: Sim, slot: str, seq: int, batch: int | None, *, trained: str | None = None) -> None:
    """The worker on ``slot`` heartbeats: its last commit is ``seq`` of the job, holding the state after ``batch``
    (None: its heartbeat says no fingerprint: the commit is heard, its state is not)."""
    sim.commits[sim.id(slot)] = seq
    said = trained if trained is not None else "" if batch is None else marked(batch)
    sim.job.heartbeat(sim.id(slot), sim.now, seq, commit_seq=seq, trained=said)


def rejoins(sim: Sim, slot: str, seq: int, batch: int, *, trained: str | None = None) -> None:
    """The survivor on ``slot`` comes back from a failed round holding commit ``seq``, the state after ``batch``."""
    w = sim.job.workers[sim.id(slot)]
    sim.job.rendezvous(w.worker_id, w.round, "failure", sim.now, sim.commits.get(w.worker_id), commit_seq=seq,
                       trained=trained if trained is not None else marked(batch))
    sim._collect()


# ------------------------------------------------------------------ the rule
def test_a_workers_fingerprint_that_changed_is_progress_and_a_redo_is_not() -> None:
    trained = Trained()
    assert trained.at(4) == 4 and not trained.tells  # no fingerprint yet: the commit is the key
    for batch in (0, 1):
        trained.note(fp(batch), "a")
    assert trained.at(2) == 2 and not trained.tells  # no worker marked one: the commit is still the key
    trained.note(marked(2), "a")
    key = trained.at(3)
    assert key == ("trained", 2)
    trained.note(marked(2), "a")  # Horovod's redo of the restored batch, at commit 4, 5, ...
    trained.note(fp(2), "b")  # a relaunched rank's first report: synced to that state, no change
    trained.note("", "a")  # a worker that has not committed (or a state without plain attributes) says nothing
    assert trained.at(4) == trained.at(5) == key
    trained.note(fp(3), "b")  # unmarked (its process saw no move yet), but the job's fingerprints tell
    assert trained.at(5) != key and trained.mark == 3
    trained.note(fp(4), stored=True)  # every worker lost; the next attempt loads the state after batch 4
    key = trained.at(6)
    trained.note(fp(4), "c")  # a new process's first report: what it loaded, no change
    assert trained.at(6) == key
    trained.note(fp(8), "d")  # another new process, heard of only after its first commit: it moved on
    assert trained.at(7) != key


def test_states_seen_before_are_progress_when_the_fingerprint_moved_to_them() -> None:
    """``batch`` starting again each epoch, the epoch in a scheduler: the same fingerprints come back every epoch
    (review s62 rvR finding 1: counting states never seen before froze, and a slot failing once an epoch was
    blacklisted for good)."""
    trained = Trained()
    keys = []
    for epoch in range(3):
        for batch in (0, 4, 8):
            trained.note(marked(batch), "a")
        keys.append(trained.at(0))
    assert len(set(keys)) == 3


def test_a_worker_saying_its_states_do_not_tell_its_commits_apart_brings_back_the_commit_count_for_good() -> None:
    trained = Trained()
    trained.note(marked(0), "a")
    trained.note(UNTOLD, "b")
    trained.note(marked(1), "a")
    assert trained.at(7) == 7 and trained.at(8) == 8 and not trained.tells
    assert trained.loaded() is None


def test_checkpoint_loads_count_apart_from_commits() -> None:
    """Every-worker-lost measures what the attempts load: what an attempt trained and lost with its workers is no
    progress; a load of a state other than the load before is (compared with the one before only: a fingerprint that
    comes back each epoch is not a repeat)."""
    trained = Trained()
    trained.note(marked(0), "a")
    assert trained.loaded() is None  # no load yet: every-worker-lost keeps the commit-count rule
    trained.note(fp(0), stored=True)
    first = trained.loaded()
    trained.note(fp(0), "a2")  # the attempt's first report: what it loaded
    trained.note(fp(5), "a2")  # committed and lost with every worker: not in a checkpoint
    trained.note(fp(0), stored=True)
    assert trained.loaded() == first
    trained.note(fp(4), stored=True)
    assert trained.loaded() != first
    second = trained.loaded()
    trained.note(fp(0), stored=True)  # the state after batch 0, one epoch later
    assert trained.loaded() not in (first, second)


def test_a_checkpoint_load_of_a_state_no_report_told_of_is_progress() -> None:
    """Review s62 rvR2 finding 2: each attempt gains one commit, checkpoints it, and every worker crashes within a
    heartbeat of it; only the next attempt's load tells that it moved on (the slot was blacklisted at the third)."""
    trained = Trained()
    trained.note(marked(0), "a")
    for n in range(1, 4):
        key = trained.at(n)
        trained.note(fp(n), stored=True)
        assert trained.at(n) != key, n
        trained.note(fp(n), f"a{n}")  # the attempt's first report: what it loaded, no change
    key = trained.at(9)
    trained.note(fp(3), stored=True)  # the same checkpoint again: no change
    assert trained.at(9) == key


def test_the_job_remembers_a_bounded_number_of_reporters() -> None:
    trained = Trained()
    trained.note(marked(0), "w0")
    for n in range(1, REMEMBERED + 1):
        trained.note(fp(0), f"w{n}")
    assert len(trained._last) == REMEMBERED and trained.mark == 0
    trained.note(fp(1), "w0")  # the oldest reporter was forgotten: its report is a first one, against the newest
    assert trained.mark == 1 and len(trained._last) == REMEMBERED


# ------------------------------------------------------------------ a slot's failures
def horovod_round_one(sim: Sim) -> None:
    """Round 1 on a[0] and b[0] trains batches 0, 1 and 2 (commits 1-3), then the script on b[0] raises at batch 3."""
    for batch in range(3):
        commits(sim, "a[0]", batch + 1, batch)
        commits(sim, "b[0]", batch + 1, batch)
    crash(sim, "b[0]")


def test_a_rank_raising_at_the_same_batch_of_horovods_loop_is_blacklisted_at_its_third_failure() -> None:
    """rvS's repeat_failure.sh: each relaunch redoes the restored batch 2 (one commit), and rank 1 raises again at
    batch 3; keyed on the commit (3, 4, 5, ...), it went on for ever."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=5)
    horovod_round_one(sim)
    for seq in range(4, 10):
        rejoins(sim, "a[0]", seq - 1, 2)  # rolled back to its last commit: the state after batch 2
        sim.advance(3)
        if sim.job.hosts.blacklist.for_good(Slot("b", 0)):
            break
        sim.join("b[0]")
        assert sim.layout() == ["a[0]", "b[0]"]
        commits(sim, "a[0]", seq, 2)  # the redo of batch 2
        commits(sim, "b[0]", seq, 2)
        crash(sim, "b[0]")
    sim.advance(10)
    assert sim.slots_launched().count("b[0]") == REPEATS  # never a fourth time
    failed(sim, "fewer than --min-np 2", f"exited with code 1: {BUG}",
           f"slot b[0] is blacklisted for the rest of the job: it failed {REPEATS} times in a row at commit 5, with no "
           f"commit that moved the state on in between")


@pytest.mark.parametrize("heard", ["heartbeat", "rendezvous"])
def test_a_rank_failing_each_relaunch_one_commit_further_is_never_blacklisted(heard) -> None:
    """rvV's rare_commit.sh: rank 1 fails after each relaunch's one commit (4 batches), in another way each time.
    ``rendezvous``: it fails before a heartbeat carries that commit's state; only the survivor's rendezvous does."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=60)
    for n in range(1, 3 * REPEATS + 1):
        batch = 4 * n - 1
        commits(sim, "a[0]", n, batch if heard == "heartbeat" else None)
        commits(sim, "b[0]", n, batch if heard == "heartbeat" else None)
        crash(sim, "b[0]", f"OSError: transient read error {n}")
        rejoins(sim, "a[0]", n, batch)
        sim.advance(3)
        sim.join("b[0]")
        assert sim.layout() == ["a[0]", "b[0]"] and sim.outcome is None
    assert sim.job.hosts.blacklist.for_good_slots() == []


def test_a_rank_failing_once_an_epoch_at_the_same_batch_is_never_blacklisted() -> None:
    """Review s62 rvR finding 1: ``batch`` within the epoch, the epoch in a scheduler; rank 1 fails at batch 6 of
    each epoch, in another way each time (commits every 4 batches: 0, 4, 8)."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=60)
    seq = 0
    for epoch in range(3 * REPEATS):
        for batch in (8, 0, 4) if epoch else (0, 4):
            seq += 1
            commits(sim, "a[0]", seq, batch)
            commits(sim, "b[0]", seq, batch, trained=fp(batch))  # a relaunched rank: it saw nothing move yet
        crash(sim, "b[0]", f"OSError: transient read error {epoch}")
        rejoins(sim, "a[0]", seq, 4)
        sim.advance(3)
        sim.join("b[0]")
        assert sim.layout() == ["a[0]", "b[0]"] and sim.outcome is None, epoch
    assert sim.job.hosts.blacklist.for_good_slots() == []


def test_ranks_failing_in_turn_one_commit_apart_are_never_blacklisted() -> None:
    """Review s62 rvR finding 2: every process commits once between restores, so none sees two commits in a row;
    each one's commit moves past the state it restored, which says the job trains on."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=60)
    commits(sim, "a[0]", 1, 0)
    commits(sim, "b[0]", 1, 0)
    for n in range(1, 3 * REPEATS + 1):
        failing, staying = ("b[0]", "a[0]") if n % 2 else ("a[0]", "b[0]")
        commits(sim, staying, n + 1, n, trained=fp(n))
        commits(sim, failing, n + 1, n, trained=fp(n))
        crash(sim, failing, f"OSError: flaky {n}")
        rejoins(sim, staying, n + 1, n, trained=fp(n))
        sim.advance(3)
        sim.join(failing)
        assert sim.outcome is None, n
    assert sim.job.hosts.blacklist.for_good_slots() == []


def test_a_state_whose_attributes_do_not_tell_its_commits_apart_counts_commits() -> None:
    """``TorchState(model, opt, epoch=0)`` committed every 4 batches: its fingerprint stands still within an epoch,
    and its workers say so (``UNTOLD``) once two commits in a row held the same attributes; each relaunch gains one
    commit, and the job trains on as before the fingerprints."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=60)
    commits(sim, "a[0]", 1, None, trained=marked(0))
    commits(sim, "a[0]", 2, None, trained=UNTOLD)
    for n in range(3, 3 * REPEATS + 3):
        commits(sim, "a[0]", n, None, trained=UNTOLD)
        crash(sim, "b[0]")
        rejoins(sim, "a[0]", n, 0, trained=UNTOLD)
        sim.advance(3)
        sim.join("b[0]")
        assert sim.layout() == ["a[0]", "b[0]"] and sim.outcome is None


# ------------------------------------------------------------------ every worker lost
def all_lost_attempts(sim: Sim, loaded: list[int], trained_to: list[int]) -> int:
    """Round 1 trains batches 0-2 and every worker raises; then attempt ``i`` loads the checkpoint of the state after
    batch ``loaded[i]``, commits the states after that batch up to ``trained_to[i]``, and every worker raises again.
    Returns how many attempts ran before the job ended."""
    horovod_round_one(sim)
    crash(sim, "a[0]")
    seq = 3
    for attempt, (first, last) in enumerate(zip(loaded, trained_to)):
        if sim.outcome is not None:
            return attempt
        sim.advance(3)
        sim.join("a[0]", "b[0]")
        assert sim.layout() == ["a[0]", "b[0]"], sim.layout()
        seq = attempt + 1  # each attempt's checkpoint is the previous one's first commit
        sim.job.checkpoint_loaded(seq, seq, f"/ck/step{seq}", trained=fp(first))
        for batch in range(first, last + 1):
            seq += 1
            commits(sim, "a[0]", seq, batch)
            commits(sim, "b[0]", seq, batch)
        crash(sim, "a[0]")
        crash(sim, "b[0]")
    return len(loaded)


def test_every_rank_raising_at_the_same_batch_with_a_checkpoint_dir_ends_instead_of_resuming_for_ever() -> None:
    """rvV's hvd_all_raise.sh: each attempt resumes from the checkpoint of the previous one's first commit, the redo
    of batch 0 (its step grows, its state does not), and every rank raises at batch 3: 116 failures in 200 s."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), checkpointing=True, elastic_timeout_s=60)
    attempts = all_lost_attempts(sim, [0] * 8, [2] * 8)
    assert attempts <= REPEATS, attempts
    # Each attempt moves its state on in memory and loses it: no slot's failures repeat, every worker's loss does.
    failed(sim, f"every worker failed, {REPEATS} time(s) in a row", "without getting further", BUG)


def test_attempts_that_train_further_each_time_but_never_checkpoint_it_end_too() -> None:
    """What an attempt commits and loses with its workers is no progress: each resumes from the same checkpoint
    (it is lost before its next write), however far it got in memory."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), checkpointing=True, elastic_timeout_s=60)
    assert all_lost_attempts(sim, [0] * 8, [3 + n for n in range(8)]) <= REPEATS + 1
    failed(sim, f"every worker failed, {REPEATS} time(s) in a row", "without getting further", BUG)


def test_every_rank_failing_each_attempt_one_checkpoint_further_never_ends_the_job() -> None:
    """rvV's all_lost.sh: every commit checkpointed; each attempt resumes one commit further and fails again."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), checkpointing=True, elastic_timeout_s=60)
    n = 3 * REPEATS
    assert all_lost_attempts(sim, [2 + k for k in range(n)], [3 + k for k in range(n)]) == n
    assert sim.outcome is None and sim.job.hosts.blacklist.for_good_slots() == []


# ------------------------------------------------------------------ a stall loop
def horovod_stalls(times: int, *, new_state: bool) -> FakeJob:
    """Horovod's loop stalling at batch 3 (a collective only rank 0 runs): round 1 trained batches 0-2; each
    re-formed round redoes batch 2 (one commit more), or (``new_state``) trains one batch further, then stalls."""
    def each_round(job: FakeJob, n: int) -> None:
        if n == 1:
            for batch in range(3):
                job.trained.note(marked(batch), "a")
        else:
            job.commit_high += 1
            job.trained.note(marked(2 + n if new_state else 2), "a")

    return stalls([ALLREDUCE, ALLREDUCE], times, each_round)


def test_a_collective_only_rank_0_runs_in_horovods_loop_ends_the_job_at_the_third_stall() -> None:
    """rvS's repeat_stall.sh: each re-formed round redoes one batch, then stalls in the same place (26 rounds)."""
    job = horovod_stalls(2 * REPEATS, new_state=False)
    assert job.outcome is not None and not job.outcome.success and job.aborts == REPEATS - 1
    assert f"round 3 stalled {REPEATS} times in a row at commit 8 with the same 2 worker(s)" in job.outcome.reason


def test_rounds_that_stall_one_batch_further_each_time_never_end_the_job() -> None:
    job = horovod_stalls(3 * REPEATS, new_state=True)
    assert job.outcome is None and job.aborts == 3 * REPEATS


# ------------------------------------------------------------------ a hang loop
def test_a_rank_deadlocked_at_the_same_batch_of_horovods_loop_ends_the_job_at_its_third_give_up() -> None:
    """rvS's repeat_hang.sh: rank 1 deadlocks at batch 3 of each relaunch, after the redo of batch 2."""
    sim = fixed()
    for n in range(REPEATS):
        commits(sim, "a[0]", 6 + n, 2)
        commits(sim, "b[0]", 6 + n, 2)
        hangs(sim, "deadlock", 6 + n)
        assert (sim.outcome is None) == (n < REPEATS - 1), n
    failed(sim, f"no progress: worker b[0] (rank 1) was given up {REPEATS} times in a row at commit 8, its process "
                f"still running each time and no commit that moved the state on in between")


def test_a_rank_stuck_each_relaunch_one_commit_further_never_ends_the_job() -> None:
    """rvV's rare_hang.sh: rank 1 is stuck on a read after each relaunch's one commit."""
    sim = fixed()
    for n in range(2 * REPEATS):
        commits(sim, "a[0]", 6 + n, 4 * n)
        commits(sim, "b[0]", 6 + n, 4 * n)
        hangs(sim, "deadlock", 6 + n)
        assert sim.outcome is None, n


# ------------------------------------------------------------------ the worker's side
def test_a_states_fingerprint_is_its_plain_attributes_and_samplers_never_its_tensors() -> None:
    from cloud_elastic.worker.commit.state import ObjectState

    state = ObjectState(epoch=1, batch=7, name="run", sizes=(2, 3), weights=torch.ones(3), table={"a": 1})
    same = ObjectState(batch=7, epoch=1, name="run", sizes=(2, 3), weights=torch.zeros(3), table={"b": 2})
    assert len(fingerprint(state)) == 16 and fingerprint(state) == fingerprint(same)  # tensors, dicts left out
    state.batch = 8
    assert fingerprint(state) == fingerprint(same)  # not committed yet
    state.save()
    assert fingerprint(state) != fingerprint(same)
    assert fingerprint(ObjectState(weights=torch.ones(3))) == ""  # nothing to tell: the commit count
    long_text, big = "x" * (MAX_TEXT + 1), 2 ** 65
    assert fingerprint(ObjectState(note=long_text, seed=big)) == ""  # too long to read at each commit


def test_a_samplers_position_is_part_of_the_fingerprint(monkeypatch) -> None:
    """``TorchState(model, opt, sampler=sampler, epoch=0)`` committed every N batches: its sampler says how far the
    epoch has gone."""
    from types import SimpleNamespace

    from cloud_elastic.worker import sampler as sampler_module
    from cloud_elastic.worker.commit.state import TorchState

    ctx = SimpleNamespace(standalone=True, info=SimpleNamespace(rank=0, size=1))
    monkeypatch.setattr(sampler_module, "get_context", lambda: ctx)
    sampler = sampler_module.ElasticSampler(list(range(64)))
    state = TorchState(sampler=sampler, epoch=0)
    before = fingerprint(state)
    sampler.record_batch(0, 8)
    state.save()
    assert fingerprint(state) != before


def _steps(ledger: CommitLedger, n: int, optimizer: object = None) -> None:
    for _ in range(n):
        ledger.note_step(optimizer)


def test_the_ledger_marks_a_fingerprint_once_it_moved_and_a_redo_is_the_same_state() -> None:
    ledger = CommitLedger("auto", Progress())
    assert ledger.trained == ""  # nothing committed yet
    ledger.note_commit(None, fp(0))
    assert ledger.trained == fp(0)  # not seen to move with training yet: unmarked, the driver counts commits
    _steps(ledger, 1)
    ledger.note_commit(None, fp(1))
    assert ledger.trained == marked(1)  # two commits in a row, different attributes: they say where training is
    ledger.note_rollback()
    _steps(ledger, 1)
    ledger.note_commit(None, fp(1))  # the first commit after a restore redoes the restored batch: one step
    assert ledger.trained == marked(1)
    ledger.note_commit(None, fp(1))  # a commit with no step since (an end-of-epoch hook's, then the loop's)
    assert ledger.trained == marked(1)
    ledger.hold_commit(9, fp(4))  # a sync gave it rank 0's commit 9
    assert ledger.trained == marked(4)


def test_a_redo_of_a_batch_that_steps_two_optimizers_is_still_a_redo() -> None:
    """Review s62 rvR finding 4: a GAN's batch steps its discriminator and its generator once each; counted together,
    Horovod's redo of it looked like two steps standing still, and the guard was off for good."""
    discriminator, generator = object(), object()
    ledger = CommitLedger("auto", Progress())
    for batch in (0, 1):
        _steps(ledger, 1, discriminator)
        _steps(ledger, 1, generator)
        ledger.note_commit(None, fp(batch))
    ledger.note_rollback()
    _steps(ledger, 1, discriminator)
    _steps(ledger, 1, generator)
    ledger.note_commit(None, fp(1))
    assert ledger.trained == marked(1)
    ledger.note_rollback()
    _steps(ledger, 2, generator)  # two steps of one optimizer, the same attributes: they stand still
    ledger.note_commit(None, fp(1))
    assert ledger.trained == UNTOLD


@pytest.mark.parametrize("after", ["in_a_row", "restore", "sync"])
def test_attributes_standing_still_over_training_are_untold_for_good(after) -> None:
    """A step kept in a tensor, ``epoch`` alone committed every N batches: the attributes stand still while the job
    trains, so the driver must count commits (review s61 rvA finding 1: such jobs were stopped while training)."""
    ledger = CommitLedger("auto", Progress())
    ledger.note_commit(None, fp(0))
    _steps(ledger, 1)
    ledger.note_commit(None, fp(1))
    if after == "restore":
        ledger.note_rollback()
        _steps(ledger, 1)
        ledger.note_commit(None, fp(1))  # Horovod's redo: still telling
        assert ledger.trained == marked(1)
        ledger.note_rollback()
    elif after == "sync":
        ledger.hold_commit(5, fp(1))
    _steps(ledger, 1 if after == "in_a_row" else 2)
    ledger.note_commit(None, fp(1))
    assert ledger.trained == UNTOLD
    ledger.note_rollback()
    _steps(ledger, 1)
    ledger.note_commit(None, fp(5))
    assert ledger.trained == UNTOLD  # for good


def test_a_process_whose_attributes_never_moved_reports_them_unmarked() -> None:
    """A relaunched rank redoes the state it was synced to, then fails: it never saw its attributes move, so the
    driver keeps the commit count unless another worker's moved."""
    ledger = CommitLedger("auto", Progress())
    ledger.hold_commit(3, fp(2))
    _steps(ledger, 1)
    ledger.note_commit(None, fp(2))
    assert ledger.trained == fp(2)


def test_a_restored_process_whose_one_commit_moved_past_the_restored_state_marks_it() -> None:
    """Review s62 rvR finding 2: a process that commits once between restores never had two commits in a row."""
    ledger = CommitLedger("auto", Progress())
    ledger.hold_commit(3, fp(2))
    _steps(ledger, 4)
    ledger.note_commit(None, fp(3))
    assert ledger.trained == marked(3)


def test_a_checkpoints_fingerprint_alone_never_makes_the_job_count_states() -> None:
    """Only a worker's marked report makes the fingerprints tell; a checkpoint load's never does."""
    trained = Trained()
    for n in range(REPEATS + 2):
        trained.note(fp(7), stored=True)
        trained.note(fp(7 + n), "a")  # unmarked
        assert trained.loaded() is None and trained.at(n) == n
    trained.note(marked(7), "b")
    assert trained.loaded() == ("loaded", 1) and trained.at(9)[0] == "trained"


# ------------------------------------------------------------------ the wire
def test_the_fingerprint_rides_on_heartbeats_rendezvous_and_checkpoint_loads() -> None:
    poll = PollRequest.from_wire(PollRequest(1, 0, 0, 3, 3, trained=marked(2)).to_wire())
    rdzv = RendezvousRequest.from_wire(RendezvousRequest(1, "failure", 3, 0, 3, trained=UNTOLD).to_wire())
    load = CheckpointReport.from_wire({"event": "loaded", "step": 3, "path": "/ck", "commit_seq": 3,
                                       "trained": fp(2)})
    assert (poll.trained, rdzv.trained, load.trained) == (marked(2), UNTOLD, fp(2))
    old = PollRequest(1, 0, 0).to_wire()
    del old["trained"]  # an older worker
    assert PollRequest.from_wire(old).trained == ""


def test_a_marked_fingerprint_reaches_a_driver_older_than_the_mark_in_a_form_it_reads() -> None:
    """Drivers before the mark (1b9d50f) refused any ``trained`` but hex digits or '-': a newer worker's marked
    heartbeats and rendezvous requests were refused ('malformed poll request: ... got '+79e8...''), and a worker
    whose every report carried it would have gone silent for them. The mark rides in a field of its own."""
    older_driver_reads = re.compile(r"[0-9a-f]{1,16}|-").fullmatch  # their fingerprint_field, for a non-empty one
    for wire in (PollRequest(1, 0, 0, 3, 3, trained=marked(2)).to_wire(),
                 RendezvousRequest(1, "failure", 3, 0, 3, trained=marked(2)).to_wire()):
        assert older_driver_reads(wire["trained"]) and wire["trained"] == fp(2)
    assert PollRequest.from_wire(PollRequest(1, 0, 0, trained=marked(2)).to_wire()).trained == marked(2)
    assert PollRequest.from_wire(PollRequest(1, 0, 0, trained=fp(2)).to_wire()).trained == fp(2)
    assert PollRequest.from_wire(PollRequest(1, 0, 0, trained=UNTOLD).to_wire()).trained == UNTOLD
    # The mark as workers wrote it for a while (in the fingerprint) still reads the same.
    assert PollRequest.from_wire({**PollRequest(1, 0, 0).to_wire(), "trained": marked(2)}).trained == marked(2)


@pytest.mark.parametrize("forged", ["0" * 17, "+" + "0" * 17, "+", "++ab", "XYZ", "12 4", 5, ["ab"], True],
                         ids=["too-long", "marked-too-long", "mark-alone", "marked-twice", "not-hex", "space", "number",
                              "list", "bool"])
def test_a_forged_fingerprint_is_refused_in_one_line(forged) -> None:
    for parse, wire in [(PollRequest.from_wire, PollRequest(1, 0, 0).to_wire()),
                        (RendezvousRequest.from_wire, RendezvousRequest(0, "start").to_wire()),
                        (CheckpointReport.from_wire, {"event": "loaded", "step": 3, "path": "/ck"})]:
        with pytest.raises(ControlPlaneError, match="'trained' must be a state fingerprint"):
            parse({**wire, "trained": forged})
