"""ElasticRayExecutor refuses a malformed metadata endpoint override in the env_vars its workers get.

No Ray here: run() is refused before it needs Ray's launcher (the real cluster is tests/ray/).
"""

from __future__ import annotations

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.ray import ElasticRayExecutor, RayHostDiscovery
from cloud_elastic.ray import executor as executor_module

pytestmark = pytest.mark.timeout(30)


def test_a_malformed_endpoint_in_env_vars_is_refused_before_any_worker_starts(monkeypatch):
    """A worker gets env_vars: with a malformed endpoint override there, it could watch no notices."""
    settings = ElasticRayExecutor.create_settings(notice_watcher="gcp")
    env = {"GCE_METADATA_HOST": "http://metadata.google.internal"}
    monkeypatch.setattr(executor_module, "RayLauncher", None)  # reached only if not refused
    executor = ElasticRayExecutor(settings, env_vars=env, override_discovery=RayHostDiscovery(address=None))
    executor._driver_address = "127.0.0.1"  # what start() sets, from Ray
    with pytest.raises(ConfigError, match=r"GCE_METADATA_HOST is host\[:port\] without a scheme or path"):
        executor.run(print)
