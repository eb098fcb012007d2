"""A writer process SIGKILLed in the middle of writing a checkpoint: the previous one is what loads, and the
next save deletes what it left before writing (on a disk it filled, the save would fail otherwise, and so would
every later one: found by review); never the folder of a writer still at work.

The child writes checkpoint 1, then has its background writer write a
128 MB checkpoint 2. The test kills it with SIGKILL once the data of
checkpoint 2 is partly on disk, and checks that it did catch the write in
the middle (the assertion is not vacuous if the write wins the race: it fails).
"""

from __future__ import annotations

import logging
import os
import errno
import fcntl
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

from cloud_elastic.checkpoint import CheckpointStore
from cloud_elastic.checkpoint.api import CheckpointError
from cloud_elastic.checkpoint.backend import LocalBackend

pytestmark = pytest.mark.timeout(120)

CHILD = textwrap.dedent("""
    import sys, torch
    from cloud_elastic.checkpoint import CheckpointStore, CheckpointWriter
    store = CheckpointStore(sys.argv[1], keep=2)
    store.save(1, {"w": torch.full((10,), 1.0), "step": 1})
    print("saved 1", flush=True)
    big = {"w": [torch.full((16384,), 2.0) for _ in range(2000)], "step": 2}  # 128 MB in 2000 writes
    with CheckpointWriter(store) as writer:
        writer.submit(2, big)
        print("submitted 2", flush=True)
        writer.wait()
    print("saved 2", flush=True)
""")


def _partial_data(root: Path) -> Path | None:
    """The temporary data file of checkpoint 2 once it holds some bytes, if its manifest is not there."""
    for folder in root.glob("ckpt-*-step000000000002"):
        if (folder / "manifest.json").exists():
            return None
        for tmp in folder.glob(".state.pt.*.tmp"):
            if tmp.stat().st_size > 0:
                return tmp
    return None


class _FullDisk(LocalBackend):
    """A disk with no room for another checkpoint's data while an interrupted write's file holds the space,
    or at all (``room=False``)."""

    def __init__(self, root: Path, room: bool = True) -> None:
        super().__init__(str(root))
        self.room = room

    def write(self, path, produce):
        if path.endswith("/state.pt") and (not self.room or list(Path(self.root).glob("*-step000000000002/.*.tmp"))):
            def no_room(f):
                f.write(b"torch.save's first bytes")
                raise OSError(errno.ENOSPC, "No space left on device")

            produce = no_room
        super().write(path, produce)


class _Stalling(LocalBackend):
    """A writer at work: its data's temporary file written, it stalls until ``release`` (``entered`` says so)."""

    def __init__(self, root: Path) -> None:
        super().__init__(str(root))
        self.entered, self.release = threading.Event(), threading.Event()

    def write(self, path, produce):
        def stalled(f):
            produce(f)
            self.entered.set()
            self.release.wait(30)

        super().write(path, stalled if path.endswith("/state.pt") else produce)


class _NoLocks(LocalBackend):
    """Storage on which no lock tells a live writer from a dead one (an object store, a mount shared by hosts
    without shared locks)."""

    def abandoned(self, path: str) -> bool | None:
        return None


def test_sigkill_during_a_write_leaves_the_previous_checkpoint_loadable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "saved 1"
        assert child.stdout.readline().strip() == "submitted 2"
        caught = None
        deadline = time.monotonic() + 60
        while caught is None and child.poll() is None and time.monotonic() < deadline:
            caught = _partial_data(root)
            time.sleep(0.001)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert caught is not None, "the write finished (or never started) before the kill: nothing was tested"
    assert child.returncode == -signal.SIGKILL

    store = CheckpointStore(str(root), keep=2)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        latest = store.latest()
    assert latest.info.step == 1 and latest.payload["step"] == 1
    # The store's own warnings only: a thread another test of this process left running may log meanwhile.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("cloud_elastic.checkpoint")]

    # The next save clears the interrupted folder, temporary file included, before it writes: on a disk the
    # dead writer's file filled, it succeeds.
    store = CheckpointStore(str(root), keep=2, backend=_FullDisk(root))
    store.save(3, {"w": latest.payload["w"], "step": 3})
    assert [info.step for info in store.list()] == [3, 1]
    assert not list(root.glob("ckpt-*-step000000000002"))


def test_a_save_keeps_a_live_writers_folder_and_a_failed_save_deletes_its_own(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    CheckpointStore(str(root), keep=1).save(1, {"step": 1})
    # What a killed writer left: its temporary file in a folder newer than checkpoint 1 (its lock died with it).
    now = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    dead = root / f"ckpt-{now}Z-step000000000002"
    dead.mkdir()
    (dead / ".state.pt.0badf00d.tmp").write_bytes(b"x" * 1000)
    # A writer still at work (in another store: another process's as far as this one can tell), newer still.
    stalling = _Stalling(root)
    live = CheckpointStore(str(root), keep=1, backend=stalling)
    writer = threading.Thread(target=live.save, args=(4, {"step": 4}))
    writer.start()
    try:
        assert stalling.entered.wait(30)
        store = CheckpointStore(str(root), keep=1, backend=_FullDisk(root, room=False))
        with pytest.raises(CheckpointError, match="ENOSPC"):
            store.save(5, {"w": torch.ones(4), "step": 5})
        assert not dead.exists() and not list(root.glob("ckpt-*-step000000000005"))
        assert list(root.glob("ckpt-*-step000000000004/.state.pt.*.tmp"))  # the live write goes on
    finally:
        stalling.release.set()
        writer.join(30)
    assert [info.step for info in CheckpointStore(str(root)).list()] == [4]  # the live write was not cut


@pytest.mark.parametrize("where", ["this-process", "locks", "no-locks"])
def test_newer_checkpoints_keep_the_older_folder_of_a_writer_still_at_work(tmp_path: Path, where: str) -> None:
    """The previous rank 0 (this process's earlier writer, or another host's) still writes checkpoint 1 while
    the new one saves newer checkpoints: their prune leaves its folder alone (found by review: it deleted it
    mid-write). Without a lock to tell (``no-locks``), a folder this young is taken for a live write."""
    root = tmp_path / "ckpt"
    stalling = _Stalling(root)
    old = CheckpointStore(str(root), keep=1, backend=stalling)
    saved: list[int] = []
    writer = threading.Thread(target=lambda: saved.append(old.save(1, {"step": 1}).step))
    writer.start()
    try:
        assert stalling.entered.wait(30)
        new = old if where == "this-process" else CheckpointStore(
            str(root), keep=1, backend=LocalBackend(str(root)) if where == "locks" else _NoLocks(str(root)))
        if new is old:
            stalling.write = LocalBackend.write.__get__(stalling)  # the new writer's upload does not stall
        for step in (2, 3):
            new.save(step, {"step": step})
        assert len(list(root.glob("ckpt-*-step000000000001/.state.pt.*.tmp"))) == 1
    finally:
        stalling.release.set()
        writer.join(30)
    assert saved == [1]  # its write was not cut
    assert 1 in [info.step for info in CheckpointStore(str(root)).list()]


def test_a_live_lock_keeps_a_folder_whatever_its_age_says(tmp_path: Path) -> None:
    """A writer that holds its lock is at work, however old its folder's name (its clock 11 minutes behind) and
    files look (a write that has run for hours): no save deletes it (found by review: the 10-minute age rule did,
    and the writer failed with "No such file or directory"). Once the lock is dropped (the writer died), it goes."""
    root = tmp_path / "ckpt"
    live = root / "ckpt-20200101T000000000000Z-step000000000001"
    live.mkdir(parents=True)
    tmp = live / ".state.pt.0123abcd.tmp"
    with open(tmp, "wb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        for path in (tmp, live):
            os.utime(path, (0, 0))
        store = CheckpointStore(str(root), keep=1)
        store.save(2, {"step": 2})
        store.save(3, {"step": 3})
        assert tmp.exists()
    store.save(4, {"step": 4})
    assert not live.exists()


def test_on_an_object_store_a_folder_is_aged_by_its_files_times_not_by_its_name() -> None:
    """No lock tells on an object store: a folder without a manifest goes once nothing in it changed for an hour
    by the storage's own times; its name's time (the writer's clock) does not count."""
    fsspec = pytest.importorskip("fsspec")
    root = f"memory://age-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    folder = "ckpt-20200101T000000000000Z-step000000000001"
    shard = f"{root}/{folder}/dcp/__0_0.distcp"  # a sharded write: its files are in a folder below
    fs.pipe(shard, b"a shard of a write whose manifest is still to come")
    store = CheckpointStore(root, keep=1)
    store.save(2, {"step": 2})
    assert fs.exists(shard)  # young by the storage's clock: a writer may be at work
    fs.store[fs._strip_protocol(shard)].created = datetime.now(timezone.utc) - timedelta(hours=2)
    store.save(3, {"step": 3})
    assert not fs.exists(shard)
