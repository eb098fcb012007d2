"""Rank 0's checkpoints on storage slower than training: the final checkpoint is waited for however long it
takes, and counts as progress meanwhile; a worker that stops being rank 0 does not wait for its upload.

Found by review: a final write over 120 s failed every finished job ("the previous checkpoint was still being
written after 120s") and the driver's --progress-timeout aborted the round while it ran; a worker moved off rank 0
blocked its training thread (and so every rank) until its upload finished.

Rank 0's schedule on a fake worker context (its reports recorded), a real store in a directory.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from cloud_elastic.worker.durable import rank_zero
from cloud_elastic.worker.durable.rank_zero import DurableSettings, RankZeroCheckpoints
from cloud_elastic.worker.link.progress import Progress
from tests.unit.test_durable_failures import _ctx, _record, _State

pytestmark = pytest.mark.timeout(60)


def _slow(schedule: RankZeroCheckpoints, monkeypatch, release: threading.Event, *, seconds: float) -> None:
    """Each save waits for ``release`` up to ``seconds`` first: storage slower than a step."""
    real = schedule.store.save

    def slow(*args, **kwargs):
        release.wait(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(schedule.store, "save", slow)


def _saved(ctx) -> list[int]:
    return [f["step"] for event, f in ctx.reports if event == "saved"]


def test_the_final_checkpoint_is_waited_for_however_long_it_takes_and_counts_as_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(rank_zero, "FLUSH_TIMEOUT_S", 0.5)  # the limit a leaver has: finishing has none
    url = str(tmp_path / "ckpt")
    _record(url)
    ctx = _ctx()
    ctx.progress = Progress()
    schedule = RankZeroCheckpoints(DurableSettings(url, interval_s=300.0), ctx)
    _slow(schedule, monkeypatch, threading.Event(), seconds=1.5)
    state = _State(step=1, w=torch.zeros(2))
    schedule.after_commit(state)  # checkpoint 1 starts: slower than the rest of training
    state.step, state.w, ctx.ledger.commit_seq = 10, torch.full((2,), 10.0), 10
    before = ctx.progress.sample()
    assert schedule.finish(state) is None  # waits for checkpoint 1, then writes and waits for step 10
    assert schedule.store.latest().info.step == 10 and _saved(ctx) == [1, 10]
    # The driver's watch sees the counter grow while the writes go on: no --progress-timeout abort.
    assert ctx.progress.sample() - before >= 2
    assert not schedule.writing


def test_a_worker_that_stops_being_rank_0_goes_on_at_once_and_waits_for_its_upload_at_exit(tmp_path, monkeypatch):
    url = str(tmp_path / "ckpt")
    _record(url)
    ctx = _ctx()
    schedule = RankZeroCheckpoints(DurableSettings(url, interval_s=300.0), ctx)
    release = threading.Event()
    _slow(schedule, monkeypatch, release, seconds=5.0)
    state = _State(step=1, w=torch.zeros(2))
    schedule.after_commit(state)  # as rank 0: the upload of checkpoint 1 starts, and stalls
    ctx.info.rank, ctx.ledger.commit_seq, state.step = 1, 2, 2  # the next round: another worker is rank 0
    began = time.monotonic()
    schedule.after_commit(state)
    assert time.monotonic() - began < 1.0  # the commit does not wait for storage
    assert not schedule.writing
    assert schedule.stop_writing(0.1) is False  # on its way out it waits for that upload (here: not in 0.1s)
    release.set()
    assert schedule.stop_writing(10.0) is True
    assert schedule.store.latest().info.step == 1 and _saved(ctx) == [1]
