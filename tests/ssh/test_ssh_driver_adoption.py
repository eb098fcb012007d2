"""Over SSH, a driver restarted within ``--driver-grace`` adopts the remote workers: zero steps lost.

The first driver is SIGKILLed; its ssh connections die with it, and the remote
wrappers let their workers train on. The same command, run again, re-attaches
to each wrapper over a fresh ssh connection (``ssh_remote --attach``), the workers
re-register and finish the job in the same processes, and nothing is left on
any host: no worker, no wrapper, no attach relay, no local ssh client.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from ssh_support import forwarded_env, wait_gone

from tests.integration.harness import Job

pytestmark = [pytest.mark.ssh, pytest.mark.integration, pytest.mark.timeout(240)]

PROBE = Path(__file__).resolve().parents[1] / "integration" / "adopt_probe.py"
GRACE_S = 40.0
#: 10 s of training at 0.1 s a step: the driver dies at step 10, and its successor adopts the workers well before the
#: end (within a few seconds, over ssh, on a loaded machine).
STEPS = 100


def _events(directory: Path) -> dict[int, list[dict]]:
    return {int(p.stem): [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            for p in directory.glob("*.jsonl")}


def test_a_restarted_driver_adopts_remote_workers_and_nothing_is_left(sshd, marker, tmp_path):
    cfg = sshd.config
    (tmp_path / "run").mkdir()
    events = tmp_path / "events"
    events.mkdir()
    args = ["run", "-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1", "--force-ssh", "--ssh-port", str(cfg.port),
            "--ssh-identity-file", cfg.identity_file, "--ssh-user", cfg.user,
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "1", "--driver-grace", str(GRACE_S),
            "-x", f"CETEST_MARKER={marker}", *[a for name in forwarded_env() for a in ("-x", name)]]
    for option in cfg.extra_options:
        args += ["--ssh-option", option]
    args += [sys.executable, str(PROBE), str(events), "--steps", str(STEPS), "--step-sleep", "0.1"]
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    first = Job(args, env=env)
    second = None
    try:
        first.wait_for(lambda j: any(e["step"] >= 10 for e in j.of("commit")), timeout=120, what="training")
        job_id = first.job_id()
        record = json.loads((tmp_path / "run" / "cloud-elastic" / job_id / "adopt.json").read_text())
        nonces = [w["handle"]["nonce"] for w in record["workers"]]
        assert len(nonces) == 2 and all(w["handle"]["kind"] == "ssh" for w in record["workers"])
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()

        second = Job(args, env=env)
        assert second.finish(180) == 0, second.output()
        out = second.output()
        assert "adopted 2 running worker(s)" in out, out
        assert "resumed from the checkpoint" not in out and "launched worker" not in out, out

        seen = _events(events)
        assert len(seen) == 2, "the job was not finished by the two original remote workers"
        for pid, lines in seen.items():
            steps = [e["step"] for e in lines if e["kind"] == "commit"]
            assert steps == list(range(1, STEPS + 1)), (pid, steps)
            assert [e["step"] for e in lines if e["kind"] == "done"] == [STEPS]
        wait_gone(marker, 20)  # workers and their wrappers, the first driver's ssh clients
        for nonce in nonces:  # the attach relays and their ssh clients
            wait_gone(nonce, 20)
    finally:
        for job in (first, second):
            if job is not None and job.proc.poll() is None:
                job.kill()
        print(first.output())
        if second is not None:
            print(second.output())
