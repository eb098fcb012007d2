"""A driver restarted within ``--driver-grace`` shows its adopted workers' output, as the dead one did.

The driver is SIGKILLed mid-training and run again once the workers have printed more lines with nobody
reading them. The restarted driver's output then carries, with each worker's rank prefix, the lines printed
while no driver was attached and every line printed after: none lost, none twice, in order. A worker that
printed more than the bound meanwhile shows the newest MiB of it after one line saying how much was dropped.
(``tests/ssh/test_ssh_adopted_output.py`` runs the same over SSH.)
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
BURST_BYTES = 3 * KEEP_BYTES
_STEP = re.compile(r"^\[(\d+)\]<([^>]*)> STEP (\d+) (\d+)$")


def probe_args(marks: Path, gate: Path, loud_host: str) -> list[str]:
    """The probe's command: STEP lines, and a burst of ``BURST_BYTES`` from the worker on ``loud_host``."""
    return [sys.executable, str(PROBE), str(marks), "--steps", str(STEPS), "--burst-gate", str(gate),
            "--burst-bytes", str(BURST_BYTES), "--burst-slot", loud_host]


def _steps(lines: list[str]) -> dict[str, list[tuple[int, int]]]:
    """Per worker label: the (rank prefix, step) of each STEP line, in the order the driver printed them."""
    out: dict[str, list[tuple[int, int]]] = {}
    for line in lines:
        m = _STEP.match(line)
        if m:
            assert m.group(1) == m.group(3), f"a line under another rank's prefix: {line}"
            out.setdefault(m.group(2), []).append((int(m.group(1)), int(m.group(4))))
    return out


def _detached_step(directory: Path, workers: int = 2) -> int:
    """The least step the workers have reached (from their own files, read while no driver shows their output)."""
    seen = [int(p.read_text() or 0) for p in directory.glob("*.step")]
    return min(seen) if len(seen) == workers else 0


def kill_and_print_detached(first, marks: Path, gate: Path) -> tuple[dict, int, int]:
    """Once each worker showed ten steps: SIGKILL the driver, let the workers print fifteen steps more and one of
    them its burst. Returns what the dead driver showed (``_steps``), the newest step a worker had counted once
    the driver was dead, and the step both workers reached."""
    first.wait_for(lambda j: len(_steps(j.lines)) == 2 and all(len(s) >= 10 for s in _steps(j.lines).values()),
                   timeout=90, what="ten steps of each worker")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    at_death = max(int(p.read_text() or 0) for p in marks.glob("*.step"))
    before = _steps(first.lines)
    last_seen = max(seen[-1][1] for seen in before.values())
    deadline = time.monotonic() + 30
    while _detached_step(marks) < last_seen + 15 and time.monotonic() < deadline:
        time.sleep(0.05)
    gate.touch()
    while not list(marks.glob("*.burst")) and time.monotonic() < deadline:
        time.sleep(0.05)
    detached = _detached_step(marks)
    assert detached >= last_seen + 15, (detached, last_seen)
    assert list(marks.glob("*.burst")), "the worker did not print its burst"
    return before, at_death, detached


def check_relayed(lines: list[str], before: dict, at_death: int, detached: int, loud_host: str,
                  dropped_words: str) -> None:
    """What the restarted driver showed (``lines``): each worker's STEP lines under its rank prefix, none twice,
    in order, none missing from those printed once the dead driver was gone (after ``at_death``) to the end; the
    loud worker's burst: one line with ``dropped_words`` and the bytes dropped, then the newest lines, in order."""
    after = _steps(lines)
    assert set(after) == set(before), (sorted(after), sorted(before))
    for label, seen in after.items():
        rank = before[label][0][0]
        assert {r for r, _ in seen} == {rank}, f"{label}: its rank prefix changed"
        steps = [s for _, s in seen]
        assert steps == sorted(set(steps)), f"{label}: a line twice or out of order: {steps}"
        assert steps[-1] == STEPS and f"[{rank}]<{label}> FINISHED {rank}" in lines, f"{label}: {steps[-5:]}"
        # Every line printed once the driver was dead: while no driver read them (up to `detached`) and after the
        # restart. Those it had not shown when it died are lost with it (docs/checkpoints.md): in its pipe, over
        # SSH also in its connection and in the moment the wrapper takes to see the connection's stdin end. A
        # worker counts a step after printing its line, so up to `at_death` + 1 may have been printed before the
        # death; `at_death` + 2 came a step's sleep (0.1 s) after it. The loud worker's lines were pushed out by
        # its burst but those after it.
        first_kept = steps[0] if label.startswith(loud_host) else at_death + 2
        assert label.startswith(loud_host) or first_kept <= detached - 5, (label, first_kept, detached)
        assert steps[steps.index(first_kept):] == list(range(first_kept, STEPS + 1)), (label, steps)
    loud = next(label for label in after if label.startswith(loud_host))
    dropped = [line for line in lines if f"<{loud}> {dropped_words}" in line and "dropped" in line]
    assert len(dropped) == 1, dropped
    count = int(re.search(r": (\d+) bytes of ", dropped[0]).group(1))
    bursts = [int(line.split()[2]) for line in lines if re.match(rf"^\[\d+\]<{re.escape(loud)}> BURST \d", line)]
    total = next(int(line.rsplit(" ", 1)[1]) for line in lines if f"<{loud}> BURST END" in line)
    assert bursts and bursts == list(range(bursts[0], total)), "the kept lines are not the newest, in order"
    kept = sum(len(f"BURST {n:07d} ") + 81 for n in bursts)
    assert KEEP_BYTES // 2 < kept <= KEEP_BYTES and count >= BURST_BYTES - KEEP_BYTES, (kept, count)
    assert lines.index(dropped[0]) < min(i for i, line in enumerate(lines) if f"<{loud}> BURST " in line)


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "plain"])
def test_a_restarted_driver_shows_what_adopted_workers_printed_while_it_was_away_and_after(jobs, tmp_path, forked):
    """Forked by the driver's fork server, or started plainly (a wrapper script, a GPU machine)."""
    (tmp_path / "run").mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    gate = tmp_path / "burst"
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run"), **({} if forked else {"CLOUD_ELASTIC_LOCAL_FORKSERVER": "0"})}
    args = ["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--driver-grace", "60", *probe_args(marks, gate, "127.0.0.2")]
    first = jobs(args, env=env)
    before, at_death, detached = kill_and_print_detached(first, marks, gate)
    job_id = first.job_id()

    second = jobs(args, env=env)
    code = second.finish(120)
    # Started plainly, an adopted worker that ends well leaves no exit code a driver can read (a plain
    # interpreter tells no exit hook its code: docs/checkpoints.md), so that job ends failed. Its output is
    # what this test is about.
    assert code == 0 or (not forked and "ended without saying its exit code" in second.output()), second.output()
    assert "adopted 2 running worker(s)" in second.output(), second.output()
    check_relayed(second.lines, before, at_death, detached, "127.0.0.2", "cloud-elastic: worker")
    assert not processes_of_job(job_id), "a worker outlived the job"
    assert not list((tmp_path / "run").rglob(".out-*")), "kept output left behind"


def test_a_forked_child_of_an_adopted_worker_does_not_take_the_worker_s_output_from_the_restarted_driver(
        jobs, tmp_path):
    """A worker with children forked from it that print all along (DataLoader workers, a logging helper): the
    restarted driver shows every line the worker printed while it was away and after, to its end. The worker
    prints nothing for a few seconds after the restart, so that its children would try the driver's FIFO first
    if they could."""
    (tmp_path / "run").mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    pause = tmp_path / "pause"
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    args = ["run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--driver-grace", "60", sys.executable, str(PROBE), str(marks), "--steps", "80", "--children", "4",
            "--pause-gate", str(pause)]
    first = jobs(args, env=env)
    first.wait_for(lambda j: len(_steps(j.lines).get("127.0.0.1[0]", [])) >= 10, timeout=90, what="ten steps")
    assert any(" CHILD " in line for line in first.lines), "the children printed nothing"
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    at_death = max(int(p.read_text() or 0) for p in marks.glob("*.step"))
    last_seen = _steps(first.lines)["127.0.0.1[0]"][-1][1]
    deadline = time.monotonic() + 30
    while _detached_step(marks, 1) < last_seen + 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    pause.touch()
    detached = _detached_step(marks, 1)
    assert detached >= last_seen + 10, (detached, last_seen)
    job_id = first.job_id()

    second = jobs(args, env=env)
    second.wait_for(lambda j: _steps(j.lines).get("127.0.0.1[0]"), timeout=60, what="the kept lines relayed")
    time.sleep(2)
    pause.unlink()
    assert second.finish(120) == 0, second.output()
    steps = [s for _, s in _steps(second.lines)["127.0.0.1[0]"]]
    start = at_death + 2  # those printed before the driver died and not shown by it are lost with it (check_relayed)
    assert steps == sorted(set(steps)) and start <= detached - 5, (steps, detached)
    assert steps[steps.index(start):] == list(range(start, 81)), f"the worker's own lines went missing: {steps}"
    assert "[0]<127.0.0.1[0]> FINISHED 0" in second.lines, second.lines[-5:]
    # The children's own output went to /dev/null once their pipe broke (a child never creates, grows or follows
    # anything of the worker's: review s60 rvW); nothing of theirs is left in the runtime directory (below).
    assert not processes_of_job(job_id), "a worker outlived the job"
    assert not list((tmp_path / "run").rglob(".out-*")), "kept output left behind"
