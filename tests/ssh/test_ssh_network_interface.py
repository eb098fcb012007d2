"""A ``--network-interface`` the worker hosts lack, over ssh (review s60 rvS finding 2): each remote worker exits
with one line naming the interface and its host, which reaches the driver through ssh and is the job's reason;
no round is formed to fail in Gloo until --elastic-timeout.

The hosts come from a discovery script: the CLI refuses a missing interface at start only for ``-H`` hosts on
its own machine, and the test sshd's "remote" hosts (127.0.0.2/3) are those.
"""

from __future__ import annotations

import pytest

from ssh_support import wait_gone
from test_ssh_e2e import DriverRun

pytestmark = [pytest.mark.ssh, pytest.mark.integration, pytest.mark.timeout(180)]


def test_remote_workers_without_the_interface_end_the_job_naming_it_and_their_host(sshd, marker, tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho 127.0.0.2:1\necho 127.0.0.3:1\n")
    script.chmod(0o755)
    run = DriverRun(sshd, marker, "", "--host-discovery-script", str(script), "--network-interface", "eht0",
                    np=2, min_np=2, train=("--steps", "3"))
    try:
        assert run.finish(120) == 1, run.log()
        last = run.stderr[-1]
        assert "failed: all workers failed; last: worker 127.0.0." in last, run.log()
        assert "exited with code 1: --network-interface 'eht0': host 127.0.0." in last, last
        assert "has no network interface of that name (it has: " in last, last
        assert not [line for line in run.stderr + run.stdout if "Unable to find address" in line], run.log()
    finally:
        run.cleanup()
    wait_gone(marker, 15)
