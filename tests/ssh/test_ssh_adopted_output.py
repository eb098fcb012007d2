"""Over SSH, a driver restarted within ``--driver-grace`` shows its adopted workers' output, as the dead one did.

The remote wrapper keeps what its worker prints while no driver reads it (the newest MiB) and relays it, then
everything after, on the restarted driver's attach connection: the same checks as for local workers
(``tests/integration/test_adopted_output.py``).
"""

from __future__ import annotations

import sys

import pytest
from ssh_support import forwarded_env, wait_gone

from tests.integration.harness import Job
from tests.integration.test_adopted_output import check_relayed, kill_and_print_detached, probe_args

pytestmark = [pytest.mark.ssh, pytest.mark.integration, pytest.mark.timeout(240)]


def test_a_restarted_driver_shows_what_remote_workers_printed_while_it_was_away_and_after(sshd, marker, tmp_path):
    cfg = sshd.config
    (tmp_path / "run").mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    gate = tmp_path / "burst"
    args = ["run", "-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1", "--force-ssh", "--ssh-port", str(cfg.port),
            "--ssh-identity-file", cfg.identity_file, "--ssh-user", cfg.user,
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--driver-grace", "60",
            "-x", f"CETEST_MARKER={marker}", *[a for name in forwarded_env() for a in ("-x", name)]]
    for option in cfg.extra_options:
        args += ["--ssh-option", option]
    args += probe_args(marks, gate, "127.0.0.3")
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    first = Job(args, env=env)
    second = None
    try:
        before, at_death, detached = kill_and_print_detached(first, marks, gate)
        second = Job(args, env=env)
        assert second.finish(180) == 0, second.output()
        assert "adopted 2 running worker(s)" in second.output(), second.output()
        check_relayed(second.lines, before, at_death, detached, "127.0.0.3", "cloud-elastic remote:")
        wait_gone(marker, 20)
    finally:
        for job in (first, second):
            if job is not None and job.proc.poll() is None:
                job.kill()
        print(first.output()[-20000:], file=sys.stderr)
        if second is not None:
            print(second.output()[-20000:], file=sys.stderr)
