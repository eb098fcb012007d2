"""Local workers forked from a server that imported torch once (``cloud_elastic.driver.launch.forkserver_child``).

A worker on this machine whose command is this driver's own Python running a script or
a module (``python [-u] SCRIPT ARGS``, ``python [-u] -m MODULE ARGS``: what nearly every
job runs) is forked from a :class:`ForkServer` instead of started from scratch. Starting
from scratch, a worker spends about two seconds of CPU importing torch before it does
anything; a fork costs milliseconds, so a
replacement after a failure, and every worker of a job on a small machine, starts that
much sooner. The worker is otherwise what ``python SCRIPT ARGS`` would be (see the
server's module): its own session, output, environment, working directory, argv,
``sys.path[0]``, seeds and signal handlers.

What a fork cannot change is what the interpreter and its libraries read when they start:
so there is one server per distinct set of such variables (``PYTHON*`` but
``PYTHONUNBUFFERED``, ``LD_*``, the OpenMP, MKL and OpenBLAS thread settings, glibc's
malloc settings, ``TORCH_*``, ``HOME``, ``LANG``, ``LC_*``, ``TZ``), started with them. Any other command (another
interpreter, ``python -c``, a shell) is started from scratch, as is every worker with
``CLOUD_ELASTIC_LOCAL_FORKSERVER=0`` in the driver's environment, every worker on a machine
with a GPU (forked workers have not run on one yet), and every worker after a server failed
to start (one warning).

A machine that runs many jobs can keep a parent of servers (:func:`start_parent`): a driver
whose environment names its socket (``CLOUD_ELASTIC_FORKSERVER_PARENT``) gets a server forked
for it by that parent, already preloaded, when its start-up variables are the job's.
"""

from __future__ import annotations

import array
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from cloud_elastic.errors import ConfigError, LaunchError
from cloud_elastic.driver.launch.forkserver_child import ROOM_VARIABLE
from cloud_elastic.driver.launch.ssh_remote import die_with_parent

__all__ = ["ForkServer", "PARENT_VARIABLE", "forkable", "startup_key", "enabled", "start_parent", "start_server"]

log = logging.getLogger(__name__)

#: Variables read as the interpreter or its libraries start: a worker needing other values needs another server.
#: torch reads many at import (PYTORCH_JIT, TORCHINDUCTOR_*, TORCHDYNAMO_*, TORCH_*), so every TORCH* and PYTORCH_* counts.
_STARTUP_PREFIXES = ("PYTHON", "LC_", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "MALLOC_", "GLIBC_", "TORCH",
                     "PYTORCH_")
_STARTUP_NAMES = frozenset({"HOME", "LANG", "TZ"})
#: How long a server may take to import torch before its first worker is started from scratch instead.
READY_TIMEOUT_S = 60.0
_REPLY_TIMEOUT_S = 30.0
#: Bytes of room for a worker's variables other than the start-up ones, and for its command line.
ENV_ROOM = 64 * 1024
ARGV_ROOM = 8 * 1024
_MAX_MESSAGE = 1 << 20


#: Device nodes of a GPU (NVIDIA, AMD): where they exist, workers start from scratch (forked ones have not run on a GPU).
GPU_NODES = ("/dev/nvidiactl", "/dev/kfd")


def enabled(environ: Any = os.environ, gpu_nodes: tuple[str, ...] = GPU_NODES) -> bool:
    """Whether local workers may be forked: not with ``CLOUD_ELASTIC_LOCAL_FORKSERVER=0``, nor on a GPU machine.
    A value that is neither on nor off is a one-line ``ConfigError`` (a typo must not pick a mode silently)."""
    raw = environ.get("CLOUD_ELASTIC_LOCAL_FORKSERVER", "")
    value = raw.strip().lower() or "1"  # unset or empty: the default
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ConfigError(f"CLOUD_ELASTIC_LOCAL_FORKSERVER={raw!r}: use 1 (fork local workers when it can) or 0 "
                          "(start each from scratch)")
    if value in ("0", "false", "no", "off"):
        return False
    return not any(os.path.exists(node) for node in gpu_nodes)


def startup_key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of ``env`` that a forked worker would inherit from its server rather than read itself."""
    return tuple(sorted((k, v) for k, v in env.items()
                        if k != "PYTHONUNBUFFERED" and (k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES)))


def _same_python(exe: str, env: dict[str, str]) -> bool:
    path = exe if os.sep in exe else shutil.which(exe, path=env.get("PATH"))
    if not path:
        return False
    path = os.path.abspath(path)
    try:  # the same interpreter, in the same environment (a virtualenv is found from the link's directory)
        return os.path.dirname(path) == os.path.dirname(sys.executable) and os.path.samefile(path, sys.executable)
    except OSError:
        return False


def forkable(command: list[str] | tuple[str, ...], env: dict[str, str], cwd: str) -> dict[str, Any] | None:
    """What the server needs to start ``command`` (``script`` or ``module``, ``args``, ``unbuffered``); None if it cannot."""
    if not command or not _same_python(command[0], env):
        return None
    rest, unbuffered = list(command[1:]), False
    while rest and rest[0] == "-u":
        unbuffered, rest = True, rest[1:]
    if len(rest) >= 2 and rest[0] == "-m" and not rest[1].startswith("-"):
        return {"module": rest[1], "args": rest[2:], "unbuffered": unbuffered}
    if rest and not rest[0].startswith("-") and os.path.isfile(os.path.join(cwd, rest[0])):
        return {"script": rest[0], "args": rest[1:], "unbuffered": unbuffered}
    return None


class ForkServer:
    """One ``cloud_elastic.driver.launch.forkserver_child`` process and the driver's end of its socket.

    ``spawn`` is safe from any thread; a reader thread collects the server's replies and
    its children's exits. When the server dies, the workers it started run on: their
    exits are then found from ``/proc`` (code unknown).
    """

    def __init__(self, env: dict[str, str], parent: str | None = None) -> None:
        #: The server's environment: the start-up variables, then the room its workers' other variables
        #: are shown in (``zygote._show_as``); its command line ends with room for theirs.
        self.startup = dict(startup_key(env))
        self.room = 0
        #: The start-up variables the server says it has (``ready``): ``startup`` unless it came from a parent.
        self.server_startup: dict[str, str] | None = None
        self._proc: subprocess.Popen | None = None
        if parent is not None:  # a server forked for this driver by a parent of servers (``start_parent``)
            ours = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                ours.connect(parent)
            except OSError:
                ours.close()
                raise
            self._arg_room = 0  # the server says (``ready``)
        else:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            argv = server_argv([str(theirs.fileno())])
            self._arg_room = sum(len(os.fsencode(a)) + 1 for a in argv)
            try:
                self._proc = subprocess.Popen(argv, env=server_env(env), pass_fds=[theirs.fileno()],
                                              stdin=subprocess.DEVNULL)
            except OSError:
                ours.close()
                raise
            finally:
                theirs.close()
        self._sock = ours
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._next_id = 0
        self.ready = False
        self.gone = False
        #: Why the server would not fork workers (a GPU machine), if it said so.
        self.declined: str | None = None
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                data = self._sock.recv(_MAX_MESSAGE)
                if not data:
                    break
                message = json.loads(data)
                with self._cond:
                    op = message.get("op")
                    if op == "ready":
                        self.ready, self.room = True, int(message.get("room", 0))
                        self._arg_room = int(message.get("arg_room") or self._arg_room)
                        startup = message.get("startup")
                        self.server_startup = dict(startup) if isinstance(startup, dict) else self.startup
                    elif op == "declined":
                        self.declined = str(message.get("reason", "declined"))
                    elif op == "exit":
                        self._exits[int(message["pid"])] = int(message["code"])
                    elif op in ("spawned", "error"):
                        self._replies[int(message["id"])] = message
                    self._cond.notify_all()
        except (OSError, ValueError) as exc:
            log.debug("fork server: reader ends: %s", exc)
        finally:
            with self._cond:
                self.gone = True
                self._cond.notify_all()

    def fits(self, command: list[str] | tuple[str, ...], env: dict[str, str]) -> bool:
        """Whether a worker forked for ``command`` can show its command line and environment as its own:
        ``/proc/PID/environ`` is how a job's processes are found, and it must name the worker's job."""
        extra = sum(len(os.fsencode(k)) + len(os.fsencode(v)) + 2 for k, v in env.items() if k not in self.startup)
        args = sum(len(os.fsencode(a)) + 1 for a in command)
        return extra <= self.room and args <= self._arg_room

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self.ready or self.gone, timeout_s)
            return self.ready and not self.gone

    def spawn(self, how: dict[str, Any], env: dict[str, str], cwd: str, out_fd: int) -> int:
        """Fork a worker (``how`` from :func:`forkable`) writing to ``out_fd``; its pid. LaunchError if it cannot."""
        with self._cond:
            self._next_id += 1
            request_id = self._next_id
        message = json.dumps({"op": "spawn", "id": request_id, "env": env, "cwd": cwd, **how}).encode()
        if len(message) > _MAX_MESSAGE:
            raise LaunchError("the worker's command and environment are too large for the fork server")
        try:
            with self._send_lock:
                self._sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [out_fd]))])
        except OSError as exc:
            raise LaunchError(f"the fork server is gone ({exc.strerror or exc})") from exc
        with self._cond:
            if not self._cond.wait_for(lambda: request_id in self._replies or self.gone, _REPLY_TIMEOUT_S):
                raise LaunchError(f"the fork server did not answer in {_REPLY_TIMEOUT_S:.0f}s")
            reply = self._replies.pop(request_id, None)
        if reply is None:
            raise LaunchError("the fork server is gone")
        if reply["op"] == "error":
            raise LaunchError(f"the fork server could not start it: {reply['error']}")
        return int(reply["pid"])

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout_s: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self.gone, timeout_s)
            return self._exits.get(pid)

    def close(self) -> None:
        """End the server (its workers run on: they are in their own sessions)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if self._proc is None:
            return  # forked by a parent: it ends when this socket closes, and the parent reaps it
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def server_argv(first: list[str]) -> list[str]:
    """A server's command line: ``first`` is its socket's descriptor (or ``--listen PATH`` for a parent)."""
    return [sys.executable, "-m", "cloud_elastic.driver.launch.forkserver_child", *first, "-" * ARGV_ROOM]


def server_env(env: dict[str, str]) -> dict[str, str]:
    """A server's environment for workers of ``env``: its start-up variables, and the room for the others."""
    return {**dict(startup_key(env)), ROOM_VARIABLE: "-" * ENV_ROOM}


def start_parent(path: str, env: dict[str, str] | None = None, *, die_with_caller: bool = False) -> subprocess.Popen:
    """Start a parent of fork servers listening at ``path`` (a new socket file; its directory should be private).

    A driver whose environment has ``CLOUD_ELASTIC_FORKSERVER_PARENT=PATH`` connects to it and
    gets a server forked for it in milliseconds, instead of starting one that imports torch
    (seconds of CPU): for a machine that runs many jobs, one after
    another or side by side (a test suite, a sweep). Its start-up variables are those of
    ``env`` (default: this process's environment); a driver whose workers need others starts
    its own server as before. The caller ends it (``terminate()``); the servers it forked end
    with their drivers, and their workers run on, as for a server a driver started.
    ``die_with_caller``: the kernel also ends it when the calling thread dies without doing so
    (Linux), so a caller killed outright (``os._exit``, SIGKILL) leaves no parent behind.
    """
    source = dict(os.environ if env is None else env)
    preexec = die_with_parent() if die_with_caller else None
    return subprocess.Popen(server_argv(["--listen", path]), env=server_env(source), stdin=subprocess.DEVNULL,
                            preexec_fn=preexec)


#: The variable naming the socket of a parent of fork servers (:func:`start_parent`).
PARENT_VARIABLE = "CLOUD_ELASTIC_FORKSERVER_PARENT"


def start_server(env: dict[str, str]) -> ForkServer | None:
    """A ready server for workers of ``env``'s start-up variables, or None (one warning) if it did not start.

    From the parent of servers ``env`` names (``CLOUD_ELASTIC_FORKSERVER_PARENT``) when there is one
    and its start-up variables are ``env``'s; else a server of its own.
    """
    parent = env.get(PARENT_VARIABLE)
    if parent:
        server = _from_parent(parent, env)
        if server is not None:
            return server
    began = time.monotonic()
    try:
        server = ForkServer(env)
    except OSError as exc:
        log.warning("cloud-elastic: the local fork server did not start (%s); workers start from scratch", exc)
        return None
    if not server.wait_ready():
        if server.declined:
            log.debug("local workers start from scratch: %s", server.declined)
            server.close()
            return None
        log.warning("cloud-elastic: the local fork server was not ready after %.0fs; workers start from scratch",
                    time.monotonic() - began)
        server.close()
        return None
    log.debug("fork server ready in %.2fs", time.monotonic() - began)
    return server


def _from_parent(parent: str, env: dict[str, str]) -> ForkServer | None:
    """A server forked by the parent at ``parent`` for workers of ``env``; None (logged) when there is none that fits."""
    try:
        server = ForkServer(env, parent=parent)
    except OSError as exc:
        log.warning("cloud-elastic: no fork server from %s (%s); starting one", parent, exc)
        return None
    if not server.wait_ready(_REPLY_TIMEOUT_S):
        log.warning("cloud-elastic: the fork server from %s was not ready; starting one", parent)
        server.close()
        return None
    if server.server_startup != server.startup:
        different = sorted(set(server.startup.items()) ^ set((server.server_startup or {}).items()))
        log.info("the fork servers of %s start workers with other settings (%s); starting one",
                 parent, ", ".join(sorted({k for k, _ in different})))
        server.close()
        return None
    return server
