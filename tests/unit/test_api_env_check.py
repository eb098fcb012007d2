"""The Python APIs refuse a bad worker setting in the env they forward, as ``cloud-elastic run -x`` does.

``ElasticRayExecutor.run`` checked only the metadata endpoint override of its ``env_vars``, and
Spark's ``run_elastic`` nothing of its ``env``: every worker started, and each failed at ``init()``
with the settings parser's traceback. No Ray or Spark here: both are refused before they are needed.
"""

from __future__ import annotations

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.ray import ElasticRayExecutor, RayHostDiscovery
from cloud_elastic.ray import executor as executor_module

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("env", "message"), [
    ({"CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S": "nan"}, "CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S=nan: must be a finite"),
    ({"CLOUD_ELASTIC_SLOT": "-1"}, "CLOUD_ELASTIC_SLOT cannot be forwarded to the workers"),
])
def test_ray_run_refuses_a_bad_worker_setting_in_env_vars_before_any_worker_starts(monkeypatch, env, message):
    monkeypatch.setattr(executor_module, "RayLauncher", None)  # reached only if not refused
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(), env_vars=env,
                                  override_discovery=RayHostDiscovery(address=None))
    executor._driver_address = "127.0.0.1"  # what start() sets, from Ray
    with pytest.raises(ConfigError, match=message):
        executor.run(print)


def test_spark_run_elastic_refuses_a_bad_worker_setting_in_env_before_spark_runs_a_task(monkeypatch):
    from cloud_elastic.spark import runner

    def spark(*args, **kwargs):
        raise AssertionError("Spark reached: its tasks would start workers that fail at init()")

    monkeypatch.setattr(runner, "require_pyspark", spark)
    with pytest.raises(ConfigError, match="CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S=inf: must be a finite"):
        runner.run_elastic(len, num_proc=1, env={"CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S": "inf"})
