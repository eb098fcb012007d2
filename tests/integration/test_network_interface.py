"""A mistyped ``--network-interface`` as a user meets it (review s60 rvS finding 2): before, every round's group
failed in Gloo ("Unable to find address for: eht0") until --elastic-timeout (600 s by default) ended the job.

With workers on this machine (``-H localhost``) the command is refused at once; on hosts the CLI cannot look at
(a discovery script's, here this machine again), each worker exits with one line naming the interface and its
host, and the job ends on it, with no round formed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from tests.integration.harness import CLI, REPO, probe_cmd

pytestmark = pytest.mark.timeout(150)

ROUND_FORMED = re.compile(r"round \d+ formed")


def test_an_interface_this_machine_lacks_is_refused_at_start_with_local_hosts() -> None:
    result = subprocess.run([*CLI, "run", "-np", "2", "-H", "localhost:2", "--network-interface", "eht0",
                             sys.executable, "-c", "pass"], cwd=REPO, capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr[-3000:])
    assert lines[0].startswith("cloud-elastic: error: --network-interface 'eht0': this machine (-H localhost) "
                               "has no network interface of that name (it has: "), lines


def test_workers_on_a_host_without_the_interface_end_the_job_naming_it_and_the_host(jobs, tmp_path) -> None:
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")  # a script's hosts are not looked at before the start
    script.chmod(0o755)
    started = time.monotonic()
    job = jobs(["run", "-np", "2", "--host-discovery-script", str(script), "--network-interface", "eht0",
                *probe_cmd("--steps", "3")])
    assert job.finish(timeout=120) == 1, job.output()
    took = time.monotonic() - started
    last = job.lines[-1]
    assert "failed: all workers failed; last: worker localhost[" in last, job.output()
    assert ("exited with code 1: --network-interface 'eht0': host localhost has no network interface of that name "
            "(it has: ") in last, last
    assert not [line for line in job.lines if "Unable to find address" in line or ROUND_FORMED.search(line)], \
        job.output()
    assert took < 90, took  # not --elastic-timeout's 600 s of failing rounds
