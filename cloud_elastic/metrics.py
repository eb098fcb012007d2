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

The world size and the step rate are read from the job itself at each scrape (:meth:`MetricsServer.follow`,
which the driver's control plane calls), as ``status`` shows them: no event says that a round's members are
gone before the next round forms, nor that rank 0's heartbeats stopped, and the figures the events leave
would read on for as long as the job waits for workers (up to ``--elastic-timeout``).

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
from dataclasses import dataclass
from typing import Any, Callable

from cloud_elastic.driver.net.scrape_server import ScrapeServer
from cloud_elastic.errors import ConfigError
from cloud_elastic.event_schema import validate

__all__ = ["LiveFigures", "MetricsServer", "STALE_HEARTBEATS", "StepRate"]

log = logging.getLogger(__name__)

_EXTRA_HINT = "--metrics-port needs the prometheus-client package: pip install 'cloud-elastic[metrics]'"

#: Rank 0's heartbeats that may be missed before its step rate reads 0 (see :meth:`StepRate.as_of`): one late
#: heartbeat is a busy process, four in a row a process that no longer reports (killed, its host lost).
STALE_HEARTBEATS = 4
#: How long the scrape thread waits for the job's lock before it serves the figures it read last
#: (:meth:`MetricsServer.follow`): a driver busy for long must not hold up every scrape.
LIVE_WAIT_S = 0.5
#: The job's figures read for one gauge serve the others read within this long: one scrape, one reading.
ONE_SCRAPE_S = 0.25


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

    def __init__(self, window_s: float = 30.0, stale_s: float = STALE_HEARTBEATS * 0.5) -> None:
        self.window_s = window_s
        #: How old the newest sample may be before :meth:`as_of` reads 0 (default: four heartbeats of 0.5 s).
        self.stale_s = stale_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._source = ""
        self._first: float | None = None  # when the process (source) sent its first count

    def add(self, now: float, step: int, source: str = "", *, stale_s: float | None = None) -> None:
        """One report of ``source``'s optimizer steps at ``now``; ``stale_s``, when given, replaces :attr:`stale_s`
        (the driver holds heartbeats longer in a very large group, so the next one comes later)."""
        if stale_s is not None:
            self.stale_s = stale_s
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

    def as_of(self, now: float) -> float | None:
        """What ``status`` and the metric show at ``now``: :attr:`known`, but 0 once the newest sample is more than
        :attr:`stale_s` old. Samples come only with rank 0's heartbeats: once they stop (rank 0 killed, the round
        over and no new rank 0 yet) nothing moves the window, and the last rate read on for as long as the job
        waited for workers, up to ``--elastic-timeout``, so an alert on a rate of 0 never fired."""
        if self._samples and now - self._samples[-1][0] > self.stale_s:
            return 0.0
        return self.known


@dataclass(frozen=True)
class LiveFigures:
    """The job's figures that no event keeps current, as ``status`` shows them (see :meth:`MetricsServer.follow`)."""

    world_size: int
    #: Rank 0's optimizer steps per second (:meth:`StepRate.as_of`); None while unknown.
    steps_per_s: float | None


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
        self._world = 0  # the world size the events say (round_formed), served while nothing is followed
        self._live: Callable[[], LiveFigures | None] | None = None
        self._last_live: LiveFigures | None = None
        self._live_at = float("-inf")
        self._finished = False
        self._server: ScrapeServer | None = None
        self.registry = registry = prom.CollectorRegistry(auto_describe=True)
        ns = "cloud_elastic"
        self.info = prom.Info("job", "the job this driver runs", namespace=ns, registry=registry)
        self.info.info({"job": job_id})
        self.world_size = prom.Gauge("world_size", "workers in the current round (0 while none runs)", namespace=ns,
                                     registry=registry)
        self.world_size.set_function(lambda: self._figures().world_size)
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
                                    "NaN while unknown, 0 once rank 0 stops reporting)", namespace=ns,
                                    registry=registry)
        # NaN until rank 0's heartbeats report optimizer steps.
        self.step_rate.set_function(lambda: _nan_if_none(self._figures().steps_per_s))
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

    def follow(self, live: Callable[[], LiveFigures | None]) -> None:
        """Read the world size and the step rate from ``live`` at each scrape, not from events (see the module
        docstring). ``live`` runs on the scrape thread, never under this server's lock (it may take the job's,
        which the driver holds while it emits to this server); it returns None when it cannot answer at once,
        and the figures it gave last are served."""
        self._live = live

    def _figures(self) -> LiveFigures:
        """The world size and step rate to serve now (each scrape, see :meth:`follow`)."""
        live = self._live
        with self._lock:  # both gauges of one scrape read one instant, and take the job's lock once (review h15)
            if self._last_live is not None and self._clock() - self._live_at < ONE_SCRAPE_S:
                return self._last_live if not self._finished else LiveFigures(0, 0.0)
        figures = live() if live is not None and not self._finished else None
        with self._lock:
            if self._finished:
                return LiveFigures(0, 0.0)
            if figures is not None:
                self._last_live, self._live_at = figures, self._clock()
            elif self._last_live is None:
                return LiveFigures(self._world, self._rate.as_of(self._clock()))
            return self._last_live

    def _render(self, accept: str) -> tuple[bytes, str]:
        """The exposition of the registry in the format the scraper accepts (prometheus_client chooses)."""
        encoder, content_type = self._prom.exposition.choose_encoder(accept)
        return encoder(self.registry), content_type

    def emit(self, kind: str, **fields: Any) -> None:
        """Update the metrics an event implies (EventSink)."""
        validate(kind, fields)
        with self._lock:
            if kind == "round_formed":
                self._world = fields["size"]
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
                self._finished = True  # the world size and step rate read 0 from now on
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


def _nan_if_none(value: float | None) -> float:
    return float("nan") if value is None else value
