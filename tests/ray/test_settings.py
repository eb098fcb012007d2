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


class _HorovodDiscovery:
    def find_available_hosts_and_slots(self):
        return {"10.0.0.5": 2, "10.0.0.6": 0}


def test_override_discovery_takes_a_horovod_discovery_object_and_refuses_what_is_no_discovery():
    settings = ElasticRayExecutor.create_settings()
    found = ElasticRayExecutor(settings, override_discovery=_HorovodDiscovery())._discovery.find()
    assert dict(found.ready) == {"10.0.0.5": 2}  # a host with no slot is no host
    for wrong in ("ray", 1, object()):
        with pytest.raises(ConfigError, match=r"^override_discovery must be None, True, a HostDiscovery or an object "
                                              r"with Horovod's find_available_hosts_and_slots\(\), got "):
            ElasticRayExecutor(settings, override_discovery=wrong)


def test_horovods_call_forms_work_or_are_refused_in_one_line():
    settings = ElasticRayExecutor.create_settings()
    # ElasticRayExecutor(settings, use_gpu, cpus_per_slot, gpus_per_slot, env_vars, override_discovery)
    executor = ElasticRayExecutor(settings, True, 2, 1, {"A": "1"}, True)
    assert (executor.use_gpu, executor.cpus_per_slot, executor.gpus_per_slot, executor.env_vars) == (
        True, 2, 1, {"A": "1"})
    with pytest.raises(ConfigError, match=r"^gpus_per_slot=2 needs use_gpu=True"):
        ElasticRayExecutor(settings, gpus_per_slot=2)
    # run(worker_fn, callbacks): Horovod's second argument, not the function's arguments.
    for call in (lambda: executor.run(print, [print]), lambda: executor.run(print, callbacks=[print])):
        with pytest.raises(ConfigError, match=r"^run\(worker_fn, callbacks\): Horovod's callbacks .* args= and "):
            call()
    with pytest.raises(ConfigError, match=r"call ElasticRayExecutor.start\(\) before run\(\)"):
        executor.run(print, callbacks=None)  # no callback: nothing refused


def test_horovods_settings_none_is_the_default_and_one_setting_named_twice_must_agree(monkeypatch):
    monkeypatch.delenv("CLOUD_ELASTIC_ELASTIC_TIMEOUT", raising=False)
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "900")
    settings = ElasticRayExecutor.create_settings(elastic_timeout=None, start_timeout=None, cooldown_range=None,
                                                  min_np=None, nics=None, ssh_identity_file=None)
    assert (settings.min_np, settings.elastic_timeout_s, settings.start_timeout_s) == (1, 900, 600)
    assert ElasticRayExecutor.create_settings(min_np=3, min_num_proc=3, timeout_s=30).start_timeout_s == 30
    with pytest.raises(ConfigError, match=r"^create_settings: min_np=1 and min_num_proc=3 name the same setting"):
        ElasticRayExecutor.create_settings(min_np=1, min_num_proc=3)
    with pytest.raises(ConfigError, match=r"^create_settings: start_timeout=600 and timeout_s=30 name the same"):
        ElasticRayExecutor.create_settings(start_timeout=600, timeout_s=30)
