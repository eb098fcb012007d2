"""``ElasticRayExecutor`` and ``build_ray_run``: the elastic driver with Ray for discovery and launch.

Everything else is the driver of ``cloud-elastic run``: rounds, rollback to
the last commit, graceful removal, blacklisting, timeouts. The driver runs in
the calling process and listens on this node's IP (Ray's
``get_node_ip_address``), which every node of the cluster must reach.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cloud_elastic.config import JobConfig
from cloud_elastic.errors import ConfigError, JobFailed
from cloud_elastic.ray._deps import require_ray
from cloud_elastic.ray.discovery import RayHostDiscovery
from cloud_elastic.ray.launcher import FunctionPayload, RayLauncher

__all__ = ["ElasticRayExecutor", "RayRun", "RaySettings", "build_ray_run"]

log = logging.getLogger(__name__)

#: ``max_np=None`` means as many workers as the cluster offers.
_UNLIMITED = 1 << 20


@dataclass(frozen=True)
class RaySettings:
    """Job settings of an :class:`ElasticRayExecutor` (Horovod's ``create_settings``)."""

    min_np: int = 1
    max_np: int | None = None
    #: Workers the first round waits for; ``None`` = ``min_np``; the job then grows toward ``max_np`` as slots appear.
    num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout_s: float = 600.0
    start_timeout_s: float = 600.0
    cooldown_range_s: tuple[float, float] = (1.0, 60.0)
    discovery_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    checkpoint_dir: str | None = None
    #: Instance-metadata notice watcher on the nodes (aws, gcp, azure; none = Ray's draining only).
    notice_watcher: str = "none"
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.max_np is not None and self.max_np < self.min_np:
            raise ConfigError(f"max_np ({self.max_np}) must be >= min_np ({self.min_np})")

    def job_config(self, command: Sequence[str], driver_address: str, **extra: Any) -> JobConfig:
        """The driver's :class:`JobConfig` for these settings (validated there)."""
        max_np = _UNLIMITED if self.max_np is None else self.max_np
        return JobConfig(
            command=tuple(command),
            num_proc=self.min_np if self.num_proc is None else self.num_proc,
            min_np=self.min_np,
            max_np=max_np,
            reset_limit=self.reset_limit,
            elastic_timeout_s=self.elastic_timeout_s,
            start_timeout_s=self.start_timeout_s,
            cooldown_range_s=self.cooldown_range_s,
            discovery_interval_s=self.discovery_interval_s,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            checkpoint_dir=self.checkpoint_dir,
            verbose=self.verbose,
            driver_address=driver_address,
            notice_watcher=self.notice_watcher,
            **extra,
        )


class ElasticRayExecutor:
    """Runs a training function elastically on the nodes of a Ray cluster.

    ::

        ray.init(address="auto")
        settings = ElasticRayExecutor.create_settings(min_np=2, max_np=8)
        executor = ElasticRayExecutor(settings, use_gpu=True, cpus_per_slot=2)
        executor.start()
        results = executor.run(train)   # train uses cloud_elastic.torch with @hvd.elastic.run

    Hosts are Ray nodes (see :class:`~cloud_elastic.ray.discovery.RayHostDiscovery`);
    each worker is a Ray actor on its node. :meth:`run` returns the values the
    training function returned on the workers of the final round, in rank order.
    """

    def __init__(
        self,
        settings: RaySettings,
        *,
        use_gpu: bool = False,
        cpus_per_slot: float = 1.0,
        gpus_per_slot: float = 1.0,
        env_vars: Mapping[str, str] | None = None,
        override_discovery: RayHostDiscovery | None = None,
    ) -> None:
        self.settings = settings
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot
        self.env_vars = dict(env_vars or {})
        self._discovery = override_discovery or RayHostDiscovery(
            address=None, use_gpu=use_gpu, cpus_per_slot=cpus_per_slot, gpus_per_slot=gpus_per_slot
        )
        self._driver_address: str | None = None

    @staticmethod
    def create_settings(
        min_np: int = 1,
        max_np: int | None = None,
        reset_limit: int | None = None,
        elastic_timeout: float = 600.0,
        start_timeout: float = 600.0,
        cooldown_range: tuple[float, float] | None = None,
        num_proc: int | None = None,
        verbose: bool = False,
        **more: Any,
    ) -> RaySettings:
        """Settings with Horovod's argument names (seconds for timeouts); ``more`` sets other RaySettings fields."""
        extra = dict(more)
        if cooldown_range is not None:
            extra["cooldown_range_s"] = tuple(cooldown_range)
        return RaySettings(
            min_np=min_np, max_np=max_np, num_proc=num_proc, reset_limit=reset_limit,
            elastic_timeout_s=elastic_timeout, start_timeout_s=start_timeout, verbose=verbose, **extra,
        )

    def start(self) -> None:
        """Check that this process is connected to Ray and pick the driver's address. No workers start yet."""
        ray = require_ray()
        if not ray.is_initialized():
            raise ConfigError("call ray.init() (or ray.init(address='auto')) before ElasticRayExecutor.start()")
        self._driver_address = ray.util.get_node_ip_address()

    def run(
        self, worker_fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """Run ``worker_fn(*args, **kwargs)`` on every worker until the job ends; return the results in rank order.

        Raises the training function's own exception (Ray's task error, an
        instance of the same class, with the remote traceback) when the job
        failed and a worker's function raised; otherwise :class:`JobFailed`
        with the driver's reason.
        """
        if self._driver_address is None:
            raise ConfigError("call ElasticRayExecutor.start() before run()")
        from cloud_elastic.driver.runtime.driver import Driver

        name = getattr(worker_fn, "__qualname__", type(worker_fn).__name__)
        # The command is only a label here: the launcher runs the function instead.
        config = self.settings.job_config(
            ("<ray actor>", name), self._driver_address, forward_env=tuple(f"{k}={v}" for k, v in self.env_vars.items())
        )
        launcher = RayLauncher(
            FunctionPayload(worker_fn, tuple(args), dict(kwargs or {})),
            use_gpu=self.use_gpu, cpus_per_slot=self.cpus_per_slot, gpus_per_slot=self.gpus_per_slot,
            terminate_grace_s=config.terminate_grace_s,
        )
        finish = Driver(config, self._discovery, launcher=launcher).run()
        if not finish.success:
            errors = launcher.errors
            if errors:
                raise errors[0][1]
            raise JobFailed(finish.reason, finish.exit_code)
        ranked = sorted(launcher.results, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0))
        return [r.value for r in ranked]


@dataclass(frozen=True)
class RayRun:
    """The pieces of a command job on Ray (for the CLI): ``Driver(config, discovery, launcher=launcher)``."""

    config: JobConfig
    discovery: RayHostDiscovery
    launcher: RayLauncher


def build_ray_run(
    address: str,
    config: JobConfig,
    *,
    use_gpu: bool = False,
    cpus_per_slot: float = 1.0,
    gpus_per_slot: float = 1.0,
    slots_per_host: int | None = None,
) -> RayRun:
    """Connect to the Ray cluster at ``address`` and return the pieces to run ``config.command`` on it.

    The driver listens on this node's IP unless ``config.driver_address`` is set.
    Raises :class:`ConfigError` when the cluster cannot be reached.
    """
    ray = require_ray()
    if not ray.is_initialized():
        try:
            ray.init(address=address)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError or ValueError here
            raise ConfigError(f"cannot connect to the Ray cluster at {address!r}: {exc}") from exc
    if config.driver_address is None:
        config = dataclasses.replace(config, driver_address=ray.util.get_node_ip_address())
    discovery = RayHostDiscovery(
        address=address, use_gpu=use_gpu, cpus_per_slot=cpus_per_slot, gpus_per_slot=gpus_per_slot,
        slots_per_host=slots_per_host,
    )
    launcher = RayLauncher(
        None, use_gpu=use_gpu, cpus_per_slot=cpus_per_slot, gpus_per_slot=gpus_per_slot,
        terminate_grace_s=config.terminate_grace_s,
    )
    return RayRun(config, discovery, launcher)
