"""Bad settings and misuse of ElasticRayExecutor are one-line ConfigErrors before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.ray import ElasticRayExecutor
from tests.ray.conftest import REPO

pytestmark = pytest.mark.timeout(120)


def test_max_np_below_min_np_is_refused():
    with pytest.raises(ConfigError, match=r"max_np \(2\) must be >= min_np \(3\)"):
        ElasticRayExecutor.create_settings(min_np=3, max_np=2)


def test_num_proc_outside_the_bounds_is_refused_when_the_job_is_built():
    settings = ElasticRayExecutor.create_settings(min_np=2, max_np=4, num_proc=5)
    with pytest.raises(ConfigError, match=r"-np \(5\) must lie between --min-np \(2\) and --max-np \(4\)"):
        settings.job_config(("<ray actor>", "train"), "127.0.0.1")


def test_run_before_start_and_start_before_ray_init_say_what_to_call():
    pytest.importorskip("ray", reason="ray is not installed (pip install 'cloud-elastic[ray]')")
    with pytest.raises(ConfigError, match=r"call ElasticRayExecutor.start\(\) before run\(\)"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings()).run(print)
    # In a fresh process, where nothing has connected to Ray.
    out = subprocess.run(
        [sys.executable, "-c",
         "from cloud_elastic.ray import ElasticRayExecutor as E\n"
         "from cloud_elastic.errors import ConfigError\n"
         "try:\n    E(E.create_settings()).start()\nexcept ConfigError as exc:\n    print(exc)\n"],
        cwd=REPO, capture_output=True, text=True, timeout=100, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "call ray.init() (or ray.init(address='auto')) before ElasticRayExecutor.start()"
