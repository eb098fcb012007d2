"""Before the job runs: the job's state machine built from its configuration, its first discovery, and the
address its workers reach the driver at.

:func:`new_job` makes the :class:`~cloud_elastic.driver.job.elastic_job.ElasticJob` the configuration asks for.
:func:`first_discovery` asks the provider until it answers: transient failures are retried, and logged once
each, within ``--start-timeout`` (a resumed or adopting driver's job, which discovery answered before, is
bounded by ``--elastic-timeout`` instead: the job's own rules, fed every failure, end it); a fatal failure of a
new job, the timeout or a signal end it, and it returns None. :func:`choose_address` picks the address the
workers use and the one the driver binds: loopback unless a remote host is involved.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Callable, Iterable

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.elastic_job import ElasticJob, Policy
from cloud_elastic.driver.job.hosts import Blacklist, HostManager
from cloud_elastic.driver.launch.api import is_local_host
from cloud_elastic.driver.restart.record import AdoptedWorker
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.discovery import DiscoveryFailure, DiscoveryPoller
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery
from cloud_elastic.providers.static import never_grows

__all__ = ["new_job", "first_discovery", "adopted_hosts", "choose_address"]

log = logging.getLogger(__name__)


def new_job(config: JobConfig, discovery: HostDiscovery, job_id: str) -> ElasticJob:
    """The job's state machine as ``config`` sets it up: its policy, its hosts and blacklist (no I/O)."""
    return ElasticJob(
        Policy(
            num_proc=config.num_proc,
            min_np=config.min_np,
            max_np=config.max_np,
            reset_limit=config.reset_limit,
            restarts=config.restarts,
            elastic_timeout_s=config.elastic_timeout_s,
            start_timeout_s=config.start_timeout_s,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
            finish_timeout_s=config.finish_timeout_s,
            checkpointing=config.checkpoint_dir is not None,
            checkpoint_interval_s=config.checkpoint_interval_s or 300.0,
            progress_timeout_s=config.progress_timeout_s,
            straggler_factor=config.straggler_factor,
            straggler_window_s=config.straggler_window_s,
            whole_host_slots=config.whole_host_slots,
            sources=tuple(getattr(discovery, "specs", ())),  # several host sources (providers.multi)
            fallback_after_s=config.fallback_after_s,
            manage_capacity=config.manage_capacity,
            spares=config.spares,
            plan_admissions=True,
            hosts_fixed=never_grows(discovery),
        ),
        HostManager(Blacklist(config.cooldown_range_s), missing_grace_s=config.host_missing_grace_s,
                    drain_soft=config.drain_on_rebalance),
        job_id=job_id,
    )


def first_discovery(job: ElasticJob, cond: JobCondition, discovery: HostDiscovery, config: JobConfig, *,
                    clock: Callable[[], float], stop_reason: Callable[[], tuple[str, int] | None],
                    call_timeout_s: float, tick_s: float, once: bool = False) -> DiscoveredHosts | None:
    """Discover until it works; transient failures are retried within --start-timeout.

    Returns None when the job ended meanwhile (a fatal error, the timeout, a signal: ``stop_reason()`` is not
    None). A call that hangs is given up on at --start-timeout if that comes before --discovery-timeout.
    ``once``: one call; None also when it failed and the job goes on (a restarted driver adopting its workers
    goes on with their hosts meanwhile: ``Driver._start_adopting``).
    """
    def meanwhile() -> str:
        flag, limit = (("--elastic-timeout", config.elastic_timeout_s) if job.discovery.answered_before
                       else ("--start-timeout", config.start_timeout_s))
        return f"; the job waits for hosts up to {flag} {limit:g}s"

    # Its failures are logged and spaced as a running job's are (numbers masked, fewer calls while they fail, one
    # traceback of a provider's bug a streak): a cloud API failing at start logs a handful of lines, not one a second.
    poller = DiscoveryPoller(discovery, lambda r: None, interval_s=config.discovery_interval_s,
                             call_timeout_s=call_timeout_s, meanwhile=meanwhile)
    try:
        return _discover_first(poller, job, cond, config, clock, stop_reason, tick_s, once)
    finally:
        poller.close()  # its call thread ends with the call under way, if any


def _discover_first(poller: DiscoveryPoller, job: ElasticJob, cond: JobCondition, config: JobConfig,
                    clock: Callable[[], float], stop_reason: Callable[[], tuple[str, int] | None],
                    tick_s: float, once: bool) -> DiscoveredHosts | None:
    with cond:
        started, answered = clock(), job.discovery.answered_before  # then --elastic-timeout bounds it
        job.start(started, wall_now=time.time())
    said, wait_s = "", config.discovery_interval_s

    def left() -> float | None:
        """Seconds until the job ends for want of hosts, a tick past it: a new job's --start-timeout from its start, a
        resumed job's --elastic-timeout from its first failure (``discovery_edge.failed``); None before that failure.
        A call that hangs is given up on then, and no back-off waits past it (it grows to 30 s)."""
        if not answered:
            return started + config.start_timeout_s - clock() + tick_s
        since = job.discovery_failing_since
        return None if since is None else since + config.elastic_timeout_s - clock() + tick_s

    while True:
        left_s = left()
        result = poller.poll_once(stopping=lambda: stop_reason() is not None,  # Ctrl-C ends a slow call
                                  timeout_s=left_s)
        with cond:
            reason = stop_reason()
            if reason is not None:
                if not once:  # a restarted driver's one call (``once``) ends in its adoption window: the job stops
                    job.stop(*reason)  # from the loop, gracefully, with the workers it adopts (review h13)
                return None
            if not isinstance(result, DiscoveryFailure):
                return result
            if result.timed_out and said and left_s is not None and left_s < poller.limit_s:
                # Cut short by the job's limit (left()), not the provider's fault: it ends on the last real failure.
                job.discovery_failed(said, fatal=False, now=clock())
            else:
                if not result.fatal and not once:
                    said = result.message
                    wait_s = poller.failed(result.message, clock())
                job.discovery_failed(result.message, fatal=result.fatal, now=clock())
                if once:
                    return None  # the caller says what the job does meanwhile; nothing is judged before it
            job.tick(clock())
            if job.outcome is not None:
                return None
            # Never past the job's limit: it ends there (its tick, or the call then), not a back-off later.
            until_end = left()
            cond.wait(max(tick_s, min(wait_s, until_end)) if until_end is not None else wait_s)


def adopted_hosts(workers: Iterable[AdoptedWorker]) -> DiscoveredHosts:
    """The hosts adopted ``workers`` run on, each with the slots up to its highest worker's: what a restarted driver
    goes on with while its discovery has not answered (``DiscoveryEdge.assume``)."""
    slots: dict[str, int] = {}
    for w in workers:
        slots[w.host] = max(slots.get(w.host, 0), w.slot + 1)
    return DiscoveredHosts(ready=slots)


def choose_address(config: JobConfig, hosts: list[str]) -> tuple[str, str]:
    """(address workers use, address to bind). Loopback unless a remote host is involved."""
    if config.driver_address:
        addr = config.driver_address
        bind = "127.0.0.1" if is_local_host(addr) else "0.0.0.0"
        return addr, bind
    remote = [h for h in hosts if not is_local_host(h)]
    if not remote and not config.force_ssh:
        return "127.0.0.1", "127.0.0.1"
    target = remote[0] if remote else "127.0.0.1"
    addr = _route_address(target)
    log.info("--driver-address not given; workers will reach the driver at %s (route to %s)", addr, target)
    return addr, "0.0.0.0"


def _route_address(target: str) -> str:
    """The local address the kernel would use to reach ``target`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())
