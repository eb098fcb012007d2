"""Rank 0's checkpoints on storage slower than training: the final checkpoint is waited for however long it
takes, and counts as progress while it moves bytes; a worker that stops being rank 0 does not wait for its upload,
and back at rank 0 writes after it, never beside it.

Found by review: a final write over 120 s failed every finished job ("the previous checkpoint was still being
written after 120s") and the driver's --progress-timeout aborted the round while it ran; a worker moved off rank 0
blocked its training thread (and so every rank) until its upload finished. Then: storage that moved no byte (a hung
mount) counted as progress for ever, holding the job; and a worker back at rank 0 wrote a second checkpoint beside
the first, whose prune deleted the first one's folder mid-write (one upload and one copy of the state per turn).

Rank 0's schedule on a fake worker context (its reports recorded), a real store in a directory.
"""

from __future__ import annotations

import errno
import threading
import time

import pytest
import torch
from fsspec.spec import AbstractBufferedFile

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


def _finishing_rank_zero(tmp_path):
    """A worker context that records progress, and rank 0's schedule on a job's checkpoint directory."""
    url = str(tmp_path / "ckpt")
    _record(url)
    ctx = _ctx()
    ctx.progress = Progress()
    return ctx, RankZeroCheckpoints(DurableSettings(url, interval_s=300.0), ctx)


class _Trickle:
    """A file whose every write takes ``seconds``: storage that is slow but moves bytes."""

    def __init__(self, f, seconds: float) -> None:
        self._f, self._seconds = f, seconds

    def write(self, data) -> int:
        time.sleep(self._seconds)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()


def _storage(schedule: RankZeroCheckpoints, monkeypatch, *, seconds_per_write: float = 0.0,
             hung: threading.Event | None = None) -> None:
    """Each checkpoint's data goes through :class:`_Trickle`; with ``hung``, none moves a byte until it is set
    (then the write fails, as a mount that recovers with an I/O error)."""
    backend = schedule.store.backend
    real = backend.write

    def write(path, produce):
        if not path.endswith("/state.pt"):
            return real(path, produce)
        if hung is not None:
            hung.wait(30)
            raise OSError(errno.EIO, "Input/output error")
        return real(path, lambda f: produce(_Trickle(f, seconds_per_write)))

    monkeypatch.setattr(backend, "write", write)


class _Uploading(AbstractBufferedFile):
    """s3fs's shape: writes fill a buffer up to the block size; each full block, and in ``close()`` the rest, is
    uploaded (here into ``sink``) once ``sent`` is set: an upload as slow as the storage."""

    def __init__(self, sink, block_size: int, sent: threading.Event) -> None:
        super().__init__(None, "state.pt", mode="wb", block_size=block_size)
        self._sink, self._sent, self.counted = sink, sent, []

    def _initiate_upload(self) -> None:
        pass

    def _upload_chunk(self, final: bool = False) -> bool:
        self._sent.wait(30)
        self._sink.write(self.buffer.getvalue())
        return True


def _buffering(schedule: RankZeroCheckpoints, monkeypatch, block_size: int, sent: threading.Event) -> list[int]:
    """Each checkpoint's data goes through an :class:`_Uploading` file; returns the store's byte counter as each
    upload began."""
    store, real = schedule.store, schedule.store.backend.write
    counted: list[int] = []

    def write(path, produce):
        if not path.endswith("/state.pt"):
            return real(path, produce)

        def through(f):
            up = _Uploading(f, block_size, sent)
            upload = up._upload_chunk
            up._upload_chunk = lambda final=False: counted.append(store.bytes_written) or upload(final)
            produce(up)
            up.close()

        return real(path, through)

    monkeypatch.setattr(store.backend, "write", write)
    return counted


def test_bytes_an_object_store_only_buffered_are_no_progress(tmp_path, monkeypatch):
    """s3fs holds up to 50 MiB before it uploads, the rest in close(): bytes count as they are sent, not as they are
    buffered (found by review: buffered bytes counted, a dead store's upload looked like progress and a slow
    one's bytes all counted before it began)."""
    ctx, schedule = _finishing_rank_zero(tmp_path)
    sent = threading.Event()
    counted = _buffering(schedule, monkeypatch, 1 << 20, sent)
    state = _State(step=10, w=torch.zeros(3 << 18))  # 3 MiB: uploaded once past the 1 MiB block, the rest in close()
    out: list[str | None] = []
    finishing = threading.Thread(target=lambda: out.append(schedule.finish(state)), daemon=True)
    before = ctx.progress.sample()
    finishing.start()
    finishing.join(2.5)
    # Written into the buffer, none sent: no progress to the driver's watch.
    assert finishing.is_alive() and ctx.progress.sample() == before and schedule.store.bytes_written == 0
    sent.set()
    finishing.join(10)
    assert out == [None] and schedule.store.latest().info.step == 10
    size = schedule.store.latest().info.size
    # Each upload began with the counter at the bytes the uploads before it sent; all of them count in the end.
    assert counted[0] == 0 and counted == sorted(counted) and counted[-1] < size == schedule.store.bytes_written


def _saved(ctx) -> list[int]:
    return [f["step"] for event, f in ctx.reports if event == "saved"]


def test_the_final_checkpoint_is_waited_for_however_long_it_takes_and_counts_as_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(rank_zero, "FLUSH_TIMEOUT_S", 0.5)  # the limit a leaver has: finishing has none
    ctx, schedule = _finishing_rank_zero(tmp_path)
    _storage(schedule, monkeypatch, seconds_per_write=0.04)  # about 1.5 s a checkpoint, bytes moving throughout
    state = _State(step=1, w=torch.zeros(2))
    schedule.after_commit(state)  # checkpoint 1 starts: slower than the rest of training
    state.step, state.w, ctx.ledger.commit_seq = 10, torch.full((2,), 10.0), 10
    before = ctx.progress.sample()
    assert schedule.finish(state) is None  # waits for checkpoint 1, then writes and waits for step 10
    assert schedule.store.latest().info.step == 10 and _saved(ctx) == [1, 10]
    # The driver's watch sees the counter grow while the writes go on: no --progress-timeout abort.
    assert ctx.progress.sample() - before >= 2
    assert not schedule.writing


def test_a_final_write_that_moves_no_bytes_is_not_progress(tmp_path, monkeypatch):
    ctx, schedule = _finishing_rank_zero(tmp_path)
    hung = threading.Event()
    _storage(schedule, monkeypatch, hung=hung)  # a hung mount: no byte, no error
    why = finishing_on_a_hung_mount(ctx, schedule, _State(step=10, w=torch.zeros(2)), hung)
    assert why.startswith("the final checkpoint (step 10) was not written")


def finishing_on_a_hung_mount(ctx, schedule, state, hung: threading.Event) -> str:
    """``schedule.finish(state)`` while storage moves no byte until ``hung`` is set (then fails); why it says
    the final checkpoint was not written."""
    out: list[str | None] = []
    finishing = threading.Thread(target=lambda: out.append(schedule.finish(state)), daemon=True)
    before = ctx.progress.sample()
    finishing.start()
    finishing.join(3.5)
    # Still waiting, and the driver's watch sees nothing move: --progress-timeout ends the round, as for any
    # stuck worker, instead of the job waiting on the mount for ever.
    assert finishing.is_alive() and ctx.progress.sample() == before
    hung.set()
    finishing.join(30)
    assert out and out[0] is not None
    return out[0]


def test_back_at_rank_0_a_worker_writes_after_its_earlier_upload_never_beside_it(tmp_path, monkeypatch):
    url = str(tmp_path / "ckpt")
    _record(url)
    ctx = _ctx()
    schedule = RankZeroCheckpoints(DurableSettings(url, interval_s=300.0), ctx)
    release, saving, most = threading.Event(), [0], [0]
    real = schedule.store.save

    def save(*args, **kwargs):  # storage slower than a round
        saving[0] += 1
        most[0] = max(most[0], saving[0])
        try:
            release.wait(10)
            return real(*args, **kwargs)
        finally:
            saving[0] -= 1

    monkeypatch.setattr(schedule.store, "save", save)
    state = _State(step=1, w=torch.zeros(1000))
    for turn in range(3):  # rank 0, then another worker is, and so on: every round shorter than the upload
        ctx.info.rank, ctx.ledger.commit_seq, state.step = 0, 2 * turn + 1, 2 * turn + 1
        schedule.after_commit(state)
        ctx.info.rank, ctx.ledger.commit_seq, state.step = 1, 2 * turn + 2, 2 * turn + 2
        schedule.after_commit(state)
    time.sleep(0.3)
    assert most[0] == 1  # one upload (and one copy of the state) at a time
    release.set()
    ctx.info.rank, ctx.ledger.commit_seq, state.step = 0, 7, 7
    deadline = time.monotonic() + 10
    while 7 not in _saved(ctx) and time.monotonic() < deadline:  # free again, the writer takes the next commit
        schedule.after_commit(state)
        time.sleep(0.05)
    assert schedule.stop_writing(10.0) is True
    assert _saved(ctx) == [1, 7] and [info.step for info in schedule.store.list()] == [7, 1]


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
