"""``cloud-elastic run --ray-address``: the job's command runs in Ray actors, one worker per slot."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.ray.conftest import REPO

# Generous bounds: a Ray cluster starts on a machine that may be shared.
pytestmark = [pytest.mark.ray, pytest.mark.timeout(360)]


def test_the_command_runs_as_one_worker_per_node_and_the_job_succeeds(nodes):
    nodes.add(2)
    out = subprocess.run(
        [sys.executable, "-m", "cloud_elastic.cli", "run", "--ray-address", nodes.cluster.address, "-np", "2",
         sys.executable, str(REPO / "examples" / "elastic_anywhere.py"), "--steps", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "succeeded: training completed on 2 worker(s)" in out.stderr, out.stderr[-2000:]


def test_ray_address_with_another_host_source_is_a_one_line_flag_error():
    out = subprocess.run(
        [sys.executable, "-m", "cloud_elastic.cli", "run", "--ray-address", "auto", "-H", "h:1", "-np", "1",
         "python", "x.py"],
        cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "cloud-elastic: error: --ray-address is the host source: drop -H, --host-discovery-script, --provider "
        "and the cloud group flags"]


@pytest.mark.parametrize(("flags", "line"), [(["--ray-use-gpu"], "--ray-use-gpu needs --ray-address"),
                                             (["--ray-cpus-per-slot", "8"], "--ray-cpus-per-slot needs --ray-address")])
def test_a_ray_flag_without_ray_address_is_a_one_line_flag_error_not_ignored(flags, line):
    out = subprocess.run(
        [sys.executable, "-m", "cloud_elastic.cli", "run", "-H", "h:1", *flags, "-np", "1", "python", "x.py"],
        cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert (out.returncode, out.stderr.strip().splitlines()) == (2, [f"cloud-elastic: error: {line}"])


@pytest.mark.parametrize(("address", "env"), [("127.0.0.1:1", {}), ("auto", {"RAY_ADDRESS": "127.0.0.1:1"})],
                         ids=["address", "auto-stale"])
def test_a_ray_address_where_no_cluster_runs_is_a_one_line_error_not_a_hang(address, env):
    # ray.init alone retried such an address for minutes (165 s, then the reviewer's timeout).
    out = subprocess.run(
        [sys.executable, "-m", "cloud_elastic.cli", "run", "--ray-address", address, "-np", "1", "python", "x.py"],
        cwd=REPO, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL, env={**os.environ, **env},
    )
    lines = out.stderr.strip().splitlines()
    assert (out.returncode, len(lines)) == (2, 1), out.stderr[-2000:]
    assert lines[0].startswith(f"cloud-elastic: error: cannot connect to the Ray cluster at {address!r}")
    assert "nothing answers there" in lines[0]
