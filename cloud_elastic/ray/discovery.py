"""``RayHostDiscovery``: the nodes of a running Ray cluster as hosts.

A host is a Ray node, keyed by its **node id** (hex): every node of a
``ray.cluster_utils.Cluster``, and nodes a cloud gives a recycled address,
share or reuse IPs, while node ids are unique for the life of the cluster.
The node id is also reported as the host's instance id. Workers bind Gloo to
their node's IP, which the Ray launcher puts in their environment.

Slots come from a node's **total** resources (GPUs, or CPUs per slot), not
its free ones: the job's own actors occupy them once they run, and counting
free resources would make every running host look full and shrink the job.
A node with zero slots (a CPU-only head node in a GPU job) is not reported.

A node Ray is draining (``ray drain-node``, or the autoscaler on a spot
termination, which passes the preemption deadline) is reported as draining
with that deadline, so its workers leave at their next commit. A dead node
simply disappears: its actors die and the driver sees those failures.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from cloud_elastic.errors import (
    ConfigError,
    FatalDiscoveryError,
    RetryableDiscoveryError,
)
from cloud_elastic.providers.api import (
    DiscoveredHosts,
    Drain,
    HostDiscovery,
    ProviderOption,
    parse_bool,
)
from cloud_elastic.ray._deps import require_ray

__all__ = ["HorovodDiscovery", "RayHostDiscovery", "check_gpus_per_slot"]

log = logging.getLogger(__name__)


class RayHostDiscovery(HostDiscovery):
    """Alive Ray nodes and their slots; draining nodes as draining. Needs ``ray.init()`` in this process
    (``address`` connects on the first :meth:`find` when it has not been called)."""

    name = "ray"
    description = "nodes of a Ray cluster: GPUs (or CPUs per slot) as slots, draining nodes leave gracefully"
    options = (
        ProviderOption("address", "Ray cluster address for ray.init (e.g. auto)", default="auto"),
        ProviderOption("use_gpu", "one slot per GPU (true) or per cpus_per_slot CPUs (false)", default="false"),
        ProviderOption("cpus_per_slot", "CPUs each worker reserves", default="1"),
        ProviderOption("gpus_per_slot", "GPUs each worker reserves when use_gpu is true", default="1"),
    )

    def __init__(
        self,
        *,
        address: str | None = "auto",
        use_gpu: bool = False,
        cpus_per_slot: float = 1.0,
        gpus_per_slot: float = 1.0,
        slots_per_host: int | None = None,
    ) -> None:
        if cpus_per_slot < 0 or (not use_gpu and cpus_per_slot <= 0):
            raise ConfigError(f"cpus_per_slot must be > 0, got {cpus_per_slot:g}")
        if use_gpu:
            check_gpus_per_slot(gpus_per_slot)
        if slots_per_host is not None and slots_per_host < 1:
            raise ConfigError(f"--slots-per-host must be >= 1, got {slots_per_host}")
        self.address = address
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot
        self.slots_per_host = slots_per_host

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> RayHostDiscovery:
        cls.check_options(options)

        def number(name: str, default: str) -> float:
            raw = options.get(name, default)
            try:
                return float(raw)
            except ValueError:
                raise ConfigError(f"option {name!r} must be a number, got {raw!r}") from None

        return cls(
            address=options.get("address", "auto"),
            use_gpu=parse_bool("use_gpu", options.get("use_gpu", "false")),
            cpus_per_slot=number("cpus_per_slot", "1"),
            gpus_per_slot=number("gpus_per_slot", "1"),
            slots_per_host=slots_per_host,
        )

    def slots_of(self, resources: Mapping[str, float]) -> int:
        """Worker slots a node with these total resources offers."""
        if self.slots_per_host is not None:
            return self.slots_per_host
        cpus = float(resources.get("CPU", 0.0))
        by_cpu = math.floor(cpus / self.cpus_per_slot + 1e-9) if self.cpus_per_slot > 0 else None
        if not self.use_gpu:
            return by_cpu or 0
        by_gpu = math.floor(float(resources.get("GPU", 0.0)) / self.gpus_per_slot + 1e-9)
        return by_gpu if by_cpu is None else min(by_gpu, by_cpu)

    def find(self) -> DiscoveredHosts:
        ray = require_ray()
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, log_to_driver=True)
            except ConnectionError as exc:
                raise RetryableDiscoveryError(f"cannot reach the Ray cluster at {self.address!r}: {exc}") from exc
            except Exception as exc:  # Ray raises plain RuntimeError/ValueError for a bad address
                raise FatalDiscoveryError(f"cannot connect to the Ray cluster at {self.address!r}: {exc}") from exc
        try:
            nodes = ray.nodes()
        except Exception as exc:  # a GCS hiccup; the next poll asks again
            raise RetryableDiscoveryError(f"ray.nodes() failed: {exc}") from exc
        draining = _draining_nodes()
        return self.snapshot(nodes, draining)

    def snapshot(self, nodes: list[Mapping[str, Any]], draining: Mapping[str, int]) -> DiscoveredHosts:
        """The snapshot for ``ray.nodes()`` output and ``{node id: drain deadline ms (0 = none)}``."""
        ready: dict[str, int] = {}
        leaving: dict[str, Drain] = {}
        for node in nodes:
            if not node.get("Alive"):
                continue
            node_id = str(node["NodeID"])
            slots = self.slots_of(node.get("Resources") or {})
            if slots < 1:
                continue
            if node_id in draining:
                deadline_ms = draining[node_id]
                leaving[node_id] = Drain(deadline_ms / 1000.0 if deadline_ms else None, "ray is draining the node")
            else:
                ready[node_id] = slots
        hosts = {**ready, **leaving}
        return DiscoveredHosts(ready=ready, draining=leaving, instances={h: h for h in hosts})


class HorovodDiscovery(HostDiscovery):
    """A Horovod host discovery object (``find_available_hosts_and_slots()`` -> ``{host: slots}``), as a ported
    script passes it to ``ElasticRayExecutor(override_discovery=...)``: its hosts are ready, none drains."""

    name = "horovod"
    description = "a Horovod discovery object given to ElasticRayExecutor (not selectable from the CLI)"

    def __init__(self, horovod: Any) -> None:
        self.horovod = horovod

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> HorovodDiscovery:
        raise ConfigError("a Horovod discovery object is given to ElasticRayExecutor(override_discovery=...), "
                          "not chosen from the CLI")

    def find(self) -> DiscoveredHosts:
        found = self.horovod.find_available_hosts_and_slots()
        try:
            ready = {str(host): int(slots) for host, slots in dict(found).items() if int(slots) > 0}
        except (TypeError, ValueError) as exc:
            raise FatalDiscoveryError(f"override_discovery: find_available_hosts_and_slots() must return "
                                      f"{{host: slots}}, got {found!r:.80}") from exc
        return DiscoveredHosts(ready=ready)


def check_gpus_per_slot(gpus_per_slot: Any) -> None:
    """Refuse a GPU share that is not whole GPUs: every worker trains on ``cuda:<local rank>``, a GPU of its own,
    and with half a GPU per slot a node would offer twice as many slots as it has GPUs."""
    if isinstance(gpus_per_slot, bool) or not isinstance(gpus_per_slot, (int, float)) or \
            not (gpus_per_slot >= 1 and float(gpus_per_slot).is_integer()):
        raise ConfigError(f"gpus_per_slot must be a whole number >= 1 (each worker trains on a GPU of its own), "
                          f"got {gpus_per_slot!r}")


def _draining_nodes() -> dict[str, int]:
    """``{node id: deadline ms}`` of nodes Ray is draining. Ray exposes this only through a private
    accessor; if a Ray version lacks it, draining nodes are seen only when they die."""
    try:
        from ray._private.state import state

        return {str(k): int(v) for k, v in state.get_draining_nodes().items()}
    except Exception:  # an older or newer Ray without the accessor: degrade to failures
        log.debug("could not read Ray's draining nodes", exc_info=True)
        return {}
