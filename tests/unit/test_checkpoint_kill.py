"""A writer process SIGKILLed in the middle of writing a checkpoint: the previous one is what loads.

The child writes checkpoint 1, then has its background writer write a
128 MB checkpoint 2. The test kills it with SIGKILL once the data of
checkpoint 2 is partly on disk, and checks that it did catch the write in
the middle (the assertion is not vacuous if the write wins the race: it fails).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cloud_elastic.checkpoint import CheckpointStore

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
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    # The next save clears the interrupted folder, temporary file included.
    store.save(3, {"w": latest.payload["w"], "step": 3})
    assert [info.step for info in store.list()] == [3, 1]
    assert not list(root.glob("ckpt-*-step000000000002"))
