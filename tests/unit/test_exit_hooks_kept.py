"""A worker whose script ended while a group formation still ran in torch keeps its script's exit hooks and the
files it left open (cloud_elastic.worker.exiting). Review rv8 of 668bf6b: the exit hook gave a formation 2 s, then
ended the process with os._exit: a rank 0 that had succeeded lost its metrics file (0 of 150 lines) and the exit
hook it registered before hvd.init() (an upload) never ran.

The script, in a process of its own: its exit status is certain (as under the local fork server), it registers
an exit hook before hvd.init() and writes a metrics file it never closes, and a formation waits in torch for 4 s
at its exit (like Gloo connecting to a peer that left).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.unit.test_round_group import _EXIT_WHILE_FORMING

pytestmark = pytest.mark.timeout(120)

# test_round_group's worker exiting while a formation waits in torch (here 4 s), after an exit hook and a metrics
# file of the script's own; the budget (argv[2], 0: the default) is set before the script ends.
SCRIPT = """
import atexit, os, sys
from cloud_elastic.worker import exiting
from cloud_elastic.worker.link import driver_link

out, budget = sys.argv[1], float(sys.argv[2])
atexit.register(lambda: open(os.path.join(out, "hook_ran"), "w").write("yes"))  # before hvd.init(): an upload
metrics = open(os.path.join(out, "metrics.txt"), "w")
for step in range(100):
    metrics.write(f"step {step}\\n")  # buffered, never closed: finalization would flush it
""" + _EXIT_WHILE_FORMING.replace("seconds=2)", "seconds=4)") + """
if budget:
    exiting.EXIT_WAIT_S = budget
driver_link.note_exit_code(0)  # the script returned: what the fork server notes
"""


def run(tmp_path, budget: float) -> subprocess.CompletedProcess:
    script = tmp_path / "exit_while_forming.py"
    assert "seconds=4)" in SCRIPT
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), str(budget)], capture_output=True, text=True,
                          timeout=100)
    assert "gave up:" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "hook_ran").exists(), "the script's exit hook did not run:\n" + proc.stderr[-2000:]
    assert (tmp_path / "metrics.txt").read_text().count("\n") == 100, proc.stderr[-2000:]
    return proc


def test_a_formation_that_ends_within_the_exit_budget_leaves_a_normal_exit(tmp_path) -> None:
    proc = run(tmp_path, 0)  # the default budget, 10 s: the 4 s formation ends within it
    assert "without finalizing" not in proc.stderr, proc.stderr[-2000:]


def test_past_the_budget_the_scripts_exit_hooks_run_and_its_files_are_flushed_before_os_exit(tmp_path) -> None:
    proc = run(tmp_path, 1.0)  # the formation outlasts the budget and the script's own exit hook
    assert "exiting with status 0 without finalizing the interpreter" in proc.stderr, proc.stderr[-2000:]
