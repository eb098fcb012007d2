"""Prometheus metrics for ``cloud-elastic run --metrics-port PORT`` (extra ``[metrics]``).

:class:`MetricsServer` is an :class:`~cloud_elastic.events.EventSink`: most
metrics are derived from the job's events (world size, resets, rollbacks,
steps lost, notices, worker failures, checkpoints not written), so the driver feeds it the same
``emit`` calls as the events file (through :class:`~cloud_elastic.events.TeeEvents`).
Two things are not events and have their own calls: :meth:`MetricsServer.observe_discovery`
after each discovery poll, and :meth:`MetricsServer.observe_progress` with what rank 0's heartbeats
report: the optimizer steps its process has taken (the step rate) and the job's last commit, counted
in commits (``state.commit()`` calls, as ``round_formed.step``): the training step only when the script
commits once per step.

Every metric lives in the server's own registry (no process-global state) and
carries no per-host labels, so its cardinality stays fixed whatever the group does.
They are served by the driver's own bounded listener (:class:`~cloud_elastic.driver.net.scrape_server.ScrapeServer`:
one thread, a cap on connections, a deadline on each), not by prometheus_client's thread-per-connection server,
which strangers' idle connections could grow without bound.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable

from cloud_elastic.driver.net.scrape_server import ScrapeServer
from cloud_elastic.errors import ConfigError
from cloud_elastic.event_schema import validate

__all__ = ["MetricsServer", "StepRate"]

log = logging.getLogger(__name__)

_EXTRA_HINT = "--metrics-port needs the prometheus-client package: pip install 'cloud-elastic[metrics]'"


def _raise_to(counter: Any, counted: float, total: float | None) -> float:
    """Raise ``counter`` from ``counted`` to a running ``total`` (None: not said), never lower; what it counts now."""
    if total is None or total <= counted:
        return counted
    counter.inc(total - counted)
    return total


class StepRate:
    """A counter's rise per second over a sliding window of ``window_s`` seconds: rank 0's optimizer steps.

    The count is one process's (``source``, its worker id): another process's count (a new rank 0), or a
    count lower than the last, starts the window afresh rather than read as a leap. Not thread-safe (the
    server locks).
    """

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._source = ""
        self._first: float | None = None  # when the process (source) sent its first count

    def add(self, now: float, step: int, source: str = "") -> None:
        if self._samples and (step < self._samples[-1][1] or source != self._source):
            self._samples.clear()
        if self._first is None or source != self._source:
            self._first = now
        self._source = source
        self._samples.append((now, step))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    @property
    def rate(self) -> float:
        """Steps per second between the oldest and newest sample in the window; 0 with fewer than two."""
        if len(self._samples) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def known(self) -> float | None:
        """:attr:`rate`, or None (unknown, not 0) before two samples, and while the process has counted no
        optimizer step in its first ``window_s`` of counts (its first step may take that long to come). A
        process with no step after that reads 0, as a stalled job does: one stuck before its first step
        (a hung first allreduce) must trip an alert on 0, which NaN never does."""
        if len(self._samples) < 2:
            return None
        (last, steps), first = self._samples[-1], self._first
        if steps == 0 and first is not None and last - first < self.window_s:
            return None
        return self.rate


class MetricsServer:
    """Serves the job's metrics over HTTP at ``/metrics`` on ``bind:port``.

    ``bind`` is loopback by default: the metrics name the job and its progress, and nothing
    authenticates a scraper, so serving them to the network is the user's choice (``--metrics-addr``).

    The constructor only builds the metrics (ConfigError naming the extra
    when prometheus-client is missing); ``start()`` binds and serves from a
    daemon thread, ``close()`` stops. ``port`` is the bound port (useful with 0).
    """

    def __init__(self, job_id: str, port: int, *, bind: str = "127.0.0.1",
                 clock: Callable[[], float] = time.monotonic) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise ConfigError(_EXTRA_HINT) from None
        self._prom = prom
        self.job_id = job_id
        self._bind, self._port = bind, port
        self._clock = clock
        self._lock = threading.Lock()
        self._rate = StepRate()
        self._rounds = 0
        self._server: ScrapeServer | None = None
        self.registry = registry = prom.CollectorRegistry(auto_describe=True)
        ns = "cloud_elastic"
        self.info = prom.Info("job", "the job this driver runs", namespace=ns, registry=registry)
        self.info.info({"job": job_id})
        self.world_size = prom.Gauge("world_size", "workers in the current round", namespace=ns, registry=registry)
        self.round = prom.Gauge("round", "number of the current rendezvous round", namespace=ns, registry=registry)
        self.resets = prom.Counter("resets", "rounds formed after the first", namespace=ns, registry=registry)
        self.rollbacks = prom.Counter("rollbacks", "rollbacks to the last commit", namespace=ns, registry=registry)
        self.steps_lost = prom.Counter("steps_lost", "steps trained and then rolled back", namespace=ns,
                                       registry=registry)
        self.notices = prom.Counter("notices", "termination or maintenance notices", ["source"], namespace=ns,
                                    registry=registry)
        self.worker_failures = prom.Counter("worker_failures", "workers that failed", namespace=ns, registry=registry)
        # Not failures: a host still booting before the first round is tried again at the shortest cooldown.
        self.host_unreachable = prom.Counter("host_unreachable", "launches on a host not reachable yet at start-up",
                                             namespace=ns, registry=registry)
        self.checkpoint_failures = prom.Counter("checkpoint_failures", "durable checkpoints that could not be written",
                                                namespace=ns, registry=registry)
        self.workers_left = prom.Counter("workers_left", "workers that left gracefully", namespace=ns,
                                         registry=registry)
        # Counted in commits, not steps: a script that commits every N steps makes one commit of N steps.
        self.last_commit = prom.Gauge("last_commit", "rank 0's last commit, counted in commits (state.commit() "
                                      "calls) since the job began", namespace=ns, registry=registry)
        self.step_rate = prom.Gauge("steps_per_second", "optimizer steps per second rank 0 takes (30 s window; "
                                    "NaN while unknown)", namespace=ns, registry=registry)
        self.step_rate.set(float("nan"))  # unknown until rank 0's heartbeats report optimizer steps
        self.discovery_latency = prom.Histogram(
            "discovery_latency_seconds", "time one discovery call took", namespace=ns, registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.discovery_errors = prom.Counter("discovery_errors", "discovery calls that failed", ["kind"],
                                             namespace=ns, registry=registry)
        # From the ``cost`` events of a job with several priced host sources (docs/multi-source.md).
        self.cost = prom.Counter("cost_dollars", "dollars the job's workers have cost so far", namespace=ns,
                                 registry=registry)
        self.cost_rate = prom.Gauge("cost_dollars_per_hour", "dollars per hour the job's workers cost now",
                                    namespace=ns, registry=registry)
        # Not in cost_dollars: slots whose host had no known price (status and the events report them apart).
        self.unpriced = prom.Counter("cost_unpriced_slot_hours", "slot-hours of workers whose host had no known "
                                     "price (not in cost_dollars)", namespace=ns, registry=registry)
        # In cost_dollars: the free slots of hosts a raised fallback group brought that ran no worker (fixI's status).
        self.idle = prom.Counter("cost_idle_slot_hours", "slot-hours of free slots on hosts of a fallback group the "
                                 "job raised that ran no worker there (in cost_dollars)", namespace=ns,
                                 registry=registry)
        self._dollars = self._unpriced_hours = self._idle_hours = 0.0
        self.spares = prom.Gauge("spares", "spares ready outside the rounds (--spares)", namespace=ns,
                                 registry=registry)

    @property
    def address(self) -> tuple[str, int]:
        """The address and port it listens on (RuntimeError before :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("metrics server not started")
        return self._server.address

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self) -> None:
        """Bind and serve; OSError if the port is taken. Logs where (with port 0, the port the system chose)."""
        server = ScrapeServer(self._render, bind=self._bind, port=self._port)
        server.start()
        self._server = server
        host = f"[{self._bind}]" if ":" in self._bind else self._bind
        log.info("job %s: Prometheus metrics at http://%s:%d/metrics", self.job_id, host, self.port)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def _render(self, accept: str) -> tuple[bytes, str]:
        """The exposition of the registry in the format the scraper accepts (prometheus_client chooses)."""
        encoder, content_type = self._prom.exposition.choose_encoder(accept)
        return encoder(self.registry), content_type

    def emit(self, kind: str, **fields: Any) -> None:
        """Update the metrics an event implies (EventSink)."""
        validate(kind, fields)
        with self._lock:
            if kind == "round_formed":
                self.world_size.set(fields["size"])
                self.round.set(fields["round"])
                self._rounds += 1
                if self._rounds > 1:
                    self.resets.inc()
                if fields.get("step") is not None:  # the commit it continues from
                    self.last_commit.set(fields["step"])
            elif kind == "rollback":
                self.rollbacks.inc()
                self.steps_lost.inc(fields["steps_lost"])
            elif kind == "notice":
                self.notices.labels(source=fields["source"]).inc()
            elif kind == "worker_failed":
                (self.host_unreachable if fields.get("booting") else self.worker_failures).inc()
            elif kind == "checkpoint_failed":
                self.checkpoint_failures.inc()
            elif kind == "worker_left":
                self.workers_left.inc()
            elif kind == "spares":
                self.spares.set(fields["ready"])
            elif kind == "cost":
                self._charge(fields["dollars"], fields.get("unpriced_slot_hours"), fields.get("idle_slot_hours"))
                self.cost_rate.set(fields["dollars_per_hour"])
            elif kind == "job_finished":
                self.world_size.set(0)
                self.step_rate.set(0)
                self.cost_rate.set(0)
                self.spares.set(0)
                if fields.get("cost") is not None:
                    self._charge(fields["cost"], fields.get("unpriced_slot_hours"), fields.get("idle_slot_hours"))

    def carry_cost(self, dollars: float, unpriced_slot_hours: float = 0.0, idle_slot_hours: float = 0.0) -> None:
        """Start the cost counters at what the job cost under a previous driver, before the first scrape: a
        counter seen at 0 and then at the carried total would read to Prometheus as a reset and a rise,
        and ``increase()`` would count the carried dollars twice."""
        with self._lock:
            self._charge(dollars, unpriced_slot_hours, idle_slot_hours)

    def _charge(self, dollars: float, unpriced_slot_hours: float | None = None,
                idle_slot_hours: float | None = None) -> None:
        """Raise the counters to the running totals an event carries (a counter only grows)."""
        self._dollars = _raise_to(self.cost, self._dollars, dollars)
        self._unpriced_hours = _raise_to(self.unpriced, self._unpriced_hours, unpriced_slot_hours)
        self._idle_hours = _raise_to(self.idle, self._idle_hours, idle_slot_hours)

    def observe_discovery(self, latency_s: float, error: str | None = None) -> None:
        """Record one discovery call: its latency and, if it failed, the kind of error
        (e.g. ``"retryable"`` or ``"fatal"``)."""
        with self._lock:
            self.discovery_latency.observe(latency_s)
            if error is not None:
                self.discovery_errors.labels(kind=error).inc()

    def observe_progress(self, steps: int, commit: int, source: str) -> None:
        """Record rank 0's heartbeat: ``steps``, the optimizer steps its process (``source``, its worker id)
        has taken in all, and ``commit``, the job's last commit it holds (counted in commits)."""
        with self._lock:
            self._rate.add(self._clock(), steps, source)
            self.last_commit.set(commit)
            rate = self._rate.known
            self.step_rate.set(float("nan") if rate is None else rate)
