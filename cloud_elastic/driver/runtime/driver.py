"""The driver runtime: threads and I/O around the pure :class:`~cloud_elastic.driver.job.elastic_job.ElasticJob`.

:meth:`Driver.run` is one sequence: the start plan (:func:`~cloud_elastic.driver.restart.predecessor.plan_start`:
the job's identity, resume or adopt, how long a dead predecessor's workers may still train), the
endpoints (:class:`~cloud_elastic.driver.net.endpoints.Endpoints`: control server, rendezvous store,
codec), the adoption window when adopting (:class:`~cloud_elastic.driver.restart.window.AdoptionWindow`),
the control plane (:class:`~.control_plane.ControlPlane`), then the loop that carries out the
job's actions (launch, stop, release, finish) and watches worker processes, and shutdown.

Threads, all at the edges: the discovery poller, the control-plane server's
one ``selectors`` thread (long-polls are held replies, not threads), the store's, one
output reader per worker, with ``--checkpoint-dir`` the refresher of the
driver's sign of life beside the checkpoints, and the loop thread (the caller of
:meth:`Driver.run`). Every access to the job happens under one lock
(:class:`~.condition.JobCondition`); nothing slow (provider calls, process
starts, process stops) ever runs under it.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from typing import Any, Callable

from cloud_elastic.config import JobConfig
from cloud_elastic.control import round_namespace
from cloud_elastic.driver.job.actions import INTERRUPTED, SetCapacity
from cloud_elastic.driver.job.elastic_job import Finish, Launch, Release, Stop
from cloud_elastic.driver.job.notice_policy import watched_cloud
from cloud_elastic.driver.job.spares import launch_room
from cloud_elastic.driver.job.stopping import STOP_GRACE_S  # a first signal's graceful stop (a failing job's too)
from cloud_elastic.driver.launch.api import Launcher
from cloud_elastic.driver.net.control_server import Held
from cloud_elastic.driver.net.endpoints import Endpoints
from cloud_elastic.driver.net.ports import retrying_taken
from cloud_elastic.driver.restart.finished import mark_succeeded
from cloud_elastic.driver.restart.predecessor import (
    ADOPT_MARGIN_S,
    RECORD_TOUCH_S,
    StartPlan,
    open_store,
    plan_start,
    wait_for_predecessor,
)
from cloud_elastic.driver.restart.record import AdoptionRecord, SuccessorRecord, remove_record
from cloud_elastic.driver.restart.window import AdoptionWindow
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.costs import charge, final_cost, stop_meter
from cloud_elastic.driver.runtime.control_plane import RENDEZVOUS_POLL_S, ControlPlane
from cloud_elastic.driver.runtime.discovery import (
    DISCOVERY_TIMEOUT_S,
    MAX_BACKOFF_S,
    DiscoveryFailure,
    DiscoveryPoller,
)
from cloud_elastic.driver.runtime.processes import WorkerProcesses
from cloud_elastic.driver.runtime.pulse import Pulse
from cloud_elastic.driver.runtime.startup import adopted_hosts, choose_address, first_discovery, new_job
from cloud_elastic.driver.runtime import raised
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery
from cloud_elastic.records import job_dir, remove_driver_record, write_driver_record

__all__ = ["Driver"]

log = logging.getLogger(__name__)

_TICK_S = 0.05


class Driver:
    """Runs one elastic job to its end. ``run()`` blocks and returns the outcome (see module docstring)."""

    def __init__(
        self,
        config: JobConfig,
        discovery: HostDiscovery,
        *,
        job_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        output: Callable[[str], None] | None = None,
        launcher: Launcher | None = None,
        discovery_timeout_s: float = DISCOVERY_TIMEOUT_S,
    ) -> None:
        """``launcher``, when given, starts every worker (e.g. as Ray actors); by default loopback hosts
        get local child processes and the others SSH. No discovery call is waited for longer than
        ``discovery_timeout_s`` (see :mod:`.discovery`)."""
        self.config = config
        self._discovery_timeout_s = discovery_timeout_s
        self.job_id = job_id or secrets.token_hex(4)
        self._discovery = discovery
        self._clock = clock
        self._cond = JobCondition()  # also wakes held heartbeats and rendezvous requests, only on their news
        self._job = new_job(config, discovery, self.job_id)
        self._cond.watch(self._job)
        self._stop_reason: tuple[str, int] | None = None
        self._stop_now = False  # False while a signal's graceful stop may still keep the state (see interrupt)
        # Under --whole-hosts a spare is a whole host: its slots are workers too.
        self._endpoints = Endpoints(self.job_id, self._handle, workers=launch_room(
            0, max_np=config.max_np, spares=config.spares, host_slots=config.whole_host_slots))
        self._processes = WorkerProcesses(config, self._job, self._cond, self._endpoints, clock=clock,
                                          sinks=lambda: self._sinks, out=output or _print_line, launcher=launcher)
        self._plane: ControlPlane | None = None
        self._window: AdoptionWindow | None = None
        self._successor: SuccessorRecord | None = None  # our adoption record, for a driver restarted after us
        self._kept_round = 1  # the oldest round whose store keys are still kept (see _forget_old_rounds)
        self._poller: DiscoveryPoller | None = None
        self._sinks: Any = None  # events file and metrics, opened by run()
        self._status_recorded = False
        self._started_at = clock()
        self._touched = 0.0
        self._durable: Any = None  # the CheckpointStore of --checkpoint-dir, opened by run()
        self._alive_refresher: Any = None  # keeps our own sign of life fresh beside the checkpoints
        self._carried: dict[str, int] = {}  # host groups a crashed predecessor raised, not yet taken over
        self._carried_cost: Any = None  # what the job cost under a crashed predecessor, not yet taken over
        self._predecessor_gone = True  # False while an earlier driver's workers may still be running
        self._stopped_at: float | None = None  # when shutdown had stopped every worker (the cost ends there)

    # ----------------------------------------------------------------- public
    def stop(self, reason: str, exit_code: int) -> None:
        """Ask the job to end now; workers are stopped by run()."""
        with self._cond:
            if self._stop_reason is None:
                self._stop_reason = (reason, exit_code)
            self._stop_now = True
            self._cond.notify_all()

    def interrupt(self, reason: str, exit_code: int) -> None:
        """A SIGINT or SIGTERM (signal handlers call this). The first, with ``--checkpoint-dir``, stops the job
        gracefully: its workers stop at their next commit and rank 0 checkpoints it, for up to
        :data:`STOP_GRACE_S`; a second one, or one without checkpoints, stops it now."""
        with self._cond:
            if self._stop_reason is None:
                self._stop_reason = (reason, exit_code)
            else:
                self._stop_reason, self._stop_now = (reason, exit_code), True
            self._cond.notify_all()

    def run(self) -> Finish:
        """Run the job to its end; always stops every worker it started.

        Raises ConfigError before anything starts when the events file cannot be
        opened, the metrics port cannot be bound, or the job is already running
        (``--checkpoint-dir``); CheckpointError when the checkpoint storage cannot be read.
        """
        from cloud_elastic.events import open_sinks

        self._durable = open_store(self.config)
        plan = plan_start(self.config, self._durable, job_id=self.job_id)
        self._set_job_id(plan.job_id)
        self._predecessor_gone = plan.predecessor_gone
        self._carried = raised.carried(plan.previous_alive)  # taken over once this driver runs the job
        self._carried_cost = raised.carried_cost(plan.previous_alive)
        if plan.resumed:
            self._resume()
        self._sinks = open_sinks(self.job_id, self.config.events_file, self.config.metrics_port,
                                 metrics_addr=self.config.metrics_addr)
        sourcing, metrics = self._job.capacity.sourcing, self._sinks.metrics
        if metrics is not None and self._carried_cost is not None and sourcing is not None and sourcing.active:
            # Before any scrape: a counter at 0 until inherit_cost (after --driver-grace) would read as a reset.
            carried = self._carried_cost
            metrics.carry_cost(carried.dollars, carried.unpriced_slot_hours, carried.idle_slot_hours)
        started = time.time()
        self._sinks.sink.emit(
            "job_started", num_proc=self.config.num_proc, min_np=self.config.min_np, max_np=self.config.max_np,
            provider=self._provider(), command=list(self.config.command),
        )
        outcome = Finish(False, "the driver failed", 1)
        pulse = Pulse(self._pulse_beat)  # busy threads are not a stalled driver (see .pulse)
        pulse.start()
        try:
            plan = self._listen_for_adoption(plan)
            if self._window is not None:
                self._keep_alive_beside_checkpoints()
                self._start_adopting(self._window, plan)
            else:
                # Not before the wait: a predecessor that turns out alive elsewhere refreshes the entry, and our
                # own writes would hide it (and our last one, "stopped", would deny it). Our claim of the job's
                # next driver generation speaks for us meanwhile (see .restart.predecessor).
                self._wait_for_predecessor(plan)
                self._keep_alive_beside_checkpoints()
                self._start()
            if self._stop_reason is None:  # this driver runs the job: a crashed predecessor's groups are its own
                with self._cond:
                    raised.inherit(self._job, self._carried)
                    raised.inherit_cost(self._job, self._carried_cost, plan.previous_alive)
                    self._carried, self._carried_cost = {}, None
                    raised.remember(self._job, self._alive_refresher, self._carried)
            outcome = self._loop()
            return outcome
        finally:
            self._shutdown()
            self._flush_events()
            verdict = _verdict(outcome)
            with self._cond:
                # Charged until the workers had stopped, not through the groups' lowering after it.
                cost = final_cost(self._job, self._stopped_at if self._stopped_at is not None else self._clock())
            if cost.line:
                log.info("%s", cost.line)
            self._sinks.sink.emit("job_finished", outcome=verdict, exit_code=outcome.exit_code,
                                  resets=self._job.resets, wall_s=round(time.time() - started, 3),
                                  reason=outcome.reason, **cost.fields)
            self._sinks.close()
            pulse.close()

    def _pulse_beat(self) -> None:
        with self._cond:
            self._job.running(self._clock())

    def _handle(self, kind: str, msg: dict[str, Any]) -> dict[str, Any] | Held:
        """The control server's handler: the control plane (built before anything listens)."""
        assert self._plane is not None
        return self._plane.handle(kind, msg)

    def _set_job_id(self, job_id: str) -> None:
        self.job_id = job_id
        self._job.job_id = job_id
        self._endpoints.job_id = job_id

    def _resume(self) -> None:
        """The first round loads the latest checkpoint (and, one existing, checkpoints that keep failing only warn:
        see ControlPlane._checkpoint)."""
        with self._cond:
            self._job.resumed = True
            self._job.state_committed = True
            self._job.discovery.answered_before = True  # a "fatal" error now may pass (see .job.discovery_edge)

    def _provider(self) -> str:
        return str(getattr(self._discovery, "name", "") or type(self._discovery).__name__)

    def _control_plane(self, window: AdoptionWindow | None) -> ControlPlane:
        return ControlPlane(self._job, self._cond, self.config, sinks=self._sinks, clock=self._clock, stop=self.stop,
                            record_events=self._emit_events, provider=str(getattr(self._discovery, "name", "")),
                            started_at=self._started_at,
                            watch_cloud=watched_cloud(self.config.notice_watcher, getattr(self._discovery, "name", "")),
                            interceptor=window)

    # ---------------------------------------------------------------- startup
    def _listen_for_adoption(self, plan: StartPlan) -> StartPlan:
        """Build the control plane; when the plan adopts, in front of it the adoption window, and listen at
        once where the predecessor listened, with its secret (its workers poll there). Returns the plan,
        without the adoption when those ports cannot be bound (:meth:`_listen_where_predecessor_did`)."""
        record = plan.adopt
        if record is None:
            self._plane = self._control_plane(None)
            return plan
        window = AdoptionWindow(record, self._job, self._cond, rules=lambda kind, msg: self._plane.by_rules(kind, msg),
                                clock=self._clock, started_at=self._started_at,
                                heartbeat_timeout_s=self.config.heartbeat_timeout_s,
                                rendezvous_hold_s=RENDEZVOUS_POLL_S)
        self._plane = self._control_plane(window)
        window.open()  # before the server answers anyone: a worker may reach it the moment it listens
        if not self._listen_where_predecessor_did(record):
            window.give_up()
            self._plane = self._control_plane(None)
            return plan.without_adoption()
        self._window = window
        self._job.silence.driver_address = f"{record.advertised}:{record.control_port}"
        return plan

    def _listen_where_predecessor_did(self, record: AdoptionRecord) -> bool:
        """Start the endpoints at the predecessor's address, ports and secret; whether they listen. A port another
        socket holds is tried again while its workers are worth adopting (:mod:`cloud_elastic.driver.net.ports`:
        the job would wait that long for them before resuming anyway); each outcome is said in one line."""
        where = f"{record.bind} (control port {record.control_port}, store port {record.store_port})"
        began, retried = time.time(), []

        def taken(exc: OSError, left: float) -> None:
            retried.append(left)
            log.warning("job %s: cannot listen at the previous driver's %s yet: %s (another socket holds the port); "
                        "trying again for up to %.0fs, while its workers may still come back", self.job_id, where, exc,
                        left)

        try:
            retrying_taken(lambda: self._endpoints.start(
                record.bind, advertised=record.advertised, control_port=record.control_port,
                store_port=record.store_port, secret=record.secret), until=record.grace_ends - ADOPT_MARGIN_S,
                wait=self._stopped_within, taken=taken)
        except OSError as exc:
            log.warning("job %s: cannot listen at the previous driver's %s%s: %s; its %d running worker(s) cannot be "
                        "adopted: they stop at the end of their --driver-grace, and the job then resumes from the "
                        "latest checkpoint", self.job_id, where,
                        f" after trying for {time.time() - began:.0f}s" if retried else "", exc, len(record.workers))
            return False
        log.info("job %s: listening at the previous driver's %s (control port %d, store port %d)%s", self.job_id,
                 self._endpoints.advertised, self._endpoints.control_port, self._endpoints.store_port,
                 f", after {time.time() - began:.1f}s of trying" if retried else "")
        return True

    def _stopped_within(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True as soon as the job is stopped."""
        with self._cond:
            return self._cond.wait_for(lambda: self._stop_reason is not None, seconds)

    def _start(self) -> None:
        first = self._first_discovery()
        if first is None:
            return
        with self._cond:
            self._job.discovered(first, self._clock())
            hosts = list(first.ready) + list(first.draining)
        advertised, bind = choose_address(self.config, hosts)
        self._endpoints.start(bind, advertised=advertised)
        self._job.silence.driver_address = f"{advertised}:{self._endpoints.control_port}"
        self._record_for_status()
        log.info(
            "job %s: driver at %s (control port %d, store port %d), -np %d --min-np %d --max-np %d",
            self.job_id, advertised, self._endpoints.control_port, self._endpoints.store_port,
            self.config.num_proc, self.config.min_np, self.config.max_np,
        )
        self._start_polling()

    def _start_polling(self) -> None:
        # Failing calls are spaced out, but by at most a tenth of --elastic-timeout: a job waiting below --min-np
        # sees the hosts of discovery's next answer at most that much late.
        self._poller = DiscoveryPoller(self._discovery, self._on_discovery, interval_s=self.config.discovery_interval_s,
                                       max_backoff_s=min(MAX_BACKOFF_S, self.config.elastic_timeout_s / 10),
                                       call_timeout_s=self._discovery_timeout_s, meanwhile=self._while_discovery_fails)
        self._poller.start()

    def _while_discovery_fails(self) -> str:
        """What the job does while discovery fails, for the poller's lines (see :mod:`cloud_elastic.driver.job.discovery_edge`)."""
        with self._cond:
            hosts, workers = len(self._job.hosts.ready), len(self._job.active())
        return (f"; the job trains on with its current {hosts} host(s) and {workers} worker(s), but cannot see new "
                "hosts, reclaims announced only through discovery, or a scale-in until discovery answers; it ends only "
                f"below --min-np {self.config.min_np} for --elastic-timeout {self.config.elastic_timeout_s:g}s")

    def _start_adopting(self, window: AdoptionWindow, plan: StartPlan) -> None:
        """Let the predecessor's workers re-register (they may have begun already), then carry on with them.

        Workers that do not come back within the adoption window are stopped and
        count as lost (the job's failure path: a new round, survivors roll back).
        When none comes back, this is the plain resume: wait out the grace, then
        resume from the latest checkpoint.
        """
        self._record_for_status()
        log.info("job %s: driver at %s (control port %d, store port %d) again", self.job_id,
                 self._endpoints.advertised, self._endpoints.control_port, self._endpoints.store_port)
        with self._cond:
            self._job.discovery.answered_before = True  # a "fatal" error now may pass: never stop what we adopt
        first = self._first_discovery(once=True)  # the workers re-register meanwhile, on the server's thread
        # A first signal with --checkpoint-dir stops gracefully: the window still runs its short course, so that the
        # predecessor's workers are adopted and stop at a commit with a checkpoint. Cut short, those not yet back were
        # stopped as missing, and the job resumed from an older checkpoint than they held (review h13: step 1 of 60).
        # A second signal, or one without checkpoints, stops now.
        closed = window.wait(lambda: self._stop_now or (self._stop_reason is not None and self._durable is None))
        if closed.adopted:
            self._predecessor_gone = True  # the missing ones are being stopped below, and joined at shutdown
            log.warning("job %s: adopted %d running worker(s) %.2fs after the driver started", self.job_id,
                        len(closed.adopted), closed.adopted_after_s)
        for w in closed.missing:
            self._processes.stop_missing(w)
        for w in closed.adopted:  # first: a worker that exits meanwhile is attached to, not missed for a slow fetch
            self._processes.adopt(w)
        window.fetch_exit_reports(closed.missing, self._processes.launcher_for, self._processes.adopted_spec,
                                  self.config.ssh.connect_timeout_s)
        going_on = self._stop_reason is None and self._job.outcome is None
        if first is None and going_on and not closed.adopted:  # nobody trains: a resume needs discovery's answer
            first = self._first_discovery()
        if first is not None and not closed.adopted:
            log.warning("job %s: no worker of the previous driver came back; resuming as without them",
                        self.job_id)
            self._wait_for_predecessor(plan)
        with self._cond:
            if first is not None:
                self._job.discovered(first, self._clock())
            elif closed.adopted and self._job.outcome is None:  # discovery failed, or a signal came first (a graceful
                # stop then runs with them): its workers train, or stop at a commit, where they are
                self._job.discovery.assume(adopted_hosts(closed.adopted), len(closed.adopted), self._clock())
            window.close()
        if first is not None or (going_on and closed.adopted):
            self._start_polling()

    def _wait_for_predecessor(self, plan: StartPlan) -> None:
        """A driver of this job that died without cleaning up may have left workers training on for its
        ``--driver-grace``: wait until they have stopped (see :func:`.predecessor.wait_for_predecessor`)."""

        waited = wait_for_predecessor(plan, self._durable, self._stopped_within, self.stop, resumed=self._job.resumed)
        if waited.resumed and not self._job.resumed:
            self._resume()
        if waited.predecessor_gone:
            self._predecessor_gone = True

    def _keep_alive_beside_checkpoints(self) -> None:
        """From now on this driver runs the job: keep its sign of life fresh beside the checkpoints."""
        if self._durable is None or self._stop_reason is not None:
            return
        from cloud_elastic.checkpoint.alive import AliveRefresher

        self._alive_refresher = AliveRefresher(self._durable, self.job_id, self._workers_grace_s())
        with self._cond:
            raised.remember(self._job, self._alive_refresher, self._carried, self._carried_cost)
        self._alive_refresher.start()
        raised.write_ahead(self._discovery, self._alive_refresher)  # a raise on disk before it is sent

    def _workers_grace_s(self) -> float:
        """The grace our workers train on for without a driver (an adopted one got its first driver's)."""
        adopted = self._window.record.grace_s if self._window is not None else 0.0
        return max(self.config.driver_grace_s, adopted)

    def _first_discovery(self, once: bool = False) -> DiscoveredHosts | None:
        """Discover until it works; transient failures are retried within --start-timeout (see :mod:`.startup`).

        Returns None when the job ended meanwhile (a fatal error, the timeout, a signal), or with ``once`` when
        its one call failed. A call that hangs is given up on at --start-timeout if that comes before
        --discovery-timeout.
        """
        return first_discovery(self._job, self._cond, self._discovery, self.config, clock=self._clock,
                               stop_reason=lambda: self._stop_reason, call_timeout_s=self._discovery_timeout_s,
                               tick_s=_TICK_S, once=once)

    # --------------------------------------------------------------- the loop
    def _loop(self) -> Finish:
        while True:
            with self._cond:
                now = self._clock()
                if self._stop_reason is not None and self._job.outcome is None:
                    self._job.stop(*self._stop_reason, now, grace_s=0.0 if self._stop_now else STOP_GRACE_S)
                raised.share(self._job, self._discovery)  # what each fallback group can give, and who raised it
                self._job.tick(now)
                charge(self._job, now)
                actions = self._job.take_actions()
                # Each tick: what the sign of life says (groups raised, cost so far) is never a tick behind.
                raised.remember(self._job, self._alive_refresher, self._carried, self._carried_cost)
                current_round = self._job.round
                self._emit_events()
                outcome = self._job.outcome
                if not actions and outcome is None:
                    self._cond.wait(_TICK_S)
                self._cond.notify_all()
            for action in actions:
                if isinstance(action, Launch):
                    self._processes.launch(action)
                elif isinstance(action, Stop):
                    self._processes.stop(action)
                elif isinstance(action, Release) and self._poller is not None:
                    self._poller.release(action.host, action.instance)
                elif isinstance(action, SetCapacity) and self._poller is not None:
                    self._poller.set_capacity(action.source, action.hosts)
            if outcome is not None:
                return outcome
            self._processes.reap()
            self._forget_old_rounds(current_round)
            self._touch_record()
            self._keep_adoption_record()

    def _forget_old_rounds(self, current: int) -> None:
        """Delete the store keys of rounds before the last two: their groups formed (or were given up on) long
        ago, and the store would otherwise keep every round's keys until its bound."""
        store = self._endpoints.store
        if store is None:
            return
        while self._kept_round < current - 1:
            store.forget(round_namespace(self._endpoints.secret, self.job_id, self._kept_round))
            self._kept_round += 1

    def _touch_record(self) -> None:
        """Keep the status record's mtime fresh: a restarted driver reads it as this driver's last sign of life."""
        now = time.monotonic()
        if not self._status_recorded or now - self._touched < RECORD_TOUCH_S / 2:
            return
        self._touched = now
        try:
            os.utime(job_dir(self.job_id) / "driver.json")
        except OSError:
            log.debug("could not touch the status record", exc_info=True)

    # ---------------------------------------------------------- control plane
    def _on_discovery(self, result: Any) -> None:
        if self._sinks.metrics is not None and self._poller is not None:
            error = None if not isinstance(result, DiscoveryFailure) else ("fatal" if result.fatal else "retryable")
            self._sinks.metrics.observe_discovery(self._poller.last_latency_s, error)
        with self._cond:
            if isinstance(result, DiscoveryFailure):
                self._job.discovery_failed(result.message, fatal=result.fatal, now=self._clock())
            else:  # which groups the job set, as of this answer's find() (it may have sent a raise)
                raised.discovered(self._job, self._discovery, result, self._clock())
            self._cond.notify_all()

    # ----------------------------------------------------------------- status
    def _record_for_status(self) -> None:
        """Let ``cloud-elastic status`` on this machine find the job (records are private to this user)."""
        endpoints = self._endpoints
        host = "127.0.0.1" if endpoints.bind in ("0.0.0.0", "127.0.0.1") else endpoints.bind
        try:
            write_driver_record(self.job_id, f"{host}:{endpoints.control_port}", endpoints.secret,
                                command=self.config.command, grace_s=self._workers_grace_s())
            self._status_recorded = True
        except OSError as exc:  # status is a convenience; the job runs without it
            log.warning("job %s: cannot record the job for 'cloud-elastic status': %s", self.job_id, exc)

    def _keep_adoption_record(self) -> None:
        """Keep what a driver restarted after this one needs to adopt our workers (see :mod:`.restart.record`)."""
        if not self._status_recorded or not self._endpoints.started or self.config.checkpoint_dir is None:
            return  # without --checkpoint-dir a restarted driver cannot find this job again
        if self._successor is None:
            self._successor = SuccessorRecord(self.job_id, self.config.checkpoint_dir, self._workers_grace_s())
        with self._cond:
            workers = []
            for worker_id, proc in self._processes.procs.items():
                w = self._job.workers.get(worker_id)
                handle = getattr(proc, "handle", None)
                if w is not None and w.alive and handle is not None:
                    workers.append((worker_id, w.slot.host, w.slot.index, w.seq, handle))
            seq = max((w.seq for w in self._job.workers.values()), default=0)
            exited = self._job.adoption.exits()
        endpoints = self._endpoints
        self._successor.update(advertised=endpoints.advertised, bind=endpoints.bind,
                               control_port=endpoints.control_port, store_port=endpoints.store_port, seq=seq,
                               workers=workers, exited=exited)

    def _flush_events(self) -> None:
        with self._cond:
            self._emit_events()

    def _emit_events(self) -> None:
        """Write the job's queued events; under the lock, so that they are written in order, and
        before any reply that tells a worker what they record (a round that formed on a
        control-plane thread): a driver killed right after its reply leaves no round unrecorded."""
        for kind, fields in self._job.take_events():
            self._sinks.sink.emit(kind, **fields)

    # --------------------------------------------------------------- shutdown
    def _shutdown(self) -> None:
        if self._poller is not None:
            self._poller.close()
        self._processes.close()  # each TERM then KILL, in parallel; the launchers closed
        self._stopped_at = self._clock()
        with self._cond:
            stop_meter(self._job, self._stopped_at)
        raised.lower(self._job, self._discovery, self._cond, self._poller)  # no worker is left to need it
        with self._cond:
            charge(self._job, self._stopped_at)  # the last sign of life's cost: up to when the workers had stopped
            raised.remember(self._job, self._alive_refresher, self._carried, self._carried_cost)
        if self._alive_refresher is not None:
            # "Stopped" only when no worker of this job can be left: ours are, and the predecessor's too.
            self._alive_refresher.close(stopped=self._predecessor_gone)
        if self._durable is not None and self._job.outcome is not None and self._job.outcome.success:
            mark_succeeded(self._durable, self.job_id)  # a later start there says so (restart.finished)
        self._endpoints.close()  # every worker is stopped; in a Ray or Spark user's process it would serve on
        if self._status_recorded:
            remove_record(job_dir(self.job_id))  # every worker is stopped: nothing is left to adopt
            outcome = self._job.outcome  # kept a while for 'status JOB', which then says how it ended
            remove_driver_record(self.job_id, ended=f"{_verdict(outcome)}: {outcome.reason}" if outcome else None)
        try:
            self._discovery.close()
        except Exception:  # closing is best effort; the job's outcome is already decided
            log.debug("discovery close failed", exc_info=True)


def _verdict(outcome: Finish) -> str:
    """How the job ended in a word: its ``job_finished`` event's ``outcome``."""
    return "succeeded" if outcome.success else ("interrupted" if outcome.exit_code in INTERRUPTED else "failed")


_print_lock = threading.Lock()


def _print_line(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
