"""The driver's worker processes: launching them, stopping them, watching them end.

:class:`WorkerProcesses` carries out the job's :class:`~cloud_elastic.driver.job.actions.Launch`
and :class:`~cloud_elastic.driver.job.actions.Stop` actions on the driver's loop thread, and
reports each process that ended to the job (:meth:`WorkerProcesses.reap`). Nothing here blocks
the loop: a graceful stop (TERM, then KILL after ``--terminate-grace``) runs on a thread of its
own, and a stop that asks for the worker's stacks first kills it from a timer.

A worker's environment is its :class:`~cloud_elastic.worker.settings.WorkerSettings`
(:meth:`~cloud_elastic.worker.settings.WorkerSettings.to_environ`, the one writer of the
``CLOUD_ELASTIC_*`` contract), ``PYTHONUNBUFFERED``, one OpenMP thread unless the user says
otherwise, and ``--forward-env`` (over all of them but who the worker is). The secret goes out of band (:class:`~cloud_elastic.driver.launch.api.WorkerSpec`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.actions import Launch, Stop
from cloud_elastic.driver.job.exit_status import ExitStatus, LastErrors
from cloud_elastic.driver.launch.api import Launcher, WorkerProcess, WorkerSpec, is_local_host
from cloud_elastic.driver.launch.local import CommandNotStarted, LocalLauncher
from cloud_elastic.driver.net.endpoints import Endpoints
from cloud_elastic.driver.restart.record import AdoptedWorker
from cloud_elastic.driver.restart.window import adopted_process
from cloud_elastic.driver.runtime.signal_stacks import SignalStacks
from cloud_elastic.errors import LaunchError
from cloud_elastic.protocol_reports import said_retrying
from cloud_elastic.worker.settings import IDENTITY_ENV, WorkerSettings

__all__ = ["WorkerProcesses", "forwarded_env", "launches_locally"]

log = logging.getLogger(__name__)

#: How long a worker asked for its stacks by signal has to print them before it is killed.
STACKS_BEFORE_KILL_S = 1.0
#: After that KILL: how long the stacks may still be arriving (read from the process's output until it ends).
_STACKS_AFTER_KILL_S = 3.0


def forwarded_env(forward: tuple[str, ...], environ: Any = None) -> dict[str, str]:
    """``--forward-env``: NAME=VALUE as given, NAME with the driver's own value (left out when it has none)."""
    environ = os.environ if environ is None else environ
    env = {}
    for item in forward:
        name, sep, value = item.partition("=")
        if sep:
            env[name] = value
        elif name in environ:
            env[name] = environ[name]
    return env


def launches_locally(host: str, force_ssh: bool) -> bool:
    """Whether the driver starts ``host``'s workers as its own child processes, which inherit its environment
    (the others go through SSH, and get only what the driver sends: docs/ssh.md)."""
    return is_local_host(host) and not force_ssh


class WorkerProcesses:
    """The processes of one driver's workers (see module docstring).

    ``job`` and ``cond`` are the job and its lock; ``endpoints`` where the workers reach the driver;
    ``sinks()`` the open events file (for a stop's stacks); ``out(line)`` prints a worker's output line.
    ``launcher``, when given, starts every worker; by default loopback hosts get local child processes
    and the others SSH.
    """

    def __init__(self, config: JobConfig, job: Any, cond: Any, endpoints: Endpoints, *, clock: Callable[[], float],
                 sinks: Callable[[], Any], out: Callable[[str], None], launcher: Launcher | None = None) -> None:
        self._config = config
        self._job = job
        self._cond = cond
        self._endpoints = endpoints
        self._clock = clock
        self._sinks = sinks
        self._out = out
        self.procs: dict[str, WorkerProcess] = {}
        self._stoppers: list[threading.Thread] = []
        self._signal_stacks = SignalStacks()
        #: What each worker said last that may name why it ended (its end lines carry it; see LastErrors).
        self._last_errors = LastErrors(clock)
        self._launchers: dict[str, Launcher] = {} if launcher is None else {"given": launcher}
        #: Launches per (host, slot): under --whole-hosts a host's workers start together, so the n-th
        #: launch of each of its slots is the same incarnation of the host (see ``CLOUD_ELASTIC_HOST_KEY``).
        self._slot_launches: dict[tuple[str, int], int] = {}
        self._incarnation = os.urandom(4).hex()  # this driver process's (launch counts restart with it)

    # ----------------------------------------------------------------- launch
    def launch(self, action: Launch) -> None:
        """Start ``action``'s worker; a worker that cannot start is reported to the job as exited: 127/126
        for a local command that cannot be executed, else 255 as a transport failure."""
        spec = self.spec(action)
        try:
            launcher = self.launcher_for(action.slot.host)
            proc = launcher.launch(spec, lambda line, wid=action.worker_id: self._forward(wid, line))
        except CommandNotStarted as exc:
            # This machine is reachable: a command it cannot execute (a typo, a script without its x bit) is
            # the worker's own failure, as from a shell over SSH, not a host still booting to be waited for.
            status: ExitStatus = exc.status
        except (LaunchError, OSError) as exc:
            # OSError: the driver's own process out of descriptors (os.pipe, a socket), say. That is a
            # worker that failed to start, as with LaunchError (its host backs off, the job goes on), not
            # a dead driver: this loop must live to stop the other workers at the end.
            if isinstance(exc, LaunchError):
                why = str(exc)
                log.error("job %s: %s", self._job.job_id, why)
            else:
                why = f"the driver could not start it: {exc}"
                log.error("job %s: worker %s: %s", self._job.job_id, action.worker_id, why)
            status = ExitStatus(255, transport_error=why)
        else:
            self.procs[action.worker_id] = proc
            log.info("job %s: launched worker %s", self._job.job_id, action.worker_id)
            return
        with self._cond:
            self._job.exited(action.worker_id, status, self._clock())

    def launcher_for(self, host: str) -> Launcher:
        """The launcher of ``host``'s workers (the given one, else local or SSH), made on first use."""
        if "given" in self._launchers:
            return self._launchers["given"]
        kind = "local" if launches_locally(host, self._config.force_ssh) else "ssh"
        if kind not in self._launchers:
            if kind == "local":
                self._launchers[kind] = LocalLauncher()
            else:
                from cloud_elastic.driver.launch.ssh import SSHLauncher

                self._launchers[kind] = SSHLauncher(self._config.ssh)
        return self._launchers[kind]

    def spec(self, action: Launch) -> WorkerSpec:
        """What to start for ``action``, with the environment of the module docstring."""
        config, endpoints = self._config, self._endpoints
        host_key = ""
        if config.whole_host_slots:
            # The host's workers form their own group (sharded training) under this key: the same for the
            # workers launched together, new for each incarnation of the host and each driver process.
            where = (action.slot.host, action.slot.index)
            n = self._slot_launches[where] = self._slot_launches.get(where, 0) + 1
            host_key = f"{action.slot.host}/{n}/{self._incarnation}"
        settings = WorkerSettings(
            standalone=False, driver_address=f"{endpoints.advertised}:{endpoints.control_port}",
            store_address=f"{endpoints.advertised}:{endpoints.store_port}", job_id=self._job.job_id,
            worker_id=action.worker_id, hostname=action.slot.host, slot=action.slot.index, host_key=host_key,
            network_interface=config.network_interface or None, heartbeat_interval_s=config.heartbeat_interval_s,
            heartbeat_timeout_s=config.heartbeat_timeout_s, driver_grace_s=config.driver_grace_s,
            checkpoint_dir=config.checkpoint_dir or "", checkpoint_interval_s=config.checkpoint_interval_s,
            checkpoint_keep=config.checkpoint_keep, secret=endpoints.secret,
        )
        env = settings.to_environ()
        env["PYTHONUNBUFFERED"] = "1"
        # Several workers share a host's cores; one OpenMP thread each unless the user says otherwise.
        env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        # Who the worker is stays the driver's, whatever -x says (run refuses those names; an API may not).
        env.update((k, v) for k, v in forwarded_env(config.forward_env).items() if k not in IDENTITY_ENV)
        return WorkerSpec(worker_id=action.worker_id, host=action.slot.host, slot=action.slot.index,
                          command=config.command, env=env, secret=endpoints.secret, cwd=config.cwd,
                          instance=self._job.hosts.instances.get(action.slot.host))

    # ------------------------------------------------------------- adoption
    def adopt(self, worker: AdoptedWorker) -> None:
        """Take a handle on a worker of a dead predecessor that re-registered; this driver stops it in the end."""
        proc = self._adopted(worker)
        if proc is not None:
            self.procs[worker.worker_id] = proc

    def stop_missing(self, worker: AdoptedWorker) -> None:
        """Stop a worker of a dead predecessor that did not re-register: it may be stopped or hung, and none
        must outlive the job."""
        proc = self._adopted(worker)
        if proc is not None:
            self._terminate_in_background(proc)

    def adopted_spec(self, worker: AdoptedWorker) -> WorkerSpec:
        """What a worker of a dead predecessor runs, as far as this driver knows (its host's remote commands use it)."""
        return WorkerSpec(worker.worker_id, worker.host, worker.slot, self._config.command,
                          forwarded_env(self._config.forward_env), self._endpoints.secret, self._config.cwd)

    def _adopted(self, worker: AdoptedWorker) -> WorkerProcess | None:
        return adopted_process(worker, self.adopted_spec(worker), self.launcher_for,
                               lambda line, wid=worker.worker_id: self._forward(wid, line))

    # ---------------------------------------------------------- watch, stop
    def reap(self) -> None:
        """Tell the job about every process that ended since the last call."""
        ended: list[tuple[str, ExitStatus]] = []
        for worker_id, proc in list(self.procs.items()):
            status = proc.poll()
            if status is not None:
                ended.append((worker_id, status))
                del self.procs[worker_id]
        if ended:
            with self._cond:
                for worker_id, status in ended:
                    self._job.exited(worker_id, self._said_last(worker_id, status), self._clock())
                self._cond.notify_all()

    def stop(self, action: Stop) -> None:
        """Stop ``action``'s worker without waiting: KILL at once (after its stacks, when asked), or TERM then
        KILL after ``--terminate-grace`` from a thread of its own."""
        proc = self.procs.get(action.worker_id)
        if proc is None:
            return
        log.info("job %s: stopping worker %s: %s", self._job.job_id, action.worker_id, action.reason)
        dump = getattr(proc, "dump_stacks", None)
        if action.immediate and action.stacks and dump is not None:
            self._signal_stacks.expect(action.worker_id)
        if action.immediate and action.stacks and dump is not None and dump():
            # Its stacks come on its output (forwarded to this log) before it is killed; the loop never waits.
            log.warning("job %s: asked worker %s for its stacks before stopping it", self._job.job_id,
                        action.worker_id)
            timer = threading.Timer(STACKS_BEFORE_KILL_S, self._record_stacks_then_kill,
                                    args=(action.worker_id, proc))
            timer.daemon = True
            timer.start()
            # close() waits for it as for the stops: a job that ended within its few seconds (a short job, the
            # rest finishing at once) exited before the stacks reached the events file (a clean-clone run's test_health).
            self._stoppers.append(timer)
        elif action.immediate:
            proc.kill()
            self._signal_stacks.take(action.worker_id)  # its process was gone: nothing to gather
            if action.stacks and dump is None:
                self._cannot_ask(action.worker_id)
        else:
            self._terminate_in_background(proc)

    def _cannot_ask(self, worker_id: str) -> None:
        """A worker given up was killed at once, its process of a kind that cannot be asked for its stacks (a Ray
        actor's, a Spark task's, one adopted from a dead driver): the job hears so, as it hears what others printed
        (a silent one then counts on its silence alone, see ``Failures.signal_stacks``)."""
        with self._cond:
            w = self._job.workers.get(worker_id)
            if w is not None:
                w.stacks_signal = False
                self._job.signal_stacks(worker_id, "")
            self._cond.notify_all()

    def close(self) -> None:
        """Stop every worker (in parallel, each TERM then KILL), wait for the stops, close the launchers."""
        for proc in self.procs.values():
            self._terminate_in_background(proc)
        for t in self._stoppers:
            t.join(self._config.terminate_grace_s + 5)
        self.procs.clear()
        for launcher in self._launchers.values():
            launcher.close()

    def _terminate_in_background(self, proc: WorkerProcess) -> None:
        t = threading.Thread(target=proc.terminate, args=(self._config.terminate_grace_s,), daemon=True)
        t.start()
        self._stoppers.append(t)

    def _record_stacks_then_kill(self, worker_id: str, proc: WorkerProcess) -> None:
        """A second after the signal: KILL; the stacks its output carried go to the events file.

        Gathered until the process has ended (3 s at most) and a moment more for its output to be
        read: on a loaded machine the dump can still be in the pipe at the KILL.
        """
        proc.kill()
        deadline = time.monotonic() + _STACKS_AFTER_KILL_S
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        text = self._signal_stacks.take(worker_id)
        if not text:
            log.warning("job %s: worker %s printed no stacks within %gs of the signal", self._job.job_id, worker_id,
                        STACKS_BEFORE_KILL_S)
        with self._cond:  # whether a silent worker counts as hung (Failures.signal_stacks)
            w = self._job.signal_stacks(worker_id, text)
            self._cond.notify_all()
        if w is not None and text:
            self._sinks().sink.emit("stacks", worker=worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                                    text=text, via="signal", **({"round": w.round} if w.round else {}))

    def _said_last(self, worker_id: str, status: ExitStatus) -> ExitStatus:
        """``status`` with what the worker printed last, where that says why it ended (:class:`LastErrors`); a
        worker that never reached this driver said so as it exited: that is its error (it could not report one
        as others do, with ``exiting``), and its failure line says it. Called under the job's lock."""
        w = self._job.workers.get(worker_id)
        status, said = self._last_errors.attach(worker_id, status, reported=w is not None and bool(w.error))
        if said and w is not None:
            w.error = said
        return status

    def _forward(self, worker_id: str, line: str) -> None:
        self._signal_stacks.offer(worker_id, line)
        self._last_errors.offer(worker_id, line)
        if said_retrying(line):  # it reached hvd.init() and tried the driver: .liveness names the address first
            w = self._job.workers.get(worker_id)
            if w is not None:
                w.tried_driver = True
        rank = self._job.rank_of(worker_id)  # a plain dict read; no lock needed for a label
        self._out(f"[{'-' if rank is None else rank}]<{worker_id.split('#')[0]}> {line}")
