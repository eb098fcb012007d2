"""Over SSH, a SIGKILLed driver's remote workers train on for ``--driver-grace``, then nothing is left.

The remote wrapper used to stop its worker as soon as the ssh connection
dropped; with the grace it lets the worker train on (it exits by itself at the
end of the grace) and stops whatever is left a margin later. The same command
run again past the grace resumes the job from its checkpoint and finishes it.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from ssh_support import processes_with, wait_gone
from test_ssh_e2e import DriverRun, _worker_pid

pytestmark = [pytest.mark.ssh, pytest.mark.integration, pytest.mark.timeout(180)]

GRACE_S = 4.0


def test_remote_workers_outlive_a_killed_driver_for_the_grace_only_then_the_job_resumes(sshd, marker, tmp_path):
    (tmp_path / "run").mkdir()
    options = ("--driver-grace", str(GRACE_S), "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "1")
    # 400 steps take 8 s at least: more than the grace the orphans train for, few enough for the resumed run.
    train = ("--steps", "400", "--step-sleep", "0.02", "--log-every", "10")
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    run = DriverRun(sshd, marker, "127.0.0.2:1,127.0.0.3:1", *options, np=2, min_np=2, train=train, env=env)
    again = None
    try:
        run.wait_for("workers 2")
        remote = [_worker_pid(marker, host) for host in ("127.0.0.2", "127.0.0.3")]
        os.kill(run.proc.pid, signal.SIGKILL)
        run.finish(30)
        killed_at = time.monotonic()
        time.sleep(GRACE_S / 2)
        alive = {p.pid for p in processes_with(marker)}
        assert set(remote) <= alive, "the remote workers did not outlive their driver for the grace"
        # The workers stop themselves at the end of the grace; the wrapper 15 s later at the latest.
        wait_gone(marker, GRACE_S + 25)
        assert time.monotonic() - killed_at >= GRACE_S / 2

        # Past the grace the same command resumes from the checkpoint the workers left, not from step 0.
        again = DriverRun(sshd, marker, "127.0.0.2:1,127.0.0.3:1", *options, np=2, min_np=2, train=train, env=env)
        assert again.finish(150) == 0, again.log()
        resumed = re.search(r"resumed from the checkpoint of step (\d+)", "\n".join(again.stderr + again.stdout))
        assert resumed and int(resumed.group(1)) > 0, again.log()
        assert not again.saw("adopted"), again.log()
        wait_gone(marker, 20)
    finally:
        run.cleanup()
        print(run.log())
        if again is not None:
            again.cleanup()
            print(again.log())
