"""The driver runtime: threads and I/O around the pure :class:`~.job.ElasticJob`.

Threads, all at the edges: the discovery poller, the control-plane server's
one ``selectors`` thread (long-polls are held replies, not threads), one
output reader per worker, with ``--checkpoint-dir`` the refresher of the
driver's sign of life beside the checkpoints, and the loop thread (the caller of
:meth:`Driver.run`) that carries out the job's actions (launch, stop, finish)
and watches worker processes. Every access to the job happens under one lock
(:class:`~.waiters.JobCondition`); nothing slow (provider calls, process
starts, process stops) ever runs under it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import sys
import threading
import time
from typing import Any, Callable

from cloud_elastic.config import JobConfig
from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.discovery import DiscoveryFailure, DiscoveryPoller
from cloud_elastic.driver.hosts import Blacklist, HostManager, Slot
from cloud_elastic.driver.job import ElasticJob, Finish, Launch, Policy, Release, Stop
from cloud_elastic.protocol import (
    AdoptRequest,
    CompletedReport,
    CompletionReply,
    PollReply,
    PollRequest,
    ReRegister,
    RendezvousRequest,
    StacksReport,
    WaitReply,
)
from cloud_elastic.driver.launch import ExitStatus, Launcher, WorkerProcess, WorkerSpec, is_local_host
from cloud_elastic.driver.local import LocalLauncher
from cloud_elastic.driver.server import ControlServer, Held
from cloud_elastic.driver.waiters import JobCondition
from cloud_elastic.metrics import StepRate
from cloud_elastic.errors import CheckpointError, ConfigError, ControlPlaneError, LaunchError
from cloud_elastic.providers.api import DiscoveredHosts, Drain, HostDiscovery

__all__ = ["Driver"]

log = logging.getLogger(__name__)

_TICK_S = 0.05
_RENDEZVOUS_POLL_S = 10.0


class Driver:
    """Runs one elastic job to its end. ``run()`` blocks and returns the outcome."""

    def __init__(
        self,
        config: JobConfig,
        discovery: HostDiscovery,
        *,
        job_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        output: Callable[[str], None] | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        """``launcher``, when given, starts every worker (e.g. as Ray actors); by default loopback hosts
        get local child processes and the others SSH."""
        self.config = config
        self.job_id = job_id or secrets.token_hex(4)
        self._discovery = discovery
        self._clock = clock
        self._secret = new_secret()
        self._codec = Codec(self._secret, self.job_id)
        self._cond = JobCondition()  # also wakes held heartbeats and rendezvous requests, only on their news
        self._job = ElasticJob(
            Policy(
                num_proc=config.num_proc,
                min_np=config.min_np,
                max_np=config.max_np,
                reset_limit=config.reset_limit,
                elastic_timeout_s=config.elastic_timeout_s,
                start_timeout_s=config.start_timeout_s,
                heartbeat_timeout_s=config.heartbeat_timeout_s,
                completion_grace_s=config.completion_grace_s,
                checkpointing=config.checkpoint_dir is not None,
                progress_timeout_s=config.progress_timeout_s,
            ),
            HostManager(Blacklist(config.cooldown_range_s), missing_grace_s=config.host_missing_grace_s,
                        drain_soft=config.drain_on_rebalance),
            job_id=self.job_id,
        )
        self._cond.watch(self._job)
        self._procs: dict[str, WorkerProcess] = {}
        self._launchers: dict[str, Launcher] = {} if launcher is None else {"given": launcher}
        self._stop_reason: tuple[str, int] | None = None
        self._out = output or _print_line
        self._server: ControlServer | None = None
        self._store: Any = None
        self._store_socket: socket.socket | None = None
        self._store_lock = threading.Lock()  # the store's listening socket changes hands once, under it
        self._store_port = 0
        self._poller: DiscoveryPoller | None = None
        self._advertised: str | None = None
        self._stoppers: list[threading.Thread] = []
        self._sinks: Any = None  # events file and metrics, opened by run()
        self._status_recorded = False
        self._bind = "127.0.0.1"
        self._started_at = clock()
        self._rate = StepRate()  # rank 0's commits per second, for status
        self._watchers: dict[str, str] = {}  # host -> worker id running its metadata notice watcher
        self._watch_cloud = _watch_cloud(config.notice_watcher, getattr(discovery, "name", ""))
        self._previous: tuple[int, float] | None = None  # (pid, last alive) of a dead driver of this job
        self._touched = 0.0
        self._previous_grace_s = 0.0  # the --driver-grace the job record says an earlier driver gave its workers
        self._adoption: Any = None  # the predecessor's AdoptionRecord, when its workers may still be running
        self._adopting = False  # the adoption window is open: only polls and re-registrations are served
        self._adopt_saved: Any = None  # what the adoption record last said (rewritten when it changes)
        self._adopted_at = 0.0  # when the last worker re-registered (clock)
        self._durable_store: Any = None  # the CheckpointStore of --checkpoint-dir, opened by run()
        self._previous_alive: Any = None  # the DriverAlive a dead driver of this job left beside the checkpoints
        self._alive_refresher: Any = None  # keeps our own DriverAlive fresh there
        self._predecessor_gone = True  # False while an earlier driver's workers may still be running

    # ----------------------------------------------------------------- public
    def stop(self, reason: str, exit_code: int) -> None:
        """Ask the job to end (signal handlers call this); workers are stopped by run()."""
        with self._cond:
            if self._stop_reason is None:
                self._stop_reason = (reason, exit_code)
            self._cond.notify_all()

    def run(self) -> Finish:
        """Run the job to its end; always stops every worker it started.

        Raises ConfigError before anything starts when the events file cannot be
        opened or the metrics port cannot be bound.
        """
        from cloud_elastic.events import open_sinks

        self._listen_for_adoption()
        self._open_durable()
        self._sinks = open_sinks(self.job_id, self.config.events_file, self.config.metrics_port)
        started = time.time()
        self._sinks.sink.emit(
            "job_started", num_proc=self.config.num_proc, min_np=self.config.min_np, max_np=self.config.max_np,
            provider=str(getattr(self._discovery, "name", "") or type(self._discovery).__name__),
            command=list(self.config.command),
        )
        outcome = Finish(False, "the driver failed", 1)
        try:
            if self._adoption is not None:
                self._keep_alive_beside_checkpoints()
                self._start_adopting()
            else:
                self._wait_for_previous_driver()
                self._keep_alive_beside_checkpoints()
                self._start()
            outcome = self._loop()
            return outcome
        finally:
            self._shutdown()
            self._flush_events()
            verdict = "succeeded" if outcome.success else ("interrupted" if outcome.exit_code in (130, 143) else "failed")
            self._sinks.sink.emit("job_finished", outcome=verdict, exit_code=outcome.exit_code,
                                  resets=self._job.resets, wall_s=round(time.time() - started, 3),
                                  reason=outcome.reason)
            self._sinks.close()

    # ---------------------------------------------------------- durable state
    def _open_durable(self) -> None:
        """With ``--checkpoint-dir``: open the store, adopt the job identity recorded there, or record ours.

        A store that already holds a checkpoint of this job makes this a
        restarted driver: the job keeps its id and its first round loads the
        latest checkpoint. Raises ConfigError (a missing fsspec backend, the
        same job already running here) or CheckpointError (unreadable storage)
        before anything starts.
        """
        if self.config.checkpoint_dir is None:
            return
        from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, read_job_record, write_job_record

        store = CheckpointStore(self.config.checkpoint_dir, keep=self.config.checkpoint_keep)
        self._durable_store = store
        record = read_job_record(store)
        if record is None:
            write_job_record(store, DurableJobRecord(self.job_id, tuple(self.config.command), time.time(),
                                                     extra={"driver_grace_s": self.config.driver_grace_s}))
            log.info("job %s: checkpoints go to %s", self.job_id, store.url)
            return
        if record.command != tuple(self.config.command):
            log.warning("job %s was started with the command %s; resuming it with %s",
                        record.job_id, " ".join(record.command), " ".join(self.config.command))
        if self._adoption is not None and self._adoption.job_id != record.job_id:
            log.warning("job %s: %s belongs to job %s; not adopting the workers of job %s", self.job_id, store.url,
                        record.job_id, self._adoption.job_id)
            self._abandon_adoption()
        self._set_job_id(record.job_id)
        recorded_grace = record.extra.get("driver_grace_s")
        if isinstance(recorded_grace, (int, float)) and not isinstance(recorded_grace, bool):
            self._previous_grace_s = float(recorded_grace)
        if self._adoption is None:
            self._previous = _previous_driver(record.job_id)
        if self._previous is not None and _driver_alive(self._previous[0]):
            raise ConfigError(f"job {self.job_id} is already running here (driver pid {self._previous[0]}); "
                              "stop it first or use another --checkpoint-dir")
        self._previous_alive = _previous_alive(store, record.job_id)
        self._predecessor_gone = self._adoption is None and self._previous is None and self._previous_alive is None
        self._resume_from_checkpoints(announce_none=True)

    def _resume_from_checkpoints(self, *, announce_none: bool) -> None:
        """When the store holds a checkpoint of this job, the first round resumes from the newest one.

        Called when the store is opened and again after waiting out a dead
        predecessor's workers: they write their last checkpoints while we wait.
        """
        if self._durable_store is None or self._job.resumed:
            return
        store = self._durable_store
        checkpoints = store.list()
        if not checkpoints:
            if announce_none:
                log.info("job %s: resuming the job recorded in %s; it has no checkpoint yet, so training starts "
                         "over unless its workers still write one", self.job_id, store.url)
            else:
                log.info("job %s: the previous workers wrote no checkpoint to %s; training starts over",
                         self.job_id, store.url)
            return
        newest = checkpoints[0]
        log.warning("job %s: resuming from %s: the latest checkpoint is of step %d, written %s ago",
                    self.job_id, store.url, newest.step, _age(time.time() - newest.created))
        with self._cond:
            self._job.resumed = True
            self._job.state_committed = True

    def _set_job_id(self, job_id: str) -> None:
        self.job_id = job_id
        self._codec = Codec(self._secret, job_id)
        self._job.job_id = job_id

    def _wait_for_previous_driver(self) -> None:
        """A driver of this job that died without cleaning up may have left workers training on for its
        ``--driver-grace``; wait until they have stopped (and written their last checkpoint).

        Its last sign of life is the later of this machine's private record and
        the entry it refreshed beside the checkpoints (which is all a driver
        restarted on another machine has). Without this wait two generations of
        workers would train the same job and write checkpoints to the same place.
        """
        # The previous workers got the previous driver's grace; the record keeps the first driver's.
        grace = max(self.config.driver_grace_s, self._previous_grace_s)
        lives = []  # (last sign of life + how stale it can be, who)
        if self._previous is not None:
            pid, last_alive = self._previous
            lives.append((last_alive + _RECORD_TOUCH_S, f"the previous driver (pid {pid}) died "
                                                        f"{time.time() - last_alive:.0f}s ago"))
        if self._previous_alive is not None:
            from cloud_elastic.checkpoint.alive import ALIVE_RECORD, REFRESH_S

            entry = self._previous_alive
            grace = max(grace, entry.grace_s)
            lives.append((entry.alive + REFRESH_S, (
                f"the previous driver (pid {entry.pid} on {entry.host}) was last alive "
                f"{time.time() - entry.alive:.0f}s ago by {self._durable_store.backend.url(ALIVE_RECORD)}"
                + ("" if self._previous is not None else ", and this machine has no record of it"))))
        if lives:
            last, who = max(lives)
            left = last + grace + _LAST_CHECKPOINT_S - time.time()
            if left > 0:
                log.warning("job %s: %s; its workers train on for up to --driver-grace %gs: waiting %.0fs for them "
                            "to stop before starting new ones", self.job_id, who, grace, left)
                with self._cond:
                    if self._cond.wait_for(lambda: self._stop_reason is not None, left):
                        return  # interrupted: its workers may still run, which our last word must not deny
            self._check_no_other_driver()
            try:
                self._resume_from_checkpoints(announce_none=False)  # what the old workers wrote while we waited
            except CheckpointError as exc:
                self.stop(f"cannot read the checkpoints in {self.config.checkpoint_dir}: {exc}", 1)
        self._predecessor_gone = True

    def _check_no_other_driver(self) -> None:
        """After the wait: a driver elsewhere that refreshed the entry meanwhile is alive; leave the job to it."""
        if self._previous_alive is None or self._stop_reason is not None:
            return
        from cloud_elastic.checkpoint.alive import read_driver_alive

        try:
            now = read_driver_alive(self._durable_store)
        except CheckpointError as exc:
            log.warning("job %s: %s", self.job_id, exc)
            return
        if (now is not None and not now.stopped and now.alive > self._previous_alive.alive
                and not now.is_this_process()):
            self.stop(f"job {self.job_id} is already running: its driver (pid {now.pid} on {now.host}) was alive "
                      f"{max(0.0, time.time() - now.alive):.0f}s ago; stop it first or use another --checkpoint-dir",
                      2)

    def _keep_alive_beside_checkpoints(self) -> None:
        """From now on this driver runs the job: keep its sign of life fresh beside the checkpoints."""
        if self._durable_store is None or self._stop_reason is not None:
            return
        from cloud_elastic.checkpoint.alive import AliveRefresher

        grace = max(self.config.driver_grace_s, self._adoption.grace_s if self._adoption is not None else 0.0)
        self._alive_refresher = AliveRefresher(self._durable_store, self.job_id, grace).start()

    # ---------------------------------------------------------------- startup
    def _start(self) -> None:
        first = self._first_discovery()
        if first is None:
            return
        with self._cond:
            self._job.discovered(first, self._clock())
            hosts = list(first.ready) + list(first.draining)
        self._advertised, bind = self._choose_address(hosts)
        self._bind = bind
        self._start_store(bind)
        self._server = ControlServer(self._codec, self._handle, bind=bind)
        self._server.start()
        self._record_for_status()
        log.info(
            "job %s: driver at %s (control port %d, store port %d), -np %d --min-np %d --max-np %d",
            self.job_id, self._advertised, self._server.port, self._store_port,
            self.config.num_proc, self.config.min_np, self.config.max_np,
        )
        self._poller = DiscoveryPoller(self._discovery, self._on_discovery, interval_s=self.config.discovery_interval_s)
        self._poller.start()

    def _first_discovery(self) -> DiscoveredHosts | None:
        """Discover until it works; transient failures are retried within --start-timeout.

        Returns None when the job ended meanwhile (a fatal error, the timeout, a signal).
        """
        poller = DiscoveryPoller(self._discovery, lambda r: None, interval_s=self.config.discovery_interval_s)
        with self._cond:
            self._job.start(self._clock(), wall_now=time.time())
        said = ""
        while True:
            result = poller.poll_once()
            with self._cond:
                if self._stop_reason is not None:
                    self._job.stop(*self._stop_reason)
                    return None
                if not isinstance(result, DiscoveryFailure):
                    return result
                if result.message != said and not result.fatal:
                    said = result.message
                    log.warning("host discovery failed: %s; retrying (up to --start-timeout %gs)",
                                result.message, self.config.start_timeout_s)
                self._job.discovery_failed(result.message, fatal=result.fatal, now=self._clock())
                self._job.tick(self._clock())
                if self._job.outcome is not None:
                    return None
                self._cond.wait(self.config.discovery_interval_s)

    def _start_store(self, bind: str, port: int = 0) -> None:
        """Listen for the rendezvous store now; let torch adopt the socket on a side thread.

        Importing torch takes seconds. Workers need the store only after they
        have imported torch themselves, so they are launched at once and their
        connections wait in the listen backlog until the store takes over.
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind, port))
        sock.listen(512)
        self._store_socket = sock
        self._store_port = port = sock.getsockname()[1]

        def adopt() -> None:
            try:
                from torch.distributed import TCPStore  # torch only where a job runs

                with self._store_lock:
                    if self._store_socket is not sock:
                        return  # given up meanwhile (_abandon_adoption): the socket is closed
                    self._store = TCPStore(
                        bind, port, None, True, wait_for_workers=False, master_listen_fd=sock.fileno()
                    )
                    # The store owns the descriptor now and closes it when it goes: closing the
                    # socket too would close whatever later reuses the number.
                    sock.detach()
            except Exception as exc:  # reported as the job's failure
                self.stop(f"could not start the rendezvous store on port {port}: {exc}", 1)

        threading.Thread(target=adopt, name="rendezvous-store", daemon=True).start()

    def _choose_address(self, hosts: list[str]) -> tuple[str, str]:
        """(address workers use, address to bind). Loopback unless a remote host is involved."""
        if self.config.driver_address:
            addr = self.config.driver_address
            bind = "127.0.0.1" if is_local_host(addr) else "0.0.0.0"
            return addr, bind
        remote = [h for h in hosts if not is_local_host(h)]
        if not remote and not self.config.force_ssh:
            return "127.0.0.1", "127.0.0.1"
        target = remote[0] if remote else "127.0.0.1"
        addr = _route_address(target)
        log.info("--driver-address not given; workers will reach the driver at %s (route to %s)", addr, target)
        return addr, "0.0.0.0"

    # --------------------------------------------------------------- the loop
    def _loop(self) -> Finish:
        while True:
            with self._cond:
                if self._stop_reason is not None and self._job.outcome is None:
                    self._job.stop(*self._stop_reason)
                self._job.tick(self._clock())
                actions = self._job.take_actions()
                self._emit_events()
                outcome = self._job.outcome
                if not actions and outcome is None:
                    self._cond.wait(_TICK_S)
                self._cond.notify_all()
            for action in actions:
                if isinstance(action, Launch):
                    self._launch(action)
                elif isinstance(action, Stop):
                    self._stop_worker(action)
                elif isinstance(action, Release) and self._poller is not None:
                    self._poller.release(action.host, action.instance)
            if outcome is not None:
                return outcome
            self._reap()
            self._touch_record()
            self._keep_adoption_record()

    def _touch_record(self) -> None:
        """Keep the status record's mtime fresh: a restarted driver reads it as this driver's last sign of life."""
        now = time.monotonic()
        if not self._status_recorded or now - self._touched < _RECORD_TOUCH_S / 2:
            return
        self._touched = now
        from cloud_elastic.status import job_dir

        try:
            os.utime(job_dir(self.job_id) / "driver.json")
        except OSError:
            log.debug("could not touch the status record", exc_info=True)

    def _reap(self) -> None:
        ended: list[tuple[str, ExitStatus]] = []
        for worker_id, proc in list(self._procs.items()):
            status = proc.poll()
            if status is not None:
                ended.append((worker_id, status))
                del self._procs[worker_id]
        if ended:
            with self._cond:
                for worker_id, status in ended:
                    self._job.exited(worker_id, status, self._clock())
                self._cond.notify_all()

    def _launch(self, action: Launch) -> None:
        spec = self._spec(action)
        try:
            launcher = self._launcher_for(action.slot.host)
            proc = launcher.launch(spec, lambda line, wid=action.worker_id: self._forward(wid, line))
        except LaunchError as exc:
            log.error("job %s: %s", self.job_id, exc)
            with self._cond:
                self._job.exited(action.worker_id, ExitStatus(255, transport_error=str(exc)), self._clock())
            return
        self._procs[action.worker_id] = proc
        log.info("job %s: launched worker %s", self.job_id, action.worker_id)

    def _launcher_for(self, host: str) -> Launcher:
        if "given" in self._launchers:
            return self._launchers["given"]
        kind = "local" if is_local_host(host) and not self.config.force_ssh else "ssh"
        if kind not in self._launchers:
            if kind == "local":
                self._launchers[kind] = LocalLauncher()
            else:
                from cloud_elastic.driver.ssh import SSHLauncher

                self._launchers[kind] = SSHLauncher(self.config.ssh)
        return self._launchers[kind]

    def _spec(self, action: Launch) -> WorkerSpec:
        assert self._server is not None
        env = {
            "CLOUD_ELASTIC_DRIVER": f"{self._advertised}:{self._server.port}",
            "CLOUD_ELASTIC_STORE": f"{self._advertised}:{self._store_port}",
            "CLOUD_ELASTIC_JOB_ID": self.job_id,
            "CLOUD_ELASTIC_WORKER_ID": action.worker_id,
            "CLOUD_ELASTIC_HOSTNAME": action.slot.host,
            "CLOUD_ELASTIC_SLOT": str(action.slot.index),
            "CLOUD_ELASTIC_HEARTBEAT_INTERVAL_S": str(self.config.heartbeat_interval_s),
            "CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S": str(self.config.heartbeat_timeout_s),
            "CLOUD_ELASTIC_DRIVER_GRACE_S": str(self.config.driver_grace_s),
            "PYTHONUNBUFFERED": "1",
        }
        if self.config.checkpoint_dir is not None:
            env["CLOUD_ELASTIC_CHECKPOINT_DIR"] = self.config.checkpoint_dir
            env["CLOUD_ELASTIC_CHECKPOINT_INTERVAL_S"] = str(self.config.checkpoint_interval_s)
            env["CLOUD_ELASTIC_CHECKPOINT_KEEP"] = str(self.config.checkpoint_keep)
        if self.config.network_interface:
            env["CLOUD_ELASTIC_NETWORK_INTERFACE"] = self.config.network_interface
        # Several workers share a host's cores; one OpenMP thread each unless the user says otherwise.
        env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        for item in self.config.forward_env:
            name, sep, value = item.partition("=")
            if sep:
                env[name] = value
            elif name in os.environ:
                env[name] = os.environ[name]
        return WorkerSpec(
            worker_id=action.worker_id,
            host=action.slot.host,
            slot=action.slot.index,
            command=self.config.command,
            env=env,
            secret=self._secret,
            cwd=self.config.cwd,
            instance=self._job.hosts.instances.get(action.slot.host),
        )

    def _stop_worker(self, action: Stop) -> None:
        proc = self._procs.get(action.worker_id)
        if proc is None:
            return
        log.info("job %s: stopping worker %s: %s", self.job_id, action.worker_id, action.reason)
        if action.immediate:
            proc.kill()
        else:
            t = threading.Thread(target=proc.terminate, args=(self.config.terminate_grace_s,), daemon=True)
            t.start()
            self._stoppers.append(t)

    def _forward(self, worker_id: str, line: str) -> None:
        rank = self._job.rank_of(worker_id)  # a plain dict read; no lock needed for a label
        self._out(f"[{'-' if rank is None else rank}]<{worker_id.split('#')[0]}> {line}")

    # ---------------------------------------------------------- control plane
    def _on_discovery(self, result: Any) -> None:
        if self._sinks.metrics is not None and self._poller is not None:
            error = None if not isinstance(result, DiscoveryFailure) else ("fatal" if result.fatal else "retryable")
            self._sinks.metrics.observe_discovery(self._poller.last_latency_s, error)
        with self._cond:
            if isinstance(result, DiscoveryFailure):
                self._job.discovery_failed(result.message, fatal=result.fatal, now=self._clock())
            else:
                self._job.discovered(result, self._clock())
            self._cond.notify_all()

    def _handle(self, kind: str, msg: dict[str, Any], *, adoption_checked: bool = False) -> dict[str, Any] | Held:
        worker_id = msg.get("worker")
        if not isinstance(worker_id, str):
            raise ControlPlaneError("message lacks a worker id")
        with self._cond:
            now = self._clock()
            if self._adoption is not None and not adoption_checked:
                early = self._while_adopting(kind, worker_id, msg)
                if early is not None:
                    return early
            if kind == "register":
                ok = self._job.registered(worker_id, now)
                self._cond.notify_all()
                return {"ok": ok, "heartbeat_interval_s": self.config.heartbeat_interval_s,
                        "notice_watcher": self._notice_watcher(worker_id)}
            if kind == "rendezvous":
                return self._rendezvous(worker_id, msg)
            if kind == "poll":
                return self._poll(worker_id, msg)
            if kind == "completed":
                return self._completed(worker_id, msg, now)
            if kind == "stacks":
                return self._stacks(worker_id, msg)
            if kind == "notice":
                return self._notice(worker_id, msg, now)
            if kind == "checkpoint":
                return self._checkpoint(worker_id, msg)
            if kind == "status":
                return self._status(now)
        raise ControlPlaneError(f"unknown message kind {kind!r}")

    def _rendezvous(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any] | Held:
        request = RendezvousRequest.from_wire(msg)
        self._job.rendezvous(worker_id, request.last_round, request.reason, self._clock(), request.commits,
                             request.rolled_back, request.commit_seq, request.holds_commit)
        self._emit_events()  # a round this arrival formed is recorded before anyone is told of it
        # Only the requests this arrival answered (a round formed) are answered now; the
        # loop need not tick for an arrival, the job has already done what it changes.
        self._cond.wake()

        def check(final: bool) -> dict[str, Any] | None:
            reply = self._job.assignment(worker_id)
            return (reply or WaitReply()).to_wire() if reply is not None or final else None

        return check(False) or self._cond.hold_rendezvous(worker_id, check, _RENDEZVOUS_POLL_S)

    def _poll(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any] | Held:
        request = PollRequest.from_wire(msg)
        known = (request.round, request.update_gen, request.abort_round)
        if self._job.rank_of(worker_id) == 0:
            # The job's commit count, not this process's: it goes on when another worker becomes rank 0.
            self._rate.add(self._clock(), request.commit_seq)
            if self._sinks.metrics is not None:
                self._sinks.metrics.observe_step(request.commit_seq)

        def check(final: bool) -> dict[str, Any] | None:
            reply = self._job.heartbeat(worker_id, self._clock(), request.commits, request.commit_seq,
                                        request.progress, request.steps, request.waiting_s)
            if reply is None:
                return PollReply(0, 0, 0, True).to_wire()
            if (reply.round, reply.update_gen, reply.abort_round) != known or reply.shutdown or final:
                watcher = self._notice_watcher(worker_id)
                return (reply if watcher is None else dataclasses.replace(reply, notice_watcher=watcher)).to_wire()
            return None

        return check(False) or self._cond.hold_poll(check, self._poll_hold_s())

    def _completed(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any] | Held:
        """A worker's training function returned: held while it waits for rank 0's (see ElasticJob.completed)."""
        report = CompletedReport.from_wire(msg)
        decision, reason = self._job.completed(worker_id, now, commit_seq=report.commit_seq, steps=report.steps,
                                               error=report.error)
        self._cond.notify_all()
        if decision != "wait":
            return CompletionReply(decision, reason).to_wire()

        def check(final: bool) -> dict[str, Any] | None:
            answer = self._job.completion_reply(worker_id)
            if answer is None:
                return CompletionReply("wait").to_wire() if final else None
            return CompletionReply(*answer).to_wire()

        return self._cond.hold(check, 30.0)

    def _stacks(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any]:
        """A worker of a stuck round sent its stacks: into the log and the events file."""
        report = StacksReport.from_wire(msg)
        w = self._job.stacks_received(worker_id, report.request)
        if w is None:
            return {"ok": False}
        log.warning("job %s: stacks of worker %s (%s), round %d:\n%s", self.job_id, worker_id, w.label, w.round,
                    report.text.rstrip())
        self._sinks.sink.emit("stacks", worker=worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                              text=report.text, **({"round": w.round} if w.round else {}))
        self._cond.notify_all()
        return {"ok": True}

    def _poll_hold_s(self) -> float:
        """How long a heartbeat is held: the heartbeat interval, longer in a group so large that the
        driver would otherwise answer more than _POLLS_PER_S heartbeats a second, and never more
        than a quarter of the heartbeat timeout (a worker's silence is still found in time)."""
        interval = self.config.heartbeat_interval_s
        return max(interval, min(self.config.heartbeat_timeout_s / 4, self._job.alive_count / _POLLS_PER_S))

    def _notice_watcher(self, worker_id: str) -> str | None:
        """The cloud whose metadata notices this worker must watch, if it is its host's watcher.

        One watcher per host: the first live worker there; when it goes, the next
        worker of that host to heartbeat takes over.
        """
        if self._watch_cloud is None:
            return None
        w = self._job.workers.get(worker_id)
        if w is None or not w.alive:
            return None
        current = self._job.workers.get(self._watchers.get(w.slot.host, ""))
        if current is None or not current.alive:
            self._watchers[w.slot.host] = worker_id
            return self._watch_cloud
        return self._watch_cloud if current is w else None

    def _notice(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """A worker's metadata watcher saw a notice for its own host."""
        w = self._job.workers.get(worker_id)
        source, kind, reason, deadline = msg.get("source"), msg.get("notice"), msg.get("reason"), msg.get("deadline")
        if (
            not isinstance(source, str) or kind not in _NOTICE_KINDS or not isinstance(reason, str)
            or not (deadline is None or (isinstance(deadline, (int, float)) and not isinstance(deadline, bool)))
        ):
            raise ControlPlaneError("malformed notice message")
        if w is None:
            return {"ok": False}
        self._job.notice(w.slot.host, Drain(deadline=deadline, reason=reason[:200]), now, source=source[:40],
                         soft=kind != "terminate")  # the job drains on soft ones too under --drain-on-rebalance
        self._cond.notify_all()
        return {"ok": True}

    def _checkpoint(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any]:
        """Rank 0 wrote or loaded a durable checkpoint, or could not load one (the job then ends)."""
        event, step, path = msg.get("event"), msg.get("step"), msg.get("path")
        w = self._job.workers.get(worker_id)
        if w is None or not w.alive:
            return {"ok": False}
        if event == "failed":
            reason = msg.get("reason")
            if not isinstance(reason, str):
                raise ControlPlaneError("malformed checkpoint message")
            if self._stop_reason is None:
                self._stop_reason = (f"training state lost: cannot resume from the checkpoint: {reason[:300]}", 1)
            self._cond.notify_all()
            return {"ok": True}
        commit_seq = msg.get("commit_seq")  # of a load; older workers leave it out
        if (event not in ("saved", "loaded") or not isinstance(path, str) or not _is_int(step)
                or not (commit_seq is None or _is_int(commit_seq))):
            raise ControlPlaneError("malformed checkpoint message")
        if event == "saved":
            extra = {k: msg[k] for k in ("duration_s", "bytes") if _is_number(msg.get(k))}
            if "bytes" in extra and not _is_int(extra["bytes"]):
                del extra["bytes"]
            log.info("job %s: checkpoint of step %d saved by %s to %s", self.job_id, step, worker_id, path[:500])
            self._sinks.sink.emit("checkpoint_saved", step=step, path=path[:1000], **extra)
        else:
            self._job.checkpoint_loaded(step, commit_seq, path[:1000])  # logs the steps lost, emits the events
            self._cond.notify_all()
        return {"ok": True}

    # ----------------------------------------------------------------- status
    def _record_for_status(self) -> None:
        """Let ``cloud-elastic status`` on this machine find the job (records are private to this user)."""
        from cloud_elastic.status import write_driver_record

        assert self._server is not None
        host = "127.0.0.1" if self._bind in ("0.0.0.0", "127.0.0.1") else self._bind
        try:
            write_driver_record(self.job_id, f"{host}:{self._server.port}", self._secret, command=self.config.command)
            self._status_recorded = True
        except OSError as exc:  # status is a convenience; the job runs without it
            log.warning("job %s: cannot record the job for 'cloud-elastic status': %s", self.job_id, exc)

    def _status(self, now: float) -> dict[str, Any]:
        from cloud_elastic.driver.status import status_reply

        return status_reply(self._job, self.config, provider=str(getattr(self._discovery, "name", "")),
                            now=now, wall_now=time.time(), uptime_s=now - self._started_at,
                            steps_per_s=self._rate.rate if self._rate.rate > 0 else None).to_json()

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
        for proc in self._procs.values():  # stopped in parallel, each TERM then KILL
            self._stoppers.append(
                threading.Thread(target=proc.terminate, args=(self.config.terminate_grace_s,), daemon=True)
            )
            self._stoppers[-1].start()
        for t in self._stoppers:
            t.join(self.config.terminate_grace_s + 5)
        self._procs.clear()
        if self._alive_refresher is not None:
            # "Stopped" only when no worker of this job can be left: ours are, and the predecessor's too.
            self._alive_refresher.close(stopped=self._predecessor_gone)
        for launcher in self._launchers.values():
            launcher.close()
        if self._server is not None:
            self._server.close()
        if self._status_recorded:
            from cloud_elastic.driver.adoption import remove_record
            from cloud_elastic.status import job_dir, remove_driver_record

            remove_record(job_dir(self.job_id))  # every worker is stopped: nothing is left to adopt

            remove_driver_record(self.job_id)
        try:
            self._discovery.close()
        except Exception:  # closing is best effort; the job's outcome is already decided
            log.debug("discovery close failed", exc_info=True)

    # --------------------------------------------------------------- adoption
    def _listen_for_adoption(self) -> None:
        """With ``--checkpoint-dir``: if a driver of this job died here within its workers' grace, listen
        at once where it listened, with its secret, so that its workers re-register while this driver
        opens the checkpoint storage (seconds: that imports torch).

        Found by the checkpoint URL in this user's private driver records; the
        job id is confirmed against the storage's job record afterwards.
        """
        if self.config.checkpoint_dir is None:
            return
        from cloud_elastic.driver.adoption import find_records
        from cloud_elastic.status import runtime_root

        for record, pid, last_alive in find_records(runtime_root(), self.config.checkpoint_dir):
            if _driver_alive(pid) or not record.workers:
                continue  # a live driver is refused by _open_durable
            left = last_alive + record.grace_s - time.time()
            if left < _ADOPT_MARGIN_S:
                log.info("job %s: the previous driver died %.0fs ago, past its workers' --driver-grace %gs: "
                         "not adopting them", record.job_id, time.time() - last_alive, record.grace_s)
                return
            break
        else:
            return
        self._adoption, self._previous = record, (pid, last_alive)
        self._secret = record.secret
        self._set_job_id(record.job_id)
        self._advertised, self._bind = record.advertised, record.bind
        # The window opens before the server answers anyone: a worker that reaches this driver the
        # moment it listens would otherwise be refused as if it came too late, and exit.
        with self._cond:
            self._job.begin_adoption(record.seq)
            self._adopting = True
        try:
            self._start_store(record.bind, record.store_port)
            self._server = ControlServer(self._codec, self._handle, bind=record.bind, port=record.control_port)
            self._server.start()
        except OSError as exc:
            log.warning("job %s: cannot listen at the previous driver's address (%s); its workers cannot be "
                        "adopted", self.job_id, exc)
            self._abandon_adoption()
            return
        log.warning("job %s: the previous driver (pid %d) died %.0fs ago; adopting its %d running worker(s) "
                    "(they train on for up to %.0fs more) at %s (control port %d, store port %d)", self.job_id,
                    pid, time.time() - last_alive, len(record.workers), left, self._advertised, self._server.port,
                    self._store_port)

    def _abandon_adoption(self) -> None:
        """Back to a plain restart: stop listening at the predecessor's ports, forget its secret."""
        if self._server is not None:
            self._server.close()
            self._server = None
        with self._store_lock:
            if self._store_socket is not None:
                self._store_socket.close()  # a no-op once the store took the descriptor over
                self._store_socket = None
            self._store = None  # an adopted store closes its descriptor as it goes
        with self._cond:
            self._adoption, self._adopting = None, False
            self._job.adopting = False
        self._secret = new_secret()
        self._codec = Codec(self._secret, self.job_id)

    def _start_adopting(self) -> None:
        """Let the predecessor's workers re-register (they may have begun already), then carry on with them.

        Workers that do not come back within the adoption window are stopped and
        count as lost (the job's failure path: a new round, survivors roll back).
        When none comes back, this is the plain resume: wait out the grace, then
        resume from the latest checkpoint.
        """
        record = self._adoption
        assert self._server is not None
        self._record_for_status()
        log.info("job %s: driver at %s (control port %d, store port %d) again", self.job_id, self._advertised,
                 self._server.port, self._store_port)
        first = self._first_discovery()  # the workers re-register meanwhile, on the server's threads
        window = max(2 * self.config.heartbeat_timeout_s, 3.0)
        # Counted from the start, as the workers re-register while this driver imports torch and opens
        # the storage; but never closed less than a heartbeat timeout after this driver is ready, so a
        # slow start on a loaded machine does not leave a worker that is on its way no time.
        deadline = max(self._started_at + window, self._clock() + self.config.heartbeat_timeout_s)
        expected = {w.worker_id for w in record.workers}
        with self._cond:
            self._cond.wait_for(lambda: self._stop_reason is not None or expected <= set(self._job.workers),
                                max(0.0, deadline - self._clock()))
            missing = [w for w in record.workers if w.worker_id not in self._job.workers]
            waited = self._clock() - self._started_at
            self._job.end_adoption(self._clock(), {w.worker_id: f"did not re-register within {waited:.0f}s"
                                                   for w in missing})
            adopted = [w for w in record.workers if w.worker_id in self._job.workers]
        if adopted:
            self._predecessor_gone = True  # the missing ones are being stopped below, and joined at shutdown
            log.warning("job %s: adopted %d running worker(s) %.2fs after the driver started", self.job_id,
                        len(adopted), self._adopted_at - self._started_at)
        for w in missing:  # they may be stopped or hung: none must outlive the job
            proc = self._adopted_process(w)
            if proc is not None:
                t = threading.Thread(target=proc.terminate, args=(self.config.terminate_grace_s,), daemon=True)
                t.start()
                self._stoppers.append(t)
        for w in adopted:
            proc = self._adopted_process(w)
            if proc is not None:
                self._procs[w.worker_id] = proc
        if first is not None and not adopted:
            log.warning("job %s: no worker of the previous driver came back; resuming as without them",
                        self.job_id)
            self._wait_for_previous_driver()
        with self._cond:
            if first is not None:
                self._job.discovered(first, self._clock())
            self._adopting = False
            self._cond.notify_all()
        if first is not None:
            self._poller = DiscoveryPoller(self._discovery, self._on_discovery,
                                           interval_s=self.config.discovery_interval_s)
            self._poller.start()

    def _adopted_process(self, worker: Any) -> WorkerProcess | None:
        """A handle on a worker the predecessor started: by pid locally, through its remote wrapper over SSH."""
        from cloud_elastic.driver.adoption import AdoptedLocalProcess

        env = {}
        for item in self.config.forward_env:  # what the worker's launch forwarded (PYTHONPATH, say)
            name, sep, value = item.partition("=")
            if sep:
                env[name] = value
            elif name in os.environ:
                env[name] = os.environ[name]
        spec = WorkerSpec(worker.worker_id, worker.host, worker.slot, self.config.command, env, self._secret,
                          self.config.cwd)
        handle = worker.handle
        try:
            if handle.get("kind") == "local":
                start = handle.get("start")
                return AdoptedLocalProcess(spec, int(handle["pid"]), int(start) if start is not None else None)
            if handle.get("kind") == "ssh":
                launcher = self._launcher_for(worker.host)
                attach = getattr(launcher, "attach", None)
                if attach is not None:
                    return attach(spec, str(handle["nonce"]),
                                  lambda line, wid=worker.worker_id: self._forward(wid, line))
        except (KeyError, TypeError, ValueError, LaunchError) as exc:
            log.warning("job %s: cannot reach worker %s of the previous driver: %s", self.job_id, worker.worker_id, exc)
        return None

    def _while_adopting(self, kind: str, worker_id: str, msg: dict[str, Any]) -> dict[str, Any] | Held | None:
        """What a restarted driver answers before the job's rules see a message (None: let them).

        A worker of the predecessor not adopted yet is told to re-register;
        while the window is open, messages that would move the job (rendezvous,
        completion, notices) wait until it has closed and discovery has answered.
        """
        if kind == "adopt":
            return self._adopt_worker(worker_id, msg)
        if kind == "status" and self._sinks is None:
            raise ControlPlaneError("the driver is starting; ask again")
        if kind == "status":
            return None
        if kind == "poll" and self._sinks is None and worker_id in self._job.workers:
            # Before run() has opened the metrics: a plain heartbeat, no long-poll.
            request = PollRequest.from_wire(msg)
            reply = self._job.heartbeat(worker_id, self._clock(), request.commits, request.commit_seq)
            return (reply or PollReply(0, 0, 0, True)).to_wire()
        if worker_id not in self._job.workers and self._adoption.worker(worker_id) is not None:
            if kind == "poll":
                return PollReply(0, 0, 0, False, reregister=True).to_wire()
            if kind == "rendezvous":
                return ReRegister().to_wire()
        if self._adopting and kind in ("rendezvous", "completed", "notice", "checkpoint"):
            # Held, not waited for: the control-plane server answers every connection from one thread.
            def check(final: bool) -> dict[str, Any] | None:
                if self._adopting and not final:
                    return None
                if kind == "rendezvous":
                    return WaitReply().to_wire()  # it asks again, and is then served as usual
                reply = self._handle(kind, msg, adoption_checked=True)
                return reply if isinstance(reply, dict) else WaitReply().to_wire()

            return self._cond.hold(check, _RENDEZVOUS_POLL_S if kind == "rendezvous" else 60.0)
        return None

    def _adopt_worker(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any]:
        request = AdoptRequest.from_wire(msg)
        entry = self._adoption.worker(worker_id)
        if entry is None or entry.slot != request.slot:
            why = "not a worker of this job's previous driver"
        else:
            why = self._job.adopt(worker_id, Slot(entry.host, entry.slot), entry.seq, request, self._clock())
        if why is not None:
            log.warning("job %s: refused to adopt worker %s: %s", self.job_id, worker_id, why)
            return {"ok": False, "reason": why}
        self._adopted_at = self._clock()
        self._cond.notify_all()
        return {"ok": True}

    def _keep_adoption_record(self) -> None:
        """Keep what a restarted driver needs to adopt our workers (see :mod:`.adoption`) up to date."""
        if not self._status_recorded or self._server is None or self.config.checkpoint_dir is None:
            return  # without --checkpoint-dir a restarted driver cannot find this job again
        with self._cond:
            workers = []
            for worker_id, proc in self._procs.items():
                w = self._job.workers.get(worker_id)
                handle = getattr(proc, "handle", None)
                if w is not None and w.alive and handle is not None:
                    workers.append((worker_id, w.slot.host, w.slot.index, w.seq, handle))
            seq = max((w.seq for w in self._job.workers.values()), default=0)
        key = (seq, tuple(w[0] for w in workers))
        if key == self._adopt_saved:
            return
        from cloud_elastic.driver.adoption import write_record
        from cloud_elastic.status import job_dir

        grace = max(self.config.driver_grace_s, self._adoption.grace_s if self._adoption is not None else 0.0)
        record = {"job": self.job_id, "checkpoint_dir": self.config.checkpoint_dir, "advertised": self._advertised,
                  "bind": self._bind, "control_port": self._server.port, "store_port": self._store_port,
                  "grace_s": grace, "seq": seq,
                  "workers": [{"id": wid, "host": host, "slot": slot, "seq": wseq, "handle": handle()}
                              for wid, host, slot, wseq, handle in workers]}
        try:
            write_record(job_dir(self.job_id), record)
            self._adopt_saved = key
        except (OSError, ConfigError) as exc:
            log.warning("job %s: cannot keep the adoption record: %s", self.job_id, exc)
            self._adopt_saved = key


_NOTICE_KINDS = ("terminate", "rebalance", "maintenance")
#: Adopting workers that have less than this left of their grace is not worth the race.
_ADOPT_MARGIN_S = 1.0
#: Heartbeats a second the driver is sized for (about half a core on the benchmark machine): up to 2,000 workers
#: poll every heartbeat interval (0.5 s); a larger group is held longer (see Driver._poll_hold_s).
_POLLS_PER_S = 4000.0
#: How often the loop refreshes the status record's mtime (a restarted driver's measure of when we died).
_RECORD_TOUCH_S = 2.0
#: What a worker stopping at the end of the grace may spend finishing rank 0's last checkpoint, and margin.
_LAST_CHECKPOINT_S = 12.0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _age(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}min"


def _driver_alive(pid: int) -> bool:
    """Whether ``pid`` is a live cloud-elastic process (a pid reused by anything else does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"cloud" in f.read()
    except OSError:  # no /proc (not Linux): trust the pid
        return True


def _previous_alive(store: Any, job_id: str) -> Any:
    """The sign of life a driver of ``job_id`` left beside the checkpoints, unless it ended cleanly.

    ConfigError when it is a live driver on this machine (whose local record was lost).
    """
    from cloud_elastic.checkpoint.alive import read_driver_alive

    try:
        entry = read_driver_alive(store)
    except CheckpointError as exc:
        log.warning("job %s: %s; only this machine's record of the previous driver is used", job_id, exc)
        return None
    if entry is None or entry.job_id != job_id or entry.stopped or entry.is_this_process():
        return None
    if entry.host == socket.gethostname() and _driver_alive(entry.pid):
        raise ConfigError(f"job {job_id} is already running here (driver pid {entry.pid}); "
                          "stop it first or use another --checkpoint-dir")
    return entry


def _previous_driver(job_id: str) -> tuple[int, float] | None:
    """(pid, last sign of life as Unix time) of a driver of ``job_id`` that left its status record here."""
    import json

    from cloud_elastic.status import job_dir

    try:
        path = job_dir(job_id) / "driver.json"
        record = json.loads(path.read_text(encoding="utf-8"))
        return int(record["pid"]), path.stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError, ConfigError):
        return None
_WATCHED_CLOUDS = ("aws", "gcp", "azure")


def _watch_cloud(setting: str, provider: str) -> str | None:
    """Which metadata notice watcher workers run: ``--notice-watcher``, or with ``auto`` the provider's cloud."""
    if setting == "auto":
        return provider if provider in _WATCHED_CLOUDS else None
    return None if setting == "none" else setting


def _route_address(target: str) -> str:
    """The local address the kernel would use to reach ``target`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


_print_lock = threading.Lock()


def _print_line(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
