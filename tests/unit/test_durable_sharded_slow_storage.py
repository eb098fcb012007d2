"""Host 0's sharded checkpoints (``hvd.shard``) on storage slower than training: the end of training waits for the
writes however long they take, and counts as progress while they move bytes, DCP's shard files included.

Found after the replica's fix (test_durable_slow_storage.py): the sharded path still capped its wait for a write in
the background at 120 s, then wrote the final checkpoint beside it; and nothing of it counted as progress, as DCP's
shard writes did not feed the store's byte counter: a final write over --progress-timeout (120 s by default) had
the driver abort the round of a finished job.

One standalone worker (a host of one), its checkpoints on ``slowfile://``: a local folder behind fsspec whose
uploads are slow but steady, in s3fs's shape (writes fill a buffer; each full block, and the rest at close, is an
upload that takes a while).
"""

from __future__ import annotations

import errno
import logging
import os
import threading

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile

from cloud_elastic.worker.durable import sharded as sharded_checkpoints
from cloud_elastic.worker.durable.rank_zero import DurableSettings
from cloud_elastic.worker.durable.sharded import ShardedCheckpoints
from cloud_elastic.worker.link.progress import Progress
from tests.unit.test_durable_slow_storage import finishing_on_a_hung_mount
from tests.unit.test_sharded_checkpoint import _ctx, _job_store, _state, _train

pytestmark = pytest.mark.timeout(90)

_BLOCK = 4096


class _SlowUpload(AbstractBufferedFile):
    """Each upload of a block (or of the rest, at close) waits ``fs.pace`` seconds, or for ``fs.hung`` when it is
    set up: a mount that moves no byte, then fails."""

    def _initiate_upload(self) -> None:
        self._out = open(self.path, "wb")

    def _upload_chunk(self, final: bool = False) -> bool:
        fs = self.fs
        if fs.hung is not None:
            fs.hung.wait(30)
            self._out.close()
            raise OSError(errno.EIO, "Input/output error")
        threading.Event().wait(fs.pace)
        self._out.write(self.buffer.getvalue())
        if final:
            self._out.close()
        return True


class _SlowFS(LocalFileSystem):
    protocol = ("slowfile",)
    pace = 0.1
    hung: threading.Event | None = None

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        path = self._strip_protocol(path)
        if "w" not in mode:
            return super()._open(path, mode, block_size=block_size, **kwargs)
        self.makedirs(os.path.dirname(path), exist_ok=True)
        return _SlowUpload(self, path, mode, block_size=_BLOCK)


fsspec.register_implementation("slowfile", _SlowFS, clobber=True)


@pytest.fixture
def slow_fs(monkeypatch):
    monkeypatch.setattr(_SlowFS, "pace", 0.1)
    monkeypatch.setattr(_SlowFS, "hung", None)
    return _SlowFS


def _host_0(tmp_path):
    ctx = _ctx()
    ctx.progress = Progress()
    durable = ShardedCheckpoints(DurableSettings(_job_store(f"slowfile://{tmp_path}/ckpt"), interval_s=300.0, keep=3),
                                 ctx)
    return ctx, durable


def test_the_final_sharded_checkpoint_is_waited_for_past_the_leavers_limit_and_counts_as_progress(
        tmp_path, monkeypatch, slow_fs, caplog):
    monkeypatch.setattr(sharded_checkpoints, "FLUSH_TIMEOUT_S", 0.5)  # the limit a leaver has: finishing has none
    ctx, durable = _host_0(tmp_path)
    real_save, counted, writing = sharded_checkpoints._save, [], [0]

    def save(tensors, storage, group=None):  # the store's byte counter over each DCP save, and writes at once
        writing[0] += 1
        before = durable.store.bytes_written
        try:
            assert writing[0] == 1, "two checkpoints written at once"
            real_save(tensors, storage, group)
        finally:
            writing[0] -= 1
        counted.append((durable.store.bytes_written - before, storage.files))

    monkeypatch.setattr(sharded_checkpoints, "_save", save)
    state = _state()
    _train(state, 2)
    ctx.ledger.commit_seq = 2
    durable.after_commit(state)  # the checkpoint of step 2 starts in the background: slower than what is left
    _train(state, 2)
    ctx.ledger.commit_seq = 4
    before = ctx.progress.sample()
    with caplog.at_level(logging.WARNING):
        assert durable.finish(state) is None  # waits for step 2's write, then writes step 4, however long
    assert [(e, f["step"]) for e, f in ctx.reports] == [("saved", 2), ("saved", 4)]
    assert durable.store.latest().info.step == 4
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("cloud_elastic.worker")]
    assert not warned  # no "did not finish within 120s", no write beside the one in flight
    # The driver's watch sees the counter grow while the writes go on: no --progress-timeout abort.
    assert ctx.progress.sample() - before >= 2
    # DCP's own files count as they are uploaded, each shard file's bytes at least (the files DCP's coordinator
    # digested: the same bytes), before the save returns.
    for moved, files in counted:
        assert moved >= sum(size for size, _ in files.values()) > 0


def test_a_final_sharded_write_that_moves_no_bytes_is_not_progress(tmp_path, slow_fs):
    ctx, durable = _host_0(tmp_path)
    slow_fs.hung = threading.Event()  # a hung mount: no byte, no error
    state = _state()
    _train(state, 2)
    ctx.ledger.commit_seq = 2
    why = finishing_on_a_hung_mount(ctx, durable, state, slow_fs.hung)
    assert why.startswith("the final checkpoint (step 2) was not written: ") and "\n" not in why
    assert not [e for e, _ in ctx.reports if e == "saved"]
