"""The recovery benchmark's table says what happened to a repeat: a step after so long, a miss of the bound, or a
crash (the job exited), which is not a miss of a longer wait and must not read as one."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
try:
    import recovery  # noqa: E402  (benchmarks/ is not a package)
finally:
    sys.path.remove(str(BENCHMARKS))


def _row(line_start: str, text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {line_start} |"))


def test_a_crash_is_printed_as_the_crash_with_its_exit_code_not_as_a_miss():
    crash = "crashed (exit 1)"
    rows = {
        "crashing": {"recovery_s": [math.inf, 5.08, math.inf, math.inf], "steps_lost": [-1, 0, -1, -1],
                     "bound_s": 90.0, "crashes": [crash, None, crash, crash]},
        "slow": {"recovery_s": [math.inf, 1.0], "steps_lost": [-1, 0], "bound_s": 90.0, "crashes": [None, None]},
        "both": {"recovery_s": [math.inf, math.inf], "steps_lost": [-1, -1], "bound_s": 90.0,
                 "crashes": [crash, None]},
    }
    text = recovery.table(rows, "kill -9")
    assert _row("crashing", text) == "| crashing | crashed (exit 1) | crashed (exit 1) | crashed (exit 1), 5.08, " \
                                     "crashed (exit 1), crashed (exit 1) | –, 0, –, – |"
    assert _row("slow", text) == "| slow | 1.00 s | miss (> 90 s) | miss, 1.00 | –, 0 |"
    assert "no step (1 crashed, 1 past 90 s)" in _row("both", text)


@pytest.mark.timeout(60)
def test_a_job_that_exits_after_the_fault_is_recorded_as_crashed_with_its_exit_code(monkeypatch):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # what the fault hits

    class ExitsAfterTheFault:
        """A job whose three ranks step, then whose processes all exit with code 1 once rank 1 is killed."""

        cond = threading.Lock()
        logs = [{"rank": r, "step": 30, "pid": victim.pid if r == 1 else 0, "t": 0.0, "size": 3} for r in range(3)]
        waits = 0

        def wait(self, pred, timeout, what):
            self.waits += 1
            if self.waits == 1:
                return pred()
            raise recovery.JobExited(f"{what}: the job exited ([1])", [1])

        def stop(self):
            pass

    monkeypatch.setattr(recovery, "systems", lambda *a: {"torchft (defaults)": ExitsAfterTheFault})
    try:
        out = recovery.faults("/tmp", "kill", 1, 90.0, True, False)["torchft (defaults)"]
    finally:
        victim.kill()
        victim.wait()
    assert out["crashes"] == ["crashed (exit 1)"]
    assert "crashed (exit 1)" in recovery.table({"torchft (defaults)": out}, "kill -9")
