"""``cloud-elastic run --ray-address``'s pieces: build_ray_run runs the job's command in Ray actors."""

from __future__ import annotations

import sys

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.driver import Driver
from tests.ray.conftest import REPO

# Generous bounds: a Ray cluster starts on a machine that may be shared.
pytestmark = [pytest.mark.ray, pytest.mark.timeout(360)]


def test_the_command_runs_as_one_worker_per_node_and_the_job_succeeds(nodes, capfd):
    from cloud_elastic.ray import build_ray_run

    nodes.add(2)
    lines: list[str] = []
    config = JobConfig(
        command=(sys.executable, str(REPO / "examples" / "elastic_anywhere.py"), "--steps", "10"),
        num_proc=2, min_np=2, max_np=2, cwd=str(REPO),
    )
    run = build_ray_run(nodes.cluster.address, config)
    assert run.config.driver_address  # the node's IP, which the actors reach
    finish = Driver(run.config, run.discovery, launcher=run.launcher, output=lines.append).run()
    assert finish.success, finish.reason
    assert finish.exit_code == 0

