"""Elastic training on a Ray cluster: Ray nodes as hosts, Ray actors as workers.

::

    from cloud_elastic.ray import ElasticRayExecutor
    import ray
    ray.init(address="auto")
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=2, max_np=8), use_gpu=True)
    executor.start()
    results = executor.run(train)

Importing this package does not import Ray; using it without Ray installed
raises a one-line error naming ``cloud-elastic[ray]``. See ``docs/ray.md``.
"""

from __future__ import annotations

from cloud_elastic.ray.discovery import RayHostDiscovery
from cloud_elastic.ray.executor import (
    ElasticRayExecutor,
    RayRun,
    RaySettings,
    build_ray_run,
)
from cloud_elastic.ray.launcher import FunctionPayload, RayLauncher, WorkerResult

__all__ = [
    "ElasticRayExecutor",
    "FunctionPayload",
    "RayHostDiscovery",
    "RayLauncher",
    "RayRun",
    "RaySettings",
    "WorkerResult",
    "build_ray_run",
]
