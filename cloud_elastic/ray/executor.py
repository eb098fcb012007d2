"""``ElasticRayExecutor`` and ``build_ray_run``: the elastic driver with Ray for discovery and launch.

Everything else is the driver of ``cloud-elastic run``: rounds, rollback to
the last commit, graceful removal, blacklisting, timeouts. The driver runs in
the calling process and listens on this node's IP (Ray's
``get_node_ip_address``), which every node of the cluster must reach.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cloud_elastic.config import JobConfig
from cloud_elastic.errors import ConfigError, JobFailed
from cloud_elastic.ray._deps import require_ray
from cloud_elastic.providers.api import HostDiscovery
from cloud_elastic.ray.discovery import HorovodDiscovery, RayHostDiscovery, check_gpus_per_slot
from cloud_elastic.ray.launcher import FunctionPayload, RayLauncher, node_for

__all__ = ["ElasticRayExecutor", "RayRun", "RaySettings", "build_ray_run"]

log = logging.getLogger(__name__)

#: ``max_np=None`` means as many workers as the cluster offers.
_UNLIMITED = 1 << 20
#: How long :func:`build_ray_run` waits for the cluster's GCS to accept a connection: ray.init retries for minutes.
CONNECT_TIMEOUT_S = 10.0


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
        use_gpu: bool = False,
        cpus_per_slot: float = 1.0,
        gpus_per_slot: float | None = None,
        env_vars: Mapping[str, str] | None = None,
        override_discovery: HostDiscovery | bool | None = None,
    ) -> None:
        """Horovod's arguments, in its order. ``gpus_per_slot``: whole GPUs per worker with ``use_gpu`` (``None``:
        1; refused without ``use_gpu``, as Horovod did). ``override_discovery``: the :class:`HostDiscovery` to use
        instead of Ray's nodes, or a Horovod discovery object (one with ``find_available_hosts_and_slots()``);
        ``None`` or ``True`` (Horovod's default) keep Ray's; anything else is a ConfigError."""
        if gpus_per_slot and not use_gpu:
            raise ConfigError(f"gpus_per_slot={gpus_per_slot!r} needs use_gpu=True (without it a worker gets no GPU)")
        if gpus_per_slot is None:
            gpus_per_slot = 1.0
        if use_gpu:
            check_gpus_per_slot(gpus_per_slot)
        self.settings = settings
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot
        self.env_vars = dict(env_vars or {})
        override = _discovery(override_discovery)
        self._discovery = override if override is not None else RayHostDiscovery(
            address=None, use_gpu=use_gpu, cpus_per_slot=cpus_per_slot, gpus_per_slot=gpus_per_slot
        )
        self._driver_address: str | None = None

    @staticmethod
    def create_settings(
        min_np: int | None = None,
        max_np: int | None = None,
        reset_limit: int | None = None,
        elastic_timeout: float | None = None,
        start_timeout: float | None = None,
        cooldown_range: tuple[float, float] | None = None,
        num_proc: int | None = None,
        verbose: bool = False,
        *,
        min_num_proc: int | None = None,
        max_num_proc: int | None = None,
        timeout_s: float | None = None,
        **more: Any,
    ) -> RaySettings:
        """Settings with Horovod's argument names (seconds for timeouts); ``more`` sets other RaySettings fields.

        Horovod's ``min_num_proc``/``max_num_proc`` are ``min_np``/``max_np``, its ``timeout_s`` is
        ``start_timeout``: one setting given under both names with two values is refused. None is the default:
        ``min_np`` 1, ``start_timeout`` 600 s, ``elastic_timeout`` ``$HOROVOD_ELASTIC_TIMEOUT``, else 600 s.
        Horovod's ``ssh_identity_file`` and ``nics`` have no meaning here and are refused (None is accepted).
        """
        from cloud_elastic.config import elastic_timeout_default

        extra = {k: v for k, v in more.items() if not (k in _HOROVOD_ONLY and v is None)}
        horovod_only = sorted(_HOROVOD_ONLY & extra.keys())
        if horovod_only:
            raise ConfigError(f"create_settings({horovod_only[0]}=...) is Horovod's and has no use here: there is "
                              f"no SSH, and each worker binds Gloo to its Ray node's IP")
        unknown = sorted(extra.keys() - {f.name for f in dataclasses.fields(RaySettings)})
        if unknown:
            raise ConfigError(f"create_settings: unknown setting(s) {', '.join(unknown)}")
        min_np = _alias("min_np", min_np, "min_num_proc", min_num_proc)
        max_np = _alias("max_np", max_np, "max_num_proc", max_num_proc)
        start_timeout = _alias("start_timeout", start_timeout, "timeout_s", timeout_s)
        if cooldown_range is not None:
            extra["cooldown_range_s"] = tuple(cooldown_range)
        return RaySettings(
            min_np=1 if min_np is None else min_np, max_np=max_np, num_proc=num_proc, reset_limit=reset_limit,
            elastic_timeout_s=elastic_timeout_default() if elastic_timeout is None else elastic_timeout,
            start_timeout_s=600.0 if start_timeout is None else start_timeout, verbose=verbose, **extra,
        )

    def start(self) -> None:
        """Check that this process is connected to Ray and pick the driver's address. No workers start yet."""
        ray = require_ray()
        if not ray.is_initialized():
            raise ConfigError("call ray.init() (or ray.init(address='auto')) before ElasticRayExecutor.start()")
        self._driver_address = ray.util.get_node_ip_address()

    def run(
        self, worker_fn: Callable[..., Any], callbacks: Sequence[Callable[[Any], Any]] | None = None, *,
        args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """Run ``worker_fn(*args, **kwargs)`` on every worker until the job ends; return the results in rank order.

        ``callbacks`` is Horovod's second argument, refused unless empty: Horovod called them with what rank 0
        logged through its Ray queue, which does not exist here. Raises :class:`JobFailed` with the driver's
        reason when the job failed. When that reason names a worker whose training function raised, its
        exception (Ray's task error, an instance of the user's class, with the remote traceback) is the
        ``__cause__``; an error the job had recovered from is not.
        """
        if callbacks:
            raise ConfigError("run(worker_fn, callbacks): Horovod's callbacks on what rank 0 logs through its Ray "
                              "queue have no counterpart here (log from the training function); the function's own "
                              "arguments go in args= and kwargs=")
        if self._driver_address is None:
            raise ConfigError("call ElasticRayExecutor.start() before run()")
        if not isinstance(self._discovery, RayHostDiscovery):
            _check_override_hosts(self._discovery)
        from cloud_elastic.driver.runtime.driver import Driver

        name = getattr(worker_fn, "__qualname__", type(worker_fn).__name__)
        # The command is only a label here: the launcher runs the function instead.
        config = self.settings.job_config(
            ("<ray actor>", name), self._driver_address, forward_env=tuple(f"{k}={v}" for k, v in self.env_vars.items())
        )
        from cloud_elastic.driver.job.notice_policy import watched_cloud
        from cloud_elastic.notices.factory import check_endpoint
        from cloud_elastic.worker.settings import check_environ

        # A malformed endpoint override or worker setting in env_vars, what `cloud-elastic run -x` refuses: no
        # worker could watch its node, or start (its own environment is Ray's, not this process's).
        check_endpoint(watched_cloud(config.notice_watcher, str(getattr(self._discovery, "name", ""))), self.env_vars)
        check_environ({}, self.env_vars, checkpointing=config.checkpoint_dir is not None)
        launcher = RayLauncher(
            FunctionPayload(worker_fn, tuple(args), dict(kwargs or {})),
            use_gpu=self.use_gpu, cpus_per_slot=self.cpus_per_slot, gpus_per_slot=self.gpus_per_slot,
            terminate_grace_s=config.terminate_grace_s,
        )
        with verbose_logging(self.settings.verbose):
            finish = Driver(config, self._discovery, launcher=launcher).run()
        if not finish.success:
            raise JobFailed(finish.reason, finish.exit_code) from named_error(finish.reason, launcher.errors)
        ranked = sorted(launcher.results, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0))
        return [r.value for r in ranked]


def _check_override_hosts(discovery: HostDiscovery) -> None:
    """ConfigError at once, not after ``start_timeout``, when the first hosts ``override_discovery`` finds
    name no node of this Ray cluster (or name several nodes at once): no worker could ever start. A host
    that only some of them miss may be a node still joining; its launches fail, with the reason, and are retried.
    """
    try:
        hosts = [*discovery.find().ready]
    except Exception:  # the driver retries discovery, and reports its failures, as always
        return
    missing = []
    for host in hosts:
        try:
            node_for(host)
        except ConfigError as exc:
            missing.append(str(exc))
    if hosts and len(missing) == len(hosts):
        raise ConfigError(f"override_discovery: {missing[0]}" + (f" (and {len(missing) - 1} more)"
                                                                  if len(missing) > 1 else ""))


#: ``create_settings`` arguments of Horovod's that have no use here: refused unless None.
_HOROVOD_ONLY = frozenset({"ssh_identity_file", "nics"})


def _alias(name: str, value: Any, horovod_name: str, horovod_value: Any) -> Any:
    """The one value given of ``name`` and ``horovod_name``, Horovod's spelling of it (None when neither was);
    refused when both were given with different values."""
    if value is not None and horovod_value is not None and value != horovod_value:
        raise ConfigError(f"create_settings: {name}={value!r} and {horovod_name}={horovod_value!r} name the same "
                          f"setting; pass one")
    return horovod_value if value is None else value


def _discovery(override: Any) -> HostDiscovery | None:
    """The discovery ``override_discovery`` names: None for Ray's nodes (None, True); ConfigError for what is none."""
    if override is None or override is True:
        return None
    if isinstance(override, HostDiscovery):
        return override
    if override is False:
        raise ConfigError("override_discovery=False: pass the HostDiscovery to use instead (Ray's nodes are "
                          "the default)")
    if callable(getattr(override, "find_available_hosts_and_slots", None)):
        return HorovodDiscovery(override)
    raise ConfigError(f"override_discovery must be None, True, a HostDiscovery or an object with Horovod's "
                      f"find_available_hosts_and_slots(), got {type(override).__name__} {override!r:.60}")


def named_error(reason: str, errors: Sequence[tuple[str, Any]]) -> Any:
    """The newest of ``errors`` (worker id, error) whose worker the driver's ``reason`` names (``worker <id>``):
    an error of a worker the job had recovered from is not why it failed."""
    for worker_id, error in reversed(errors):
        if re.search(rf"\bworker {re.escape(worker_id)}(?!\w)", reason):
            return error
    return None


@contextlib.contextmanager
def verbose_logging(verbose: bool) -> Iterator[None]:
    """What the CLI's ``--verbose`` does, for this call: the driver's debug lines, on stderr unless the
    application has its own logging handlers."""
    if not verbose:
        yield
        return
    logger = logging.getLogger("cloud_elastic")
    level, handler = logger.level, None
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("cloud-elastic: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.setLevel(level)
        if handler is not None:
            logger.removeHandler(handler)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """ConfigError, in one line and within about ``timeout_s``, unless the GCS of the Ray cluster ``ray.init`` would
    connect to for ``address`` accepts a TCP connection and answers it as a gRPC server does ('auto':
    ``RAY_ADDRESS``, else the cluster this machine last started or runs). ``ray.init`` itself waits minutes for an
    absent one, and for a port where something else listens (the dashboard's 8265). Nothing is checked where Ray's
    private address lookup is missing, or for 'local' (``ray.init`` starts a cluster then).
    """
    if "://" in address:  # ray://host:port: Ray Client's server
        resolved: str | None = address.split("://", 1)[1].split("/", 1)[0]
    else:
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:
            return
        try:
            resolved = canonicalize_bootstrap_address(address)
        except (ConnectionError, ValueError) as exc:  # 'auto' found no cluster; an address that is no host:port
            raise ConfigError(f"cannot connect to the Ray cluster at {address!r}: {_first_line(exc)}") from exc
    if resolved is None:
        return
    host, _, port = resolved.rpartition(":")
    where = "" if resolved == address else f" ({resolved})"
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot connect to the Ray cluster at {address!r}{where}: nothing answers there "
                          f"({_first_line(exc) or type(exc).__name__}); is it running?") from exc
    with sock:
        if not _answers_grpc(sock):
            raise ConfigError(f"cannot connect to the Ray cluster at {address!r}{where}: what answers there is not a "
                              "Ray cluster's GCS port; give the address 'ray start --head' printed (port 6379 "
                              "by default; the dashboard's 8265 is not one)")


#: The HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113, 3.4): a gRPC server, as Ray's
#: GCS and its client server are, answers with a SETTINGS frame of its own.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _answers_grpc(sock: socket.socket) -> bool:
    """Whether the server at ``sock`` (its timeout set) answers the HTTP/2 preface with a SETTINGS frame; True
    under ``RAY_USE_TLS`` (the GCS speaks TLS first: the TCP connect is all that is checked)."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return True
    head = b""
    try:
        sock.sendall(_H2_PREFACE)
        while len(head) < 9 and (chunk := sock.recv(9 - len(head))):
            head += chunk
    except OSError:  # a reset, or silence past the timeout
        return False
    return len(head) == 9 and head[3] == 0x04  # a frame header: 3 bytes of length, then its type


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().split("\n", 1)[0]


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
    Raises :class:`ConfigError` when the cluster cannot be reached (within about :data:`CONNECT_TIMEOUT_S`).
    """
    ray = require_ray()
    if not ray.is_initialized():
        check_reachable(address)
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
