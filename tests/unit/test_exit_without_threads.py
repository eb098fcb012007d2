"""A worker exits cleanly where the interpreter starts no thread from an exit hook (Python 3.12.0 and 3.12.1:
"RuntimeError: can't create new thread at interpreter shutdown"; later releases start them again).

The exit hook (``ExitingMixin._at_exit``) lets go of the round's group through the reaper, which started threads:
on 3.12.1 the hook stopped at its first one with that exception, so the group was never destroyed before the
interpreter's teardown and the driver was never told the worker was exiting. Measured under 3.12.1 with the worker
started from scratch (as on a GPU machine, where the local fork server is off): a 2-worker job whose training
completed failed, both workers "stopped answering heartbeats after its training function returned" (rc 1); a
worker exiting while its plan's check waited on a silent peer printed the traceback from the formation's thread
and exited after 11.2 s, past the hook's 10 s. Now every thread the exit path would start falls back to the
exiting thread (``reclaim._started``; ``Reaper.drain`` destroys what is pending there, within its deadline).

These tests do what 3.12.1 does on any Python: an exit hook registered after the library's (so it runs first)
makes ``threading`` refuse every new thread. One more runs a worker under a real 3.12.1 where one is given
(``CLOUD_ELASTIC_TEST_PYTHON312``: an interpreter with torch and this project installed), and skips otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cloud_elastic.worker.rounds.groups import RoundGroup
from cloud_elastic.worker.rounds.reclaim import Reaper
from tests.integration import test_failed_plan_exit as failed_plan
from tests.unit.test_round_group import _Graceful, _Sockets

pytestmark = pytest.mark.timeout(150)

REPO = Path(__file__).resolve().parents[2]

REFUSED = "can't create new thread at interpreter shutdown"

#: Python code: from its call on, ``threading`` starts no thread, as 3.12.0-3.12.1 once the interpreter finalizes.
REFUSE_THREADS = f'''
def refuse_threads():
    import threading
    def refuse(*args, **kwargs):
        raise RuntimeError("{REFUSED}")
    for name in ("_start_new_thread", "_start_joinable_thread"):
        if hasattr(threading, name):
            setattr(threading, name, refuse)
'''

# A standalone worker with a real Gloo group (a group of one) ends its script; with "--refuse", threads are
# refused from the first exit hook on. say_exiting, the hook's last act, reports whether the reaper is done.
WORKER = REFUSE_THREADS + '''
import atexit, sys
from cloud_elastic.worker.context import WorkerContext
from cloud_elastic.worker.settings import WorkerSettings

ctx = WorkerContext(WorkerSettings(standalone=True, backend="gloo", malloc_tuning=False))
ctx.start()
assert ctx._group is not None and ctx._group.backend == "gloo"
said = ctx.say_exiting
ctx.say_exiting = lambda: (print("said exiting; reaper busy:", ctx._reaper.busy(), flush=True), said())
if "--refuse" in sys.argv:
    atexit.register(refuse_threads)  # registered after the library's hook: runs before it
print("SCRIPT END", flush=True)
'''


def _refuse_threads(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise RuntimeError(REFUSED)

    for name in ("_start_new_thread", "_start_joinable_thread"):
        if hasattr(threading, name):
            monkeypatch.setattr(threading, name, refuse)


def test_with_no_thread_to_be_had_releases_and_reclaims_are_destroyed_by_drain_on_the_exiting_thread(monkeypatch):
    reaper = Reaper(bound_s=5.0)
    destroyed: list[str] = []

    class Gloo:
        def __del__(self) -> None:
            destroyed.append(threading.current_thread().name)

    _refuse_threads(monkeypatch)
    graceful = _Graceful()
    reaper.release(RoundGroup(graceful, object(), None, "nccl"), after_s=60.0)  # raised RuntimeError before
    sockets = _Sockets()
    reaper.retire(RoundGroup(Gloo(), None, sockets, "gloo", size=2))  # raised RuntimeError before
    assert sockets.shutdowns == 1 and not destroyed  # abandoned at once; destroyed once the caller let go
    assert reaper.busy()
    started = time.monotonic()
    assert reaper.drain(timeout_s=5.0)
    me = threading.current_thread().name
    assert graceful.shutdowns == [me] and destroyed == [me]
    assert not reaper.busy() and time.monotonic() - started < 2.0


def test_with_no_thread_and_no_time_left_drain_keeps_the_group_and_says_it_is_not_done(monkeypatch):
    """Past its deadline drain destroys nothing more on the exiting thread: it reports the group as still to be
    destroyed (busy), and the exit hook then ends the process without the interpreter's finalization, which
    would destroy it, unbounded."""
    reaper = Reaper()
    graceful = _Graceful()
    _refuse_threads(monkeypatch)
    reaper.release(RoundGroup(graceful, object(), None, "nccl"), after_s=60.0)
    assert not reaper.drain(timeout_s=0.0)
    assert graceful.shutdowns == [] and reaper.busy()


def _worker(tmp_path, python: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "exit_without_threads.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([python, str(script), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_a_worker_with_a_group_exits_cleanly_when_no_thread_can_be_started_at_exit(tmp_path):
    """Before: "Exception ignored in atexit callback" with that RuntimeError, from Reaper.retire, and the hook
    stopped there: the group left to the interpreter's teardown, the driver never told the worker was exiting."""
    proc = _worker(tmp_path, sys.executable, "--refuse")
    assert "SCRIPT END" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert REFUSED not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    assert "said exiting; reaper busy: False" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_worker_whose_plan_check_waits_on_a_silent_peer_exits_within_budget_when_no_thread_can_be_started(
        monkeypatch):
    """test_failed_plan_exit's worker A, refused threads from its first exit hook on: the plan's formation thread
    releases its failed group as the exit hook runs. Before: that release raised on the formation's thread
    (traceback), the group was never destroyed, and the exit took past the hook's 10 s."""
    marker = "atexit.register(ctx._at_exit)  # as WorkerContext.start() does"
    assert marker in failed_plan.CHILD
    child = REFUSE_THREADS + failed_plan.CHILD.replace(marker, marker + "\n    atexit.register(refuse_threads)")
    monkeypatch.setattr(failed_plan, "CHILD", child)
    rc, exit_s, out = failed_plan._run("during")
    assert "check in flight: True" in out, out
    assert REFUSED not in out and "terminate called" not in out, out
    assert rc == 3, out  # the script's own status
    assert "still being destroyed" not in out and "still running in torch" not in out, out  # within the hook's 10 s
    # 6-7 s measured with 16 such processes at once (and this worker's twin without the refusal alike); a
    # destructor left to Gloo's timeout takes 30 s.
    assert exit_s < 15.0, f"{exit_s:.1f} s from the script's end to the exit\n{out}"


PYTHON312 = os.environ.get("CLOUD_ELASTIC_TEST_PYTHON312", "")


@pytest.mark.skipif(not (PYTHON312 and os.access(PYTHON312, os.X_OK)),
                    reason="CLOUD_ELASTIC_TEST_PYTHON312 names no Python 3.12.0/3.12.1 with torch and this project")
def test_under_a_real_python_3_12_1_a_worker_with_a_group_exits_cleanly(tmp_path):
    version = subprocess.run([PYTHON312, "-c", "import sys; print(sys.version_info[:3])"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    assert version in ("(3, 12, 0)", "(3, 12, 1)"), f"{PYTHON312} is Python {version}, not 3.12.0 or 3.12.1"
    proc = _worker(tmp_path, PYTHON312)
    assert REFUSED not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    assert "said exiting; reaper busy: False" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
