"""A worker whose planned round's check failed on a silent peer still exits within the exit hook's budget.

A plan's group whose check failed is released, never retired (``rounds.next_group``: its connections cannot be told
from those of a round formed meanwhile). If its peer went silent (a preempted VM sends no RST), the check's
collective still waits in Gloo after its own deadline, until Gloo's timeout (300 s by default), and the group's
destructor waits for it. At exit every round is let go of, so the reaper shuts that group's connections down
(``Reaper.drain``): the destructor returns at once. Before (review s60 rvR), the exit hook ran that destructor on
the exiting thread and waited out Gloo's timeout (31 s here with a 30 s timeout), or, its timer having fired
already, waited its whole 10 s and let the interpreter finalize under it (SIGABRT after a job that had succeeded).

Real processes: A (rank 0, hosting the store) and B (rank 1), real WorkerContexts, store and Gloo, as in
``test_late_formation``. B stops itself (SIGSTOP) as soon as the plan's group formed on its side, before its check;
A's check times out after 3 s (its formation deadline; 30 s in one case, the exit then ends it). Gloo's timeout
is 30 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]

#: Most seconds from the script's end (the exit hook starts) to the process's exit. Measured: under 1 s with the
#: reaper shutting the group down; 10 s (the hook's whole budget) or Gloo's timeout (30 s) without.
EXIT_BOUND_S = 8.0

CHILD = r'''
import os, signal, sys, threading, time
from datetime import timedelta
import torch.distributed as dist
from cloud_elastic.protocol import NextRound, RankInfo
from cloud_elastic.worker.context import WorkerContext
from cloud_elastic.worker.settings import WorkerSettings

role, when = sys.argv[1], sys.argv[2]

def worker(port, rank, form_s):
    ctx = WorkerContext(WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address=f"127.0.0.1:{port}", job_id="frozen",
        worker_id=f"w{rank}", secret="s" * 64, backend="gloo", collective_timeout_s=30.0, group_form_timeout_s=form_s,
        malloc_tuning=False))
    ctx._store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=30))
    ctx.elastic_entered = True
    return ctx

def plan(ctx, rank):
    return ctx._start_next(NextRound(1, 2, RankInfo(rank, 2, 0, 1, rank, 2)))

if role == "A":
    import atexit
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    print("PORT", server.port, flush=True)
    # The check's deadline: 30 s, past the exit hook's 10 s; 6 s, within it, and far enough past the group's
    # formation and the second below that the check is still waiting when the script ends on a loaded machine
    # (3 s was not: a clean clone beside other jobs printed "check in flight: False").
    ctx = worker(server.port, 0, 60.0 if when == "during-long" else 6.0)
    atexit.register(ctx._at_exit)  # as WorkerContext.start() does
    server.wait(["B_ready"], timedelta(seconds=120))
    formed, made = threading.Event(), ctx._new_group
    def marked(store, info, publish=lambda pg: None):
        group = made(store, info, publish)
        formed.set()
        return group
    ctx._new_group = marked
    pending = plan(ctx, 0)
    if when.startswith("during"):  # the script ends while the plan's check still waits on the frozen peer
        assert formed.wait(120)
        time.sleep(1.0)
        print("check in flight:", not pending.done.is_set(), flush=True)
    else:  # the script ends once the failed group's destructor runs on the reaper's timer thread
        assert pending.done.wait(120)
        time.sleep(2.0)
        print("failed:", pending.failed, "destroying:", ctx._reaper.busy(), flush=True)
    print("SCRIPT END", flush=True)
    sys.exit(3)
else:
    ctx = worker(int(sys.argv[3]), 1, 20.0)
    made = ctx._new_group
    def frozen(store, info, publish=lambda pg: None):
        group = made(store, info, publish)
        os.kill(os.getpid(), signal.SIGSTOP)  # silent from now on, its connections open: no RST
        return group
    ctx._new_group = frozen
    ctx._store.set("B_ready", "1")
    plan(ctx, 1)
    time.sleep(600)
'''


def _run(when: str) -> tuple[int, float, str]:
    """Run A and B; A's exit status, the seconds from its script's end to its exit, and its output."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    a = subprocess.Popen([sys.executable, "-c", CHILD, "A", when], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    b = None
    lines: list[str] = []
    ended = None
    try:
        assert a.stdout is not None
        first = a.stdout.readline()
        lines.append(first)
        assert first.startswith("PORT"), first
        b = subprocess.Popen([sys.executable, "-c", CHILD, "B", when, first.split()[1]], cwd=REPO, env=env)
        for line in a.stdout:
            lines.append(line)
            if line.startswith("SCRIPT END"):
                ended = time.monotonic()
        rc = a.wait(60)
        exited = time.monotonic()
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()  # SIGKILL ends a stopped process too
                proc.wait(10)
    out = "".join(lines)
    assert ended is not None, out
    return rc, exited - ended, out


def test_a_worker_whose_plan_check_is_still_waiting_on_a_silent_peer_exits_within_the_exit_hooks_budget():
    rc, exit_s, out = _run("during")
    assert "check in flight: True" in out, out
    assert rc == 3 and "terminate called" not in out, out  # the script's own status, no SIGABRT
    assert exit_s < EXIT_BOUND_S, f"{exit_s:.1f} s from the script's end to the exit\n{out}"


def test_a_worker_whose_plan_check_would_wait_past_the_exit_hooks_budget_exits_within_it():
    """The check's deadline (30 s: the formation deadline, bounded by Gloo's timeout) is later than the exit hook's
    10 s: the check is ended as the worker exits (``NextGroupMixin._close_next``), not waited out."""
    rc, exit_s, out = _run("during-long")
    assert "check in flight: True" in out, out
    assert rc == 3 and "terminate called" not in out, out
    assert "still running in torch" not in out, out
    assert exit_s < EXIT_BOUND_S, f"{exit_s:.1f} s from the script's end to the exit\n{out}"


def test_a_worker_whose_failed_plan_group_is_being_destroyed_exits_within_the_exit_hooks_budget():
    rc, exit_s, out = _run("after")
    assert "failed: True destroying: True" in out, out
    assert rc == 3 and "terminate called" not in out, out
    assert "still being destroyed" not in out and "still running in torch" not in out, out
    assert exit_s < EXIT_BOUND_S, f"{exit_s:.1f} s from the script's end to the exit\n{out}"
