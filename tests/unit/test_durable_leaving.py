"""A replica's rank 0 sent away as the last holder of the state (``ExitOrder.checkpoint_s``, kept in
``ctx.checkpoint_before_leaving``) checkpoints the commit it leaves at before it goes, within the time the
driver gave; any other leaver only finishes the checkpoint in flight. Found by review: the last holders left
with no checkpoint written, and the next round resumed from one up to --checkpoint-interval old.

Rank 0's schedule on a fake worker context (its reports recorded), a real store in a directory.
"""

from __future__ import annotations

import threading

import pytest
import torch

from cloud_elastic.worker.durable.rank_zero import DurableSettings, RankZeroCheckpoints
from tests.unit.test_durable_failures import _ctx, _record, _State

pytestmark = pytest.mark.timeout(60)


def _trained(tmp_path, budget: float | None, *, rank: int = 0):
    """A schedule that checkpointed commit 1 (step 10), then trained to commit 38 (step 380): none due since."""
    url = str(tmp_path / "ckpt")
    _record(url)
    ctx = _ctx()
    ctx.info.rank = rank
    ctx.ledger.holds_commit = True
    schedule = RankZeroCheckpoints(DurableSettings(url, interval_s=300.0), ctx, clock=lambda: 0.0)
    state = _State(step=10, w=torch.full((2,), 10.0))
    if rank == 0:
        schedule.after_commit(state)
        assert schedule._writer.wait(30)
    state.step, state.w, ctx.ledger.commit_seq = 380, torch.full((2,), 380.0), 38
    schedule.after_commit(state)  # not due: within the interval
    ctx.checkpoint_before_leaving, ctx.checkpoint_writer = budget, True  # what the exit order said
    return schedule, state, ctx


def _saved(ctx) -> list[tuple[int, int | None]]:
    return [(f["step"], f.get("commit_seq")) for event, f in ctx.reports if event == "saved"]


def test_the_last_holders_rank_0_checkpoints_the_commit_it_leaves_at(tmp_path) -> None:
    schedule, state, ctx = _trained(tmp_path, 30.0)
    schedule.leaving(state)
    latest = schedule.store.latest()
    assert latest.info.step == 380 and latest.info.extra["commit_seq"] == 38
    assert torch.equal(latest.payload["w"], torch.full((2,), 380.0))
    assert _saved(ctx) == [(10, 1), (380, 38)]  # with its commit: the driver knows nothing was lost
    assert not schedule.writing


def test_a_leaver_not_told_to_checkpoint_writes_nothing_new(tmp_path) -> None:
    schedule, state, ctx = _trained(tmp_path, None)
    schedule.leaving(state)
    assert schedule.store.latest().info.step == 10 and _saved(ctx) == [(10, 1)]


def test_only_the_writer_the_driver_picked_writes_it(tmp_path) -> None:
    schedule, state, ctx = _trained(tmp_path, 30.0)
    ctx.checkpoint_writer = False  # a host-mate of the writer: its exit order gave it the time, not the write
    schedule.leaving(state)
    assert schedule.store.latest().info.step == 10 and _saved(ctx) == [(10, 1)]


def test_the_writer_writes_it_whatever_its_last_rank(tmp_path) -> None:
    # Found by review: rank 0's host lost or gone first, the survivors told to checkpoint wrote nothing (their last
    # round's rank was not 0). The driver picks the writer by the order the last holders leave in.
    schedule, state, ctx = _trained(tmp_path, 30.0, rank=1)
    schedule.leaving(state)
    latest = schedule.store.latest()
    assert latest is not None and latest.info.step == 380 and _saved(ctx) == [(380, 38)]


def test_no_time_left_writes_nothing(tmp_path) -> None:
    schedule, state, ctx = _trained(tmp_path, 0.0)
    schedule.leaving(state)
    assert schedule.store.latest().info.step == 10 and _saved(ctx) == [(10, 1)]


def test_a_commit_stored_already_is_not_written_twice(tmp_path) -> None:
    schedule, state, ctx = _trained(tmp_path, 30.0)
    ctx.ledger.commit_seq, state.step = 1, 10  # it leaves at the commit it just checkpointed
    schedule.leaving(state)
    assert _saved(ctx) == [(10, 1)]


def test_a_write_that_outlasts_the_time_given_is_left_behind_and_the_worker_goes(tmp_path, monkeypatch) -> None:
    schedule, state, ctx = _trained(tmp_path, 0.2)
    release = threading.Event()
    real = schedule.store.save

    def stalled(*args, **kwargs):
        release.wait(50)  # storage that hangs past the host's deadline
        return real(*args, **kwargs)

    monkeypatch.setattr(schedule.store, "save", stalled)
    schedule.leaving(state)  # returns: a leaver does not wait past its host's deadline
    assert _saved(ctx) == [(10, 1)] and not schedule.writing
    release.set()
