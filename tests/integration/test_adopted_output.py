"""A driver restarted within ``--driver-grace`` shows its adopted workers' output, as the dead one did.

The driver is SIGKILLed mid-training and run again once the workers have printed more lines with nobody
reading them. The restarted driver's output then carries, with each worker's rank prefix, the lines printed
while no driver was attached and every line printed after: none lost, none twice, in order. A worker that
printed more than the bound meanwhile shows the newest MiB of it after one line saying how much was dropped.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from cloud_elastic.worker.link.kept_output import KEEP_BYTES
from tests.integration.harness import processes_of_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PROBE = Path(__file__).with_name("output_probe.py")
STEPS = 150
_STEP = re.compile(r"^\[(\d+)\]<([^>]*)> STEP (\d+) (\d+)$")


def _steps(lines: list[str]) -> dict[str, list[tuple[int, int]]]:
    """Per worker label: the (rank prefix, step) of each STEP line, in the order the driver printed them."""
    out: dict[str, list[tuple[int, int]]] = {}
    for line in lines:
        m = _STEP.match(line)
        if m:
            assert m.group(1) == m.group(3), f"a line under another rank's prefix: {line}"
            out.setdefault(m.group(2), []).append((int(m.group(1)), int(m.group(4))))
    return out


def _detached_step(directory: Path) -> int:
    """The least step the workers have reached (from their own files, read while no driver shows their output)."""
    seen = [int(p.read_text() or 0) for p in directory.glob("*.step")]
    return min(seen) if len(seen) == 2 else 0


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "plain"])
def test_a_restarted_driver_shows_what_adopted_workers_printed_while_it_was_away_and_after(jobs, tmp_path, forked):
    """Forked by the driver's fork server, or started plainly (a wrapper script, a GPU machine)."""
    (tmp_path / "run").mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    gate = tmp_path / "burst"
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run"), **({} if forked else {"CLOUD_ELASTIC_LOCAL_FORKSERVER": "0"})}
    burst_bytes = 3 * KEEP_BYTES
    args = ["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--driver-grace", "60", sys.executable, str(PROBE), str(marks), "--steps", str(STEPS),
            "--burst-gate", str(gate), "--burst-bytes", str(burst_bytes), "--burst-slot", "127.0.0.2"]
    first = jobs(args, env=env)
    first.wait_for(lambda j: all(len(s) >= 10 for s in _steps(j.lines).values()) and len(_steps(j.lines)) == 2,
                   timeout=90, what="ten steps of each worker")
    job_id = first.job_id()
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    before = _steps(first.lines)
    last_seen = {label: seen[-1][1] for label, seen in before.items()}
    # Nobody reads the workers' output now: wait for fifteen more steps of each, then for the burst.
    started = _detached_step(marks)
    deadline = time.monotonic() + 30
    while _detached_step(marks) < max(last_seen.values()) + 15 and time.monotonic() < deadline:
        time.sleep(0.05)
    gate.touch()
    while not list(marks.glob("*.burst")) and time.monotonic() < deadline:
        time.sleep(0.05)
    detached = _detached_step(marks)
    assert detached >= max(last_seen.values()) + 15, (started, detached, last_seen)
    assert list(marks.glob("*.burst")), "the worker did not print its burst"

    second = jobs(args, env=env)
    code = second.finish(120)
    # Started plainly, an adopted worker that ends well leaves no exit code a driver can read (a plain
    # interpreter tells no exit hook its code: docs/checkpoints.md), so that job ends failed. Its output is
    # what this test is about.
    assert code == 0 or (not forked and "ended without saying its exit code" in second.output()), second.output()
    out = second.output()
    assert "adopted 2 running worker(s)" in out, out
    after = _steps(second.lines)
    assert set(after) == set(before), (sorted(after), sorted(before))
    for label, seen in after.items():
        rank = before[label][0][0]
        assert {r for r, _ in seen} == {rank}, f"{label}: its rank prefix changed"
        steps = [s for _, s in seen]
        assert steps == sorted(set(steps)), f"{label}: a line twice or out of order: {steps}"
        assert steps[-1] == STEPS and f"[{rank}]<{label}> FINISHED {rank}" in second.lines, f"{label}: {steps[-5:]}"
        # Every line after the few that were in the dead driver's pipe when it died, none missing: those
        # printed while no driver read them (up to `detached`), and those printed after the restart.
        first_kept = steps[0] if label.startswith("127.0.0.2") else last_seen[label] + 3
        assert first_kept <= detached - 5 or label.startswith("127.0.0.2"), (label, first_kept, detached)
        assert steps[steps.index(first_kept):] == list(range(first_kept, STEPS + 1)), (label, steps)
    quiet = next(label for label in after if label.startswith("127.0.0.1"))
    assert after[quiet][0][1] <= last_seen[quiet] + 3, (after[quiet][:3], last_seen[quiet])
    # The worker that printed 3 MiB while detached: one line saying how much was dropped, then the newest.
    loud = next(label for label in after if label.startswith("127.0.0.2"))
    dropped = [line for line in second.lines if f"<{loud}> cloud-elastic: worker" in line and "dropped" in line]
    assert len(dropped) == 1, dropped
    count = int(re.search(r": (\d+) bytes of its output", dropped[0]).group(1))
    bursts = [int(line.split()[2]) for line in second.lines if re.match(rf"^\[\d+\]<{re.escape(loud)}> BURST \d", line)]
    total = next(int(line.rsplit(" ", 1)[1]) for line in second.lines if f"<{loud}> BURST END" in line)
    assert bursts and bursts == list(range(bursts[0], total)), "the kept lines are not the newest, in order"
    kept = sum(len(f"BURST {n:07d} ") + 81 for n in bursts)
    assert KEEP_BYTES // 2 < kept <= KEEP_BYTES and count >= burst_bytes - KEEP_BYTES, (kept, count)
    assert second.lines.index(dropped[0]) < min(i for i, line in enumerate(second.lines) if f"<{loud}> BURST " in line)
    assert not processes_of_job(job_id), "a worker outlived the job"
    assert not list((tmp_path / "run").rglob(".out-*")), "kept output left behind"
