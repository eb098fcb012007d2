"""Over SSH, a rank that exits after training before a driver restart is judged by its exit code.

The job: both workers finish training; the driver is SIGKILLed; rank 1 then exits 0 (its wrapper's marker line goes
to a dead connection); the same command, run again, adopts rank 0 and fetches rank 1's exit report from its host
over ssh, and the job succeeds (before: it failed, "rank 1 left no exit code (killed, or on another host)"); rank 1
failing before the kill (the driver up) fails the restarted job naming it.
(It takes 30-80 s on a loaded 2-core machine: two torch workers over ssh.) The seam alone, against the same sshd
(seconds, no torch): the wrapper completes the report a worker left with its
exact exit code, and the restarted driver's fetch reads it; an unreachable host, a garbled or an oversized report
leave the code unknown, never 0; a worker gone before the restarted driver attaches has the code its report says.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from ssh_support import PYTHON, UNREACHABLE_HOST, forwarded_env, wait_gone, wait_until

from cloud_elastic.driver.launch.api import WorkerSpec
from cloud_elastic.driver.launch.ssh import SSHLauncher
from cloud_elastic.driver.restart.record import AdoptedWorker
from cloud_elastic.driver.restart.remote_reports import fetch_exit_reports
from tests.integration.harness import Job

#: Leaves argv[2] as its exit report where the wrapper says, then exits with argv[3].
LEAVES = ("import os, sys; open(os.environ['CLOUD_ELASTIC_EXIT_REPORT'], 'w').write(sys.argv[2]); "
          "sys.exit(int(sys.argv[3]))")

pytestmark = [pytest.mark.ssh, pytest.mark.integration, pytest.mark.timeout(150)]

PROBE = Path(__file__).with_name("per_rank_gate_probe.py")


def _events(directory: Path) -> list[dict]:
    return [json.loads(line) for p in directory.glob("*.jsonl") for line in p.read_text().splitlines() if line]


@pytest.mark.parametrize("before_kill", [False, True], ids=["exits-after-the-kill", "fails-before-the-kill"])
def test_a_remote_rank_that_exited_after_training_is_judged_by_its_exit_code_after_a_driver_restart(
        sshd, marker, tmp_path, before_kill):
    """exits-after-the-kill: rank 1 exits 0 while the driver is away; its report on its host lets the job succeed.
    fails-before-the-kill (the common order: a rank that saves nothing ends before rank 0's final save): rank 1's
    final work raises while the driver is up, which drops it from the adoption record; the restarted driver still
    fails the job naming it (by the code the dead driver saw), and never as 'left no exit code'."""
    cfg = sshd.config
    (tmp_path / "run").mkdir()
    events = tmp_path / "events"
    events.mkdir()
    gate = tmp_path / "gate"
    args = ["run", "-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1", "--force-ssh", "--ssh-port", str(cfg.port),
            "--ssh-identity-file", cfg.identity_file, "--ssh-user", cfg.user, "--heartbeat-timeout", "2",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--driver-grace", "60",
            "-x", f"CETEST_MARKER={marker}", *[a for name in forwarded_env() for a in ("-x", name)]]
    args += [a for option in cfg.extra_options for a in ("--ssh-option", option)]
    args += [sys.executable, str(PROBE), str(events), str(gate), "--steps", "3"]
    args += ["--fail-rank", "1"] if before_kill else []
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    jobs = [Job(args, env=env)]
    try:
        jobs[0].wait_for(lambda j: len([e for e in _events(events) if e["kind"] == "done"]) == 2, timeout=90,
                         what="both ranks past their training function")
        adopt = tmp_path / "run" / "cloud-elastic" / jobs[0].job_id() / "adopt.json"
        rank1 = next(w["handle"]["nonce"] for w in json.loads(adopt.read_text())["workers"]
                     if w["host"] == "127.0.0.3")
        if before_kill:
            Path(f"{gate}.1").touch()
            wait_until(lambda: len(json.loads(adopt.read_text())["workers"]) == 1, 30, "rank 1's exit recorded")
        os.kill(jobs[0].proc.pid, signal.SIGKILL)
        jobs[0].proc.wait()
        Path(f"{gate}.1").touch()
        wait_gone(rank1, 20)  # rank 1 and its wrapper have exited: its marker line went nowhere
        jobs.append(Job(args, env=env))
        jobs[1].wait_for(lambda j: "adopted 1 running worker(s)" in j.output(), timeout=30, what="adoption")
        Path(f"{gate}.0").touch()
        assert jobs[1].finish(30) == (1 if before_kill else 0), jobs[1].output()
        out = jobs[1].output()
        # rank 1's worker number: #2, or a later one when a loaded machine gave #2 up before the first round
        if before_kill:
            assert re.search(r"rank 1 \(127\.0\.0\.3\[0\]#\d+\) exited with code 1 after its training function "
                             r"returned", out), out
        else:
            assert re.search(r"rank 1 \(127\.0\.0\.3\[0\]#\d+\) of round 1 had exited with code 0", out), out
        assert "left no exit code" not in out, out
        assert "launched worker" not in out and "resumed from the checkpoint" not in out, out
        assert "rank 0 step 3" in (events / "final.txt").read_text().splitlines()
        wait_gone(marker, 20)
    finally:
        for job in jobs:
            if job.proc.poll() is None:
                job.kill()
            print(job.output())


def _left(launcher: SSHLauncher, host: str, marker: str, report: str, code: int, seq: int
          ) -> tuple[AdoptedWorker, WorkerSpec]:
    """A worker on ``host`` that left ``report`` and exited ``code``; the adoption record's entry for it."""
    spec = WorkerSpec(worker_id=f"{host}[0]#{seq}", host=host, slot=0, command=(PYTHON, "-c", LEAVES, marker, report,
                      str(code)), env={**forwarded_env(), "CETEST_MARKER": marker}, secret="s3cret", cwd="/")
    proc = launcher.launch(spec, lambda line: None)
    wait_until(lambda: proc.poll() is not None, 20, "the worker's end")
    assert proc.poll().code == code
    return AdoptedWorker(spec.worker_id, host, 0, seq, proc.handle()), spec


@pytest.mark.timeout(60)
def test_the_restarted_driver_fetches_the_exact_codes_and_never_takes_an_unreadable_report_for_0(sshd, marker, caplog):
    report = json.dumps({"v": 1, "round": 4, "rank": 1, "code": None, "error": None})  # a plain interpreter's
    with SSHLauncher(sshd.config) as launcher:
        ok, spec = _left(launcher, "127.0.0.2", marker, report, 0, 1)
        failed, _ = _left(launcher, "127.0.0.3", marker, report.replace('"rank": 1', '"rank": 2'), 3, 2)
        garbled, _ = _left(launcher, "127.0.0.3", marker, '{"v": 1, "round": 4, "rank": 3, "code": "0"', 0, 3)
        big, _ = _left(launcher, "127.0.0.3", marker, report.replace('"rank": 1', '"rank": 4') + " " * 5000, 0, 4)
        lost = AdoptedWorker("127.0.0.9[0]#9", UNREACHABLE_HOST, 0, 9, {"kind": "ssh", "nonce": "ab12"})
        found = fetch_exit_reports([ok, failed, garbled, big, lost], 4, spec_for=lambda w: replace(spec, host=w.host),
                                   launcher_for=lambda host: launcher, connect_timeout_s=5)
        assert found == {1: (ok.worker_id, 0), 2: (failed.worker_id, 3)}
        assert fetch_exit_reports([ok], 5, spec_for=lambda w: replace(spec, host=w.host),
                                  launcher_for=lambda host: launcher, connect_timeout_s=5) == {}, \
            "a report of another round counts for nothing"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(garbled.worker_id in w and "not JSON" in w for w in warnings), warnings
    assert any(big.worker_id in w and "over 4096 bytes" in w for w in warnings), warnings
    assert any(UNREACHABLE_HOST in w and "stay unknown" in w for w in warnings), warnings


@pytest.mark.timeout(60)
def test_a_worker_that_ended_before_the_restarted_driver_attached_has_the_code_its_report_says(sshd, marker):
    """The restarted driver attaches to the wrappers of the workers it adopted; one whose worker ended in between
    used to be 'exited with code 1' whatever its report said (a job whose rank 0 saved and exited 0 failed)."""
    report = json.dumps({"v": 1, "round": 4, "rank": 0, "code": None, "error": None})
    with SSHLauncher(sshd.config) as launcher:
        ok, spec = _left(launcher, "127.0.0.2", marker, report, 0, 1)
        failed, _ = _left(launcher, "127.0.0.2", marker, report, 3, 2)
        silent, _ = _left(launcher, "127.0.0.2", marker, "not a report", 0, 3)  # garbled: it says no code
        statuses = []
        for worker in (ok, failed, silent):
            proc = launcher.attach(replace(spec, worker_id=worker.worker_id), worker.handle["nonce"], lambda line: None)
            wait_until(lambda: proc.poll() is not None, 20, "the attach to find the worker gone")
            statuses.append(proc.poll())
    assert [(s.code, s.known) for s in statuses[:2]] == [(0, True), (3, True)], statuses
    assert not statuses[2].known, "a worker that left no readable report was given a made-up exit code"
