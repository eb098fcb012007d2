"""A worker forked by a real driver's fork server ends as ``python SCRIPT`` would, less the interpreter's teardown
(``forkserver_child._end_as_the_interpreter_would``; compared with a plain run in ``tests/unit/test_forked_exit.py``):
its exit status reaches the driver, its thread is joined and its exit hook runs, in that order, and what it left
unflushed in a file it never closed is written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit.test_forked_exit import _SCRIPT

pytestmark = pytest.mark.timeout(90)


def test_a_worker_forked_by_a_real_driver_keeps_its_threads_hooks_and_unflushed_file(tmp_path):
    (tmp_path / "script.py").write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "CLOUD_ELASTIC_FORKSERVER_PARENT"}
    env["CLOUD_ELASTIC_LOCAL_FORKSERVER"] = "1"
    done = subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "run", "--verbose", "-np", "1", "-H",
                           "localhost:1", sys.executable, "script.py", "code", str(tmp_path / "out.txt")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=80)
    assert "forked localhost[0]" in done.stderr  # it went through the fork server
    assert done.returncode != 0 and "exited with code 3" in done.stderr, done.stderr[-2000:]
    lines = [line.split("> ", 1)[-1] for line in done.stdout.splitlines() if "> " in line]
    assert lines[-3:] == ["main done", "thread done", "exit hook"], done.stdout
    assert (tmp_path / "out.txt").read_text() == "kept " * 1000
