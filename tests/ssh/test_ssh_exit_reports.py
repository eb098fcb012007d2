"""Over SSH, a rank that exits after training while the driver is away is judged by its exit report.

The job: both workers finish training; the driver is SIGKILLed; rank 1 then exits 0 (its wrapper's marker line goes
to a dead connection); the same command, run again, adopts rank 0 and fetches rank 1's exit report from its host
over ssh, and the job succeeds (before: it failed, "rank 1 left no exit code (killed, or on another host)").
(It takes 30-80 s on a loaded 2-core machine: two torch workers over ssh.) The seam alone, against the same sshd
(seconds, no torch): the wrapper completes the report a worker left with its
exact exit code, and the restarted driver's fetch reads it; an unreachable host, a garbled or an oversized report
leave the code unknown, never 0. A non-zero code failing the job naming its rank: tests/unit/test_job_adoption.py.
"""

from __future__ import annotations

import json
import os
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


def test_a_remote_rank_that_exited_0_while_the_driver_was_away_lets_the_restarted_job_succeed(sshd, marker, tmp_path):
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
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    jobs = [Job(args, env=env)]
    try:
        jobs[0].wait_for(lambda j: len([e for e in _events(events) if e["kind"] == "done"]) == 2, timeout=90,
                         what="both ranks past their training function")
        record = json.loads((tmp_path / "run" / "cloud-elastic" / jobs[0].job_id() / "adopt.json").read_text())
        rank1 = next(w["handle"]["nonce"] for w in record["workers"] if w["host"] == "127.0.0.3")
        os.kill(jobs[0].proc.pid, signal.SIGKILL)
        jobs[0].proc.wait()
        Path(f"{gate}.1").touch()
        wait_gone(rank1, 20)  # rank 1 and its wrapper have exited: its marker line went nowhere
        jobs.append(Job(args, env=env))
        jobs[1].wait_for(lambda j: "adopted 1 running worker(s)" in j.output(), timeout=30, what="adoption")
        Path(f"{gate}.0").touch()
        assert jobs[1].finish(30) == 0, jobs[1].output()
        out = jobs[1].output()
        assert "rank 1 (127.0.0.3[0]#2) of round 1 had exited with code 0" in out, out
        assert "launched worker" not in out and "resumed from the checkpoint" not in out, out
        assert sorted((events / "final.txt").read_text().splitlines()) == ["rank 0 step 3", "rank 1 step 3"]
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
