"""The provider work through the real CLI: ``run --aws-asg`` against moto, the example plugin,
``cloud-elastic providers`` and ``cloud-elastic discover``.

The run tests start real workers: moto's subnet is mapped onto loopback with
``--address-map``, so the driver's local launcher starts the "cloud" workers
on this machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.emulator.moto_env import make_group, set_member
from tests.integration.conftest import jobs  # noqa: F401  (the fixture that kills what a test leaves running)
from tests.integration.harness import REPO, probe_cmd

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(150)]

CLI = [sys.executable, "-m", "cloud_elastic.cli"]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _local(ip: str, net: str) -> str:
    return f"127.0.{net}.{ip.rsplit('.', 1)[1]}"


def test_run_with_aws_asg_trains_on_the_group_and_drains_a_terminating_instance(aws, jobs):
    members = make_group(aws.url, "run-asg", size=3, instance_type="g4dn.xlarge", cidr="10.80.1.0/24")
    hosts = [_local(m["ip"], "80") for m in members]
    job = jobs([
        "run", "-np", "3", "--min-np", "1", "--discovery-interval", "0.3",
        "--aws-asg", "run-asg", "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url,
        "--address-map", "10.80.1.0/24=127.0.80.0/24",
        # --min-resets 1: it trains on past step 60 until the drain has happened (on a loaded machine the
        # 60 steps once ended before discovery saw the lifecycle state, and the job had nothing to drain).
        *probe_cmd("--steps", "60", "--min-resets", "1"),
    ])
    job.wait_event("commit", rank=0, step=5, timeout=90)
    # One GPU per g4dn.xlarge: one worker on each discovered instance, started at its mapped address.
    assert sorted(e["worker"].split("[")[0] for e in job.of("hello")) == sorted(hosts)  # ids are host[slot]#n

    set_member("run-asg", members[2]["id"], lifecycle="Terminating:Wait")  # a scale-in with a lifecycle hook
    # The survivors' reset at size 2, not a commit after it: past --steps and --min-resets the job completes at
    # that reset, with no commit at size 2 (seen once, when discovery saw the lifecycle state only after step 60).
    job.wait_event("reset", size=2, timeout=60)
    assert job.finish() == 0, job.output()

    assert f"host {hosts[2]} is draining (Terminating:Wait)" in job.output()
    resets = job.of("reset")
    assert resets and all(r["executed"] == r["step"] for r in resets), f"survivors rolled back: {resets}"
    done = job.of("done")
    assert len(done) == 2 and len({e["step"] for e in done}) == 1 and done[0]["step"] >= 60, done
    assert len({e["checksum"] for e in done}) == 1


def test_run_with_an_asg_that_does_not_exist_fails_at_once_with_one_line(aws):
    result = _cli("run", "-np", "1", "--aws-asg", "no-such-asg", "--aws-region", "us-east-1",
                  "--aws-endpoint-url", aws.url, *probe_cmd())
    assert result.returncode != 0
    assert "AWS Auto Scaling group 'no-such-asg' not found in region us-east-1" in result.stderr + result.stdout


def test_the_example_plugin_is_found_through_its_entry_point_and_runs_a_job(jobs, tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps({"ready": {"127.0.0.1": 1, "127.0.0.2": 1}}))
    listing = _cli("providers")
    assert listing.returncode == 0 and "\nhostsfile\n" in listing.stdout and "example plugin" in listing.stdout

    job = jobs(["run", "-np", "2", "--provider", "hostsfile", "-o", f"path={hosts}", *probe_cmd("--steps", "10")])
    assert job.finish() == 0, job.output()
    done = job.of("done")
    assert len(done) == 2 and len({e["checksum"] for e in done}) == 1


def test_discover_prints_what_the_driver_would_see_as_table_and_json(aws):
    members = make_group(aws.url, "discover-asg", size=2, instance_type="g5.12xlarge", cidr="10.81.1.0/24")
    set_member("discover-asg", members[1]["id"], health="Unhealthy")
    flags = ["--aws-asg", "discover-asg", "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url]

    table = _cli("discover", *flags)
    assert table.returncode == 0, table.stderr
    rows = [line.split() for line in table.stdout.splitlines()]
    assert [members[0]["ip"], "ready", "4"] in rows
    assert [members[1]["ip"], "draining", "-", "Unhealthy"] in rows

    as_json = _cli("discover", *flags, "--json", "--slots-per-host", "2")
    assert json.loads(as_json.stdout) == {
        "provider": "aws", "ready": {members[0]["ip"]: 2},
        "draining": {members[1]["ip"]: {"reason": "Unhealthy", "deadline": None}}, "total_slots": 2,
    }


def test_discover_failure_exits_1_with_a_one_line_error(aws):
    result = _cli("discover", "--aws-asg", "nope", "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        "cloud-elastic discover: error: AWS Auto Scaling group 'nope' not found in region us-east-1"
    )


def test_help_and_a_static_run_import_no_cloud_sdk():
    code = (
        "import sys, runpy\n"
        "sys.argv = ['cloud-elastic', '--help']\n"
        "try:\n    runpy.run_module('cloud_elastic.cli', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "from cloud_elastic.providers.selection import parse_discovery_args, build_discovery\n"
        "build_discovery(parse_discovery_args(['-H', '127.0.0.1:2'])).find()\n"
        "sdk = ('boto3', 'botocore', 'google', 'azure', 'ibm_vpc', 'ibm_cloud_sdk_core')\n"
        "print('SDKS', sorted(m for m in sys.modules if m.split('.')[0] in sdk))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "SDKS []"
