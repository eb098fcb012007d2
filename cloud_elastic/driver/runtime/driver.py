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

import logging
import os
import secrets
import socket
import sys
import threading
import time
from typing import Any, Callable

from cloud_elastic.config import JobConfig
from cloud_elastic.control import Codec, new_secret, round_namespace
from cloud_elastic.driver.restart.window import AdoptingMixin
from cloud_elastic.driver.runtime.discovery import DiscoveryFailure, DiscoveryPoller
from cloud_elastic.driver.runtime.control_plane import POLLS_PER_S as _POLLS_PER_S, ControlPlaneMixin, watch_cloud  # noqa: F401 (read here by benchmarks)
from cloud_elastic.driver.job.actions import SetCapacity
from cloud_elastic.driver.job.hosts import Blacklist, HostManager
from cloud_elastic.driver.job.elastic_job import ElasticJob, Finish, Launch, Policy, Release, Stop
from cloud_elastic.driver.launch.api import ExitStatus, Launcher, WorkerProcess, WorkerSpec, is_local_host
from cloud_elastic.driver.job.liveness import Pulse
from cloud_elastic.driver.launch.local import LocalLauncher
from cloud_elastic.driver.restart.predecessor import RECORD_TOUCH_S, RestartMixin
from cloud_elastic.driver.net.control_server import ControlServer
from cloud_elastic.driver.runtime.signal_stacks import SignalStacks
from cloud_elastic.driver.net.store_server import StoreServer
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.costs import final_cost
from cloud_elastic.errors import LaunchError
from cloud_elastic.metrics import StepRate
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery

__all__ = ["Driver"]

log = logging.getLogger(__name__)

_TICK_S = 0.05
#: How long a worker asked for its stacks by signal has to print them before it is killed.
_STACKS_BEFORE_KILL_S = 1.0
#: After that KILL: how long the stacks may still be arriving (read from the process's output until it ends).
_STACKS_AFTER_KILL_S = 3.0


class Driver(RestartMixin, AdoptingMixin, ControlPlaneMixin):
    """Runs one elastic job to its end. ``run()`` blocks and returns the outcome.

    Its parts: :mod:`.restart` (the durable record, a dead predecessor), :mod:`.adopting` (its
    running workers), :mod:`.handlers` (the control-plane messages); the rest is here: start-up, the
    loop that carries out the job's actions, launching and stopping workers, shutdown.
    """

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
                restarts=config.restarts,
                elastic_timeout_s=config.elastic_timeout_s,
                start_timeout_s=config.start_timeout_s,
                heartbeat_timeout_s=config.heartbeat_timeout_s,
                completion_grace_s=config.completion_grace_s,
                checkpointing=config.checkpoint_dir is not None,
                progress_timeout_s=config.progress_timeout_s,
                straggler_factor=config.straggler_factor,
                straggler_window_s=config.straggler_window_s,
                whole_host_slots=config.whole_host_slots,
                sources=tuple(getattr(discovery, "specs", ())),  # several host sources (providers.multi)
                fallback_after_s=config.fallback_after_s,
                manage_capacity=config.manage_capacity,
            ),
            HostManager(Blacklist(config.cooldown_range_s), missing_grace_s=config.host_missing_grace_s,
                        drain_soft=config.drain_on_rebalance),
            job_id=self.job_id,
        )
        self._cond.watch(self._job)
        self._procs: dict[str, WorkerProcess] = {}
        self._signal_stacks = SignalStacks()
        self._launchers: dict[str, Launcher] = {} if launcher is None else {"given": launcher}
        #: Launches per (host, slot): under --whole-hosts a host's workers start together, so the n-th
        #: launch of each of its slots is the same incarnation of the host (see ``CLOUD_ELASTIC_HOST_KEY``).
        self._slot_launches: dict[tuple[str, int], int] = {}
        self._incarnation = os.urandom(4).hex()  # this driver process's (launch counts restart with it)
        self._stop_reason: tuple[str, int] | None = None
        self._out = output or _print_line
        self._server: ControlServer | None = None
        self._store: StoreServer | None = None
        self._store_port = 0
        self._kept_round = 1  # the oldest round whose store keys are still kept (see _forget_old_rounds)
        self._poller: DiscoveryPoller | None = None
        self._advertised: str | None = None
        self._stoppers: list[threading.Thread] = []
        self._sinks: Any = None  # events file and metrics, opened by run()
        self._status_recorded = False
        self._bind = "127.0.0.1"
        self._started_at = clock()
        self._rate = StepRate()  # rank 0's commits per second, for status
        self._watchers: dict[str, str] = {}  # host -> worker id running its metadata notice watcher
        self._watch_cloud = watch_cloud(config.notice_watcher, getattr(discovery, "name", ""))
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
        self._sinks = open_sinks(self.job_id, self.config.events_file, self.config.metrics_port,
                                 metrics_addr=self.config.metrics_addr)
        started = time.time()
        self._sinks.sink.emit(
            "job_started", num_proc=self.config.num_proc, min_np=self.config.min_np, max_np=self.config.max_np,
            provider=str(getattr(self._discovery, "name", "") or type(self._discovery).__name__),
            command=list(self.config.command),
        )
        outcome = Finish(False, "the driver failed", 1)
        pulse = Pulse(self._pulse_beat)  # busy threads are not a stalled driver (see .liveness)
        pulse.start()
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
            with self._cond:
                cost = final_cost(self._job, self._clock())
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
        self._serve(bind)
        self._record_for_status()
        log.info(
            "job %s: driver at %s (control port %d, store port %d), -np %d --min-np %d --max-np %d",
            self.job_id, self._advertised, self._server.port, self._store_port,
            self.config.num_proc, self.config.min_np, self.config.max_np,
        )
        self._poller = DiscoveryPoller(self._discovery, self._on_discovery, interval_s=self.config.discovery_interval_s)
        self._poller.start()

    def _serve(self, bind: str, port: int = 0) -> None:
        """Start answering the control plane at ``bind``:``port`` (0: any free port)."""
        self._server = ControlServer(self._codec, self._handle, bind=bind, port=port)
        self._server.start()

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
        """Listen for the rendezvous store and serve it (:mod:`cloud_elastic.driver.net.store_server`: torch's
        store protocol without torch, so the driver does not import torch for it)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind, port))
            sock.listen(512)
        except OSError:
            sock.close()
            raise
        self._store = StoreServer(sock)
        self._store_port = self._store.port

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
                current_round = self._job.round
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
                elif isinstance(action, SetCapacity) and self._poller is not None:
                    self._poller.set_capacity(action.source, action.hosts)
            if outcome is not None:
                return outcome
            self._reap()
            self._forget_old_rounds(current_round)
            self._touch_record()
            self._keep_adoption_record()

    def _forget_old_rounds(self, current: int) -> None:
        """Delete the store keys of rounds before the last two: their groups formed (or were given up on) long
        ago, and the store would otherwise keep every round's keys until its bound."""
        if self._store is None:
            return
        while self._kept_round < current - 1:
            self._store.forget(round_namespace(self._secret, self.job_id, self._kept_round))
            self._kept_round += 1

    def _touch_record(self) -> None:
        """Keep the status record's mtime fresh: a restarted driver reads it as this driver's last sign of life."""
        now = time.monotonic()
        if not self._status_recorded or now - self._touched < RECORD_TOUCH_S / 2:
            return
        self._touched = now
        from cloud_elastic.records import job_dir

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
        except (LaunchError, OSError) as exc:
            # OSError: the driver's own process out of descriptors (os.pipe, a socket), say. That is a
            # worker that failed to start, as with LaunchError (its host backs off, the job goes on), not
            # a dead driver: this loop must live to stop the other workers at the end.
            if isinstance(exc, LaunchError):
                why = str(exc)
                log.error("job %s: %s", self.job_id, why)
            else:
                why = f"the driver could not start it: {exc}"
                log.error("job %s: worker %s: %s", self.job_id, action.worker_id, why)
            with self._cond:
                self._job.exited(action.worker_id, ExitStatus(255, transport_error=why), self._clock())
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
                from cloud_elastic.driver.launch.ssh import SSHLauncher

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
        if self.config.whole_host_slots:
            # The host's workers form their own group (sharded training) under this key: the same for the
            # workers launched together, new for each incarnation of the host and each driver process.
            where = (action.slot.host, action.slot.index)
            n = self._slot_launches[where] = self._slot_launches.get(where, 0) + 1
            env["CLOUD_ELASTIC_HOST_KEY"] = f"{action.slot.host}/{n}/{self._incarnation}"
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
        dump = getattr(proc, "dump_stacks", None)
        if action.immediate and action.stacks and dump is not None:
            self._signal_stacks.expect(action.worker_id)
        if action.immediate and action.stacks and dump is not None and dump():
            # Its stacks come on its output (forwarded to this log) before it is killed; the loop never waits.
            log.warning("job %s: asked worker %s for its stacks before stopping it", self.job_id, action.worker_id)
            timer = threading.Timer(_STACKS_BEFORE_KILL_S, self._record_stacks_then_kill, args=(action.worker_id, proc))
            timer.daemon = True
            timer.start()
        elif action.immediate:
            proc.kill()
        else:
            t = threading.Thread(target=proc.terminate, args=(self.config.terminate_grace_s,), daemon=True)
            t.start()
            self._stoppers.append(t)

    def _record_stacks_then_kill(self, worker_id: str, proc: WorkerProcess) -> None:
        """A second after the signal: KILL; the stacks its output carried go to the events file.

        Gathered until the process has ended (3 s at most) and a moment more for its output to be
        read: on a loaded machine the dump was still in the pipe at the KILL, and the event kept
        only its first lines.
        """
        proc.kill()
        deadline = time.monotonic() + _STACKS_AFTER_KILL_S
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        text = self._signal_stacks.take(worker_id)
        if not text:
            log.warning("job %s: worker %s printed no stacks within %gs of the signal", self.job_id, worker_id,
                        _STACKS_BEFORE_KILL_S)
            return
        with self._cond:
            w = self._job.workers.get(worker_id)
        if w is not None:
            self._sinks.sink.emit("stacks", worker=worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                                  text=text, via="signal", **({"round": w.round} if w.round else {}))

    def _forward(self, worker_id: str, line: str) -> None:
        self._signal_stacks.offer(worker_id, line)
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

    # ----------------------------------------------------------------- status
    def _record_for_status(self) -> None:
        """Let ``cloud-elastic status`` on this machine find the job (records are private to this user)."""
        from cloud_elastic.records import write_driver_record

        assert self._server is not None
        host = "127.0.0.1" if self._bind in ("0.0.0.0", "127.0.0.1") else self._bind
        try:
            write_driver_record(self.job_id, f"{host}:{self._server.port}", self._secret, command=self.config.command)
            self._status_recorded = True
        except OSError as exc:  # status is a convenience; the job runs without it
            log.warning("job %s: cannot record the job for 'cloud-elastic status': %s", self.job_id, exc)

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
        if self._store is not None:  # every worker is stopped; in a Ray or Spark user's process it would serve on
            self._store.close()
        if self._status_recorded:
            from cloud_elastic.driver.restart.record import remove_record
            from cloud_elastic.records import job_dir, remove_driver_record

            remove_record(job_dir(self.job_id))  # every worker is stopped: nothing is left to adopt

            remove_driver_record(self.job_id)
        try:
            self._discovery.close()
        except Exception:  # closing is best effort; the job's outcome is already decided
            log.debug("discovery close failed", exc_info=True)

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
