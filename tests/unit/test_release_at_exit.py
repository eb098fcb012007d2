"""A round switch's release of the old group (``Reaper.release``, its destructor 1 s later on a timer thread) whose
timer fires just before the worker's exit hook: the hook must wait for that destructor, which runs in torch's C++
with the GIL let go, or end the process with its exit status; the interpreter finalizing under it dies of SIGABRT
("terminate called without an active exception") after a job that had succeeded (a clean-clone run of stop 58:
rank 0 of test_sigterm's graceful-leave job, after its last step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(150)  # a fresh interpreter importing torch: 26 s at load 18

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import builtins, time
from datetime import timedelta
import torch.distributed as dist
from tests.unit.test_next_group_cancel import Ctx

server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
ctx = Ctx(server.port)

class SlowToDestroy:  # the old round's group: its destructor spends 2 s in torch's C++, the GIL let go
    backend = "gloo"
    def __del__(self):
        try:
            server.wait(["never"], timedelta(seconds=2))
        except Exception:
            pass
        print("destroyed", flush=True)

ctx._reaper.release(SlowToDestroy(), after_s=0.5)
time.sleep(0.8)  # the timer fired: its destructor runs now
print("busy", ctx._reaper.busy(), flush=True)
ctx._at_exit()  # the worker's exit hook
print("hook returned", flush=True)

class SlowFinalization:  # the interpreter's teardown takes a while, as under load
    def __del__(self):
        time.sleep(3)
builtins.keep = SlowFinalization()
'''


def test_a_release_whose_timer_fired_before_the_exit_hook_is_waited_for_and_the_process_exits_cleanly():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=140)
    out = proc.stdout + proc.stderr
    assert "terminate called" not in out and proc.returncode == 0, out
    assert "busy True" in proc.stdout, out  # the running destructor is seen
    assert proc.stdout.index("destroyed") < proc.stdout.index("hook returned"), out  # and waited for by the hook
