"""``SparkTaskDiscovery``: the job's registered, polling Spark tasks as hosts of one slot each."""

from __future__ import annotations

from collections.abc import Mapping

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery
from cloud_elastic.spark.registry import TaskRegistry

__all__ = ["SparkTaskDiscovery"]


class SparkTaskDiscovery(HostDiscovery):
    """Hosts are the tasks of this job's Spark stage that registered and still poll (see
    :mod:`cloud_elastic.spark.registry`). A task whose executor died stops polling and
    disappears; a task Spark retried registers again as a new host."""

    name = "spark"
    description = "the tasks of a cloud_elastic.spark.run_elastic job (not selectable from the CLI)"

    def __init__(self, registry: TaskRegistry) -> None:
        self._registry = registry

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> SparkTaskDiscovery:
        raise ConfigError("the spark provider is used through cloud_elastic.spark.run_elastic, not from the CLI")

    def find(self) -> DiscoveredHosts:
        tasks = self._registry.alive()
        return DiscoveredHosts(ready={k: 1 for k in tasks}, instances={k: k for k in tasks})
