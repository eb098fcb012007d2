"""The worker's settings, read from its environment once, at ``init()``.

The driver passes them as ``CLOUD_ELASTIC_*`` variables (a local child's
environment, or the remote wrapper's on an SSH host), written by
:meth:`WorkerSettings.to_environ`, the one writer of that contract (the names
are this module's ``*_ENV`` constants); the user may set the tuning ones. Nothing else in the worker reads the environment, with one
exception: the host's notice watcher takes its metadata endpoint from the
variables the clouds' own tools honour (``AWS_EC2_METADATA_SERVICE_ENDPOINT``,
``GCE_METADATA_HOST``, ``CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT``; see
:mod:`cloud_elastic.notices.factory`) when it starts. Every other module gets
its values from the one :class:`WorkerSettings` of the context.
A bad value raises :class:`~cloud_elastic.errors.ConfigError` naming the variable.

The job's secret is never in the worker's environment: ``/proc/PID/environ``
shows the environment a process started with to every process of the same user,
whatever the process removes from it later. A worker started from scratch (by
the local launcher or the remote wrapper) inherits the read end of a pipe that
holds it, named by ``CLOUD_ELASTIC_SECRET_FD``; the worker library reads it once
and closes it, and drops the variable, when this module is imported (``import
cloud_elastic.torch`` imports it), so the training script's own subprocesses
inherit neither. A worker forked by the fork server gets it from the server
(``zygote`` hands it over with :func:`keep_secret`), and a Ray actor's function
from the actor. It is kept in this module, read through :func:`taken_secret`.
Under a shell that runs several Pythons importing ``cloud_elastic``, only the
first gets the secret.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from typing import Mapping

from cloud_elastic.errors import ConfigError

__all__ = ["WorkerSettings", "SECRET_ENV", "SECRET_FD_ENV", "DRIVER_ENV", "STORE_ENV", "JOB_ID_ENV", "WORKER_ID_ENV",
           "HOSTNAME_ENV", "SLOT_ENV", "HOST_KEY_ENV", "NETWORK_INTERFACE_ENV", "HEARTBEAT_INTERVAL_ENV", "HEARTBEAT_TIMEOUT_ENV",
           "DRIVER_GRACE_ENV", "CHECKPOINT_DIR_ENV", "CHECKPOINT_INTERVAL_ENV", "CHECKPOINT_KEEP_ENV",
           "IDENTITY_ENV", "check_environ", "keep_secret", "take_secret", "taken_secret"]

#: The name of the secret among settings (:meth:`WorkerSettings.from_environ` of a mapping); never in a
#: worker's environment.
SECRET_ENV = "CLOUD_ELASTIC_SECRET"
#: The descriptor the launcher (or the remote wrapper) hands the job's secret in (a pipe's read end).
SECRET_FD_ENV = "CLOUD_ELASTIC_SECRET_FD"
#: The variables the driver sets for each worker (:meth:`WorkerSettings.to_environ`).
DRIVER_ENV = "CLOUD_ELASTIC_DRIVER"
STORE_ENV = "CLOUD_ELASTIC_STORE"
JOB_ID_ENV = "CLOUD_ELASTIC_JOB_ID"
WORKER_ID_ENV = "CLOUD_ELASTIC_WORKER_ID"
HOSTNAME_ENV = "CLOUD_ELASTIC_HOSTNAME"
SLOT_ENV = "CLOUD_ELASTIC_SLOT"
HOST_KEY_ENV = "CLOUD_ELASTIC_HOST_KEY"
NETWORK_INTERFACE_ENV = "CLOUD_ELASTIC_NETWORK_INTERFACE"
HEARTBEAT_INTERVAL_ENV = "CLOUD_ELASTIC_HEARTBEAT_INTERVAL_S"
HEARTBEAT_TIMEOUT_ENV = "CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S"
DRIVER_GRACE_ENV = "CLOUD_ELASTIC_DRIVER_GRACE_S"
CHECKPOINT_DIR_ENV = "CLOUD_ELASTIC_CHECKPOINT_DIR"
CHECKPOINT_INTERVAL_ENV = "CLOUD_ELASTIC_CHECKPOINT_INTERVAL_S"
CHECKPOINT_KEEP_ENV = "CLOUD_ELASTIC_CHECKPOINT_KEEP"
#: The secret once taken out of the environment (one per process: a worker belongs to one job).
_taken: list[str] = []


def keep_secret(secret: str) -> None:
    """Hold ``secret`` for :meth:`WorkerSettings.from_environ` without it ever being in ``os.environ``."""
    _taken[:] = [secret] if secret else []


def take_secret() -> str:
    """Read the secret from the descriptor ``CLOUD_ELASTIC_SECRET_FD`` names (if set) into this module, closing it
    and dropping the variable; return the one held ("" if none)."""
    raw = os.environ.pop(SECRET_FD_ENV, None)
    if raw:
        value = _read_pipe(raw) or _read_parents_pipe(raw)
        if value:
            keep_secret(value)
    return taken_secret()


def _fd_and_inode(raw: str) -> tuple[int, int | None]:
    """``N`` or ``N:INODE`` (the launcher's form: the inode of its pipe); ValueError otherwise."""
    fd, _, inode = raw.partition(":")
    return int(fd), (int(inode) if inode else None)


def _read_pipe(raw: str) -> str:
    """What the pipe at descriptor ``raw`` holds up to its end, then closed. Never blocks: the launcher wrote
    the secret and closed its end before the worker started. "" for a descriptor that is not that pipe (the
    variable reached a process that did not inherit the descriptor), which is left alone."""
    try:
        fd, inode = _fd_and_inode(raw)
        info = os.fstat(fd)
        if not stat.S_ISFIFO(info.st_mode) or (inode is not None and info.st_ino != inode):
            return ""
        os.set_blocking(fd, False)
    except (ValueError, OSError):
        return ""
    return _drain(fd)


def _read_parents_pipe(raw: str) -> str:
    """A copy of the launcher's pipe, read through the parent process (``/proc/PPID/fd/N``), for a worker a wrapper
    started without passing the descriptor on (Python's ``subprocess`` closes it): only that very pipe (its inode),
    and without taking the secret from it (``tee(2)``): the parent may be the worker itself, whose script started
    this Python before importing ``cloud_elastic``, and still to read it."""
    try:
        fd, inode = _fd_and_inode(raw)
        if inode is None:
            return ""
        path = f"/proc/{os.getppid()}/fd/{fd}"
        info = os.stat(path)
        if not stat.S_ISFIFO(info.st_mode) or info.st_ino != inode:
            return ""
        theirs = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (ValueError, OSError):
        return ""
    try:
        return _copy_of_pipe(theirs)
    finally:
        os.close(theirs)


def _copy_of_pipe(fd: int) -> str:
    """What the pipe at ``fd`` holds, left in it: ``tee(2)`` into a pipe of our own, read from there (Linux)."""
    try:
        import ctypes

        tee = ctypes.CDLL(None, use_errno=True).tee
    except (OSError, AttributeError):
        return ""
    tee.restype, tee.argtypes = ctypes.c_ssize_t, [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
    read_end, write_end = os.pipe()
    try:
        copied = tee(fd, write_end, 65536, 2)  # SPLICE_F_NONBLOCK; the secret is far smaller than a pipe
        os.close(write_end)
        write_end = -1
        return os.read(read_end, copied).decode(errors="replace") if copied > 0 else ""
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def _drain(fd: int, own: bool = False) -> str:
    """What the pipe at ``fd`` holds up to its end, then closed; "" when a writer is still open (not the
    launcher's pipe: left as it was, unless ``own``, a descriptor opened here, which is closed)."""
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except OSError:
        if own:
            os.close(fd)
        else:
            os.set_blocking(fd, True)
        return ""
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def taken_secret() -> str:
    """The secret taken so far, or ""."""
    return _taken[0] if _taken else ""

#: The longest duration a setting may give (a year), as for the driver's flags (``config.MAX_DURATION_S``).
_MAX_DURATION_S = 365 * 86400.0
#: glibc's own allocator settings; when the user set one, ours stay off (see ``memory``).
_GLIBC_MALLOC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


@dataclass(frozen=True)
class WorkerSettings:
    """Everything the worker library takes from its environment.

    ``standalone`` (no ``CLOUD_ELASTIC_DRIVER``): the script was run directly
    with ``python``; it then trains alone as rank 0 of 1.
    """

    standalone: bool = True
    driver_address: str = ""
    store_address: str = ""
    job_id: str = "standalone"
    worker_id: str = "standalone"
    hostname: str = "127.0.0.1"
    #: The index of this worker's slot on its host (its GPU); fixed for the worker's life.
    slot: int = 0
    #: ``CLOUD_ELASTIC_HOST_KEY`` (``--whole-hosts``): names this incarnation of the host, the same for the
    #: workers launched on it together; their own process group (``hvd.shard``) is keyed by it.
    host_key: str = ""
    network_interface: str | None = None
    #: ``--heartbeat-interval``, for the script's information: the worker takes the interval it heartbeats at
    #: from the driver's answer to its registration.
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 5.0
    collective_timeout_s: float = 300.0
    #: ``CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S``: how long a round's process group may take to form (capped by
    #: the collective timeout) before this worker gives the round up as failed (see ``_form_group``).
    group_form_timeout_s: float = 60.0
    #: ``gloo`` or ``nccl``; empty: NCCL when CUDA is available, else Gloo.
    backend: str = ""
    #: ``CLOUD_ELASTIC_ZERO_COPY_COMMIT=0`` turns zero-copy SGD commits off (see ``zerocopy``).
    zero_copy_commit: bool = True
    #: ``CLOUD_ELASTIC_FOLLOW=0`` turns follow-mode admission off (on by default where ``commit.follow.decide``
    #: allows it; off, every newcomer gets the whole state in the sync before it trains: what a script sees
    #: differs in a window, see docs/porting.md); ``CLOUD_ELASTIC_FOLLOW_MB``: the bytes of the committed state
    #: sent to a follower at each commit (MB, 10^6 bytes); ``CLOUD_ELASTIC_FOLLOW_WINDOW_S``: a window that would
    #: last longer moves several commits' pieces at a commit, and all the rest once it has lasted this long.
    follow: bool = True
    follow_bytes: int = 4_000_000
    follow_window_s: float = 30.0
    #: ``CLOUD_ELASTIC_COMMIT_MODE``: ``auto`` (updates run in place, keeping nothing, once the loop is
    #: seen to commit right after each step; see ``window``) or ``snapshot`` (always keep the committed values).
    commit_mode: str = "auto"
    #: ``CLOUD_ELASTIC_MALLOC_TUNING=0``, or any glibc malloc setting of the user's, turns ours off.
    malloc_tuning: bool = True
    secret: str = ""
    #: How long to keep training without an answer from the driver (``--driver-grace``);
    #: without one from the driver, three heartbeat timeouts (a network blip).
    driver_grace_s: float | None = None
    #: Durable checkpoints (``--checkpoint-dir`` and friends); empty: none.
    checkpoint_dir: str = ""
    checkpoint_interval_s: float = 300.0
    checkpoint_keep: int = 2
    #: ``CLOUD_ELASTIC_SHARDED_CHECKPOINT_WRITES``: ``background`` (``hvd.shard``'s checkpoints are written from a
    #: host copy of the shards while training goes on) or ``sync`` (no copy: training waits for the write).
    sharded_checkpoint_writes: str = "background"
    #: ``CLOUD_ELASTIC_SELFTEST_TIMEOUT_S``: how long a newcomer's device self-test may take (``selftest``).
    selftest_timeout_s: float = 60.0
    #: ``CLOUD_ELASTIC_TERM_GRACE_S``: how long after a SIGTERM the worker's host is expected to go (a pod's
    #: ``terminationGracePeriodSeconds``; 30 s, the kubelet's default): the deadline of its notice (``termination``).
    term_grace_s: float = 30.0

    def __post_init__(self) -> None:
        if self.driver_grace_s is None:
            object.__setattr__(self, "driver_grace_s", 3 * self.heartbeat_timeout_s)
        if self.driver_grace_s < 0:
            raise ConfigError(f"CLOUD_ELASTIC_DRIVER_GRACE_S={self.driver_grace_s}: must be >= 0")
        if self.checkpoint_interval_s <= 0 or self.checkpoint_keep < 1:
            raise ConfigError("CLOUD_ELASTIC_CHECKPOINT_INTERVAL_S must be > 0 and CLOUD_ELASTIC_CHECKPOINT_KEEP >= 1")
        durations = {
            "CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S": self.heartbeat_timeout_s,
            "CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S": self.collective_timeout_s,
            "CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S": self.group_form_timeout_s,
            "CLOUD_ELASTIC_DRIVER_GRACE_S": self.driver_grace_s,
            "CLOUD_ELASTIC_CHECKPOINT_INTERVAL_S": self.checkpoint_interval_s,
            "CLOUD_ELASTIC_SELFTEST_TIMEOUT_S": self.selftest_timeout_s,
            "CLOUD_ELASTIC_TERM_GRACE_S": self.term_grace_s,
        }
        for name, value in durations.items():  # NaN passes every `<= 0` check below; inf overflows waits
            if not math.isfinite(value) or value > _MAX_DURATION_S:
                raise ConfigError(f"{name}={value!r}: must be a finite number of seconds, at most a year")
        if self.selftest_timeout_s <= 0:
            raise ConfigError(f"CLOUD_ELASTIC_SELFTEST_TIMEOUT_S={self.selftest_timeout_s}: must be > 0")
        if self.term_grace_s < 0:
            raise ConfigError(f"CLOUD_ELASTIC_TERM_GRACE_S={self.term_grace_s}: must be >= 0")
        for name in ("CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S", "CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S",
                     "CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S"):
            if durations[name] <= 0:  # named with its value: a list of three said neither which nor why
                raise ConfigError(f"{name}={durations[name]!r}: must be positive")
        if self.backend not in ("", "gloo", "nccl"):
            raise ConfigError(f"CLOUD_ELASTIC_BACKEND={self.backend!r}: use gloo or nccl")
        if self.commit_mode not in ("auto", "snapshot"):
            raise ConfigError(f"CLOUD_ELASTIC_COMMIT_MODE={self.commit_mode!r}: use auto or snapshot")
        if self.sharded_checkpoint_writes not in ("background", "sync"):
            raise ConfigError(f"CLOUD_ELASTIC_SHARDED_CHECKPOINT_WRITES={self.sharded_checkpoint_writes!r}: use "
                              "background or sync")
        if self.slot < 0:
            raise ConfigError(f"CLOUD_ELASTIC_SLOT={self.slot}: must be >= 0")
        if not self.standalone:
            if not self.secret:
                raise ConfigError("the job's secret is missing (CLOUD_ELASTIC_SECRET_FD); workers must be started by "
                                  "'cloud-elastic run'")
            for name, value in (("CLOUD_ELASTIC_DRIVER", self.driver_address), ("CLOUD_ELASTIC_STORE", self.store_address)):
                host, sep, port = value.rpartition(":")
                if not sep or not host or not port.isdigit():
                    raise ConfigError(f"{name}={value!r}: expected HOST:PORT")

    def to_environ(self) -> dict[str, str]:
        """The variables that give a worker these settings (the driver's part of them: where the driver and
        its store are, who the worker is, the heartbeat, grace and checkpoint settings). Not the secret,
        which goes to the worker out of band (see :mod:`cloud_elastic.driver.launch.api`), nor the tuning
        ones, which the user's environment sets. Read back by :meth:`from_environ`."""
        env = {
            DRIVER_ENV: self.driver_address,
            STORE_ENV: self.store_address,
            JOB_ID_ENV: self.job_id,
            WORKER_ID_ENV: self.worker_id,
            HOSTNAME_ENV: self.hostname,
            SLOT_ENV: str(self.slot),
            HEARTBEAT_INTERVAL_ENV: str(self.heartbeat_interval_s),
            HEARTBEAT_TIMEOUT_ENV: str(self.heartbeat_timeout_s),
            DRIVER_GRACE_ENV: str(self.driver_grace_s),
        }
        if self.checkpoint_dir:
            env[CHECKPOINT_DIR_ENV] = self.checkpoint_dir
            env[CHECKPOINT_INTERVAL_ENV] = str(self.checkpoint_interval_s)
            env[CHECKPOINT_KEEP_ENV] = str(self.checkpoint_keep)
        if self.network_interface:
            env[NETWORK_INTERFACE_ENV] = self.network_interface
        if self.host_key:
            env[HOST_KEY_ENV] = self.host_key
        return env

    def __repr__(self) -> str:  # never print the secret
        return f"WorkerSettings(worker_id={self.worker_id!r}, job_id={self.job_id!r}, standalone={self.standalone})"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "WorkerSettings":
        """Read the settings from ``environ`` (default ``os.environ``, the secret from its descriptor: see the
        module docstring; a given mapping is left as it is, its secret is its ``CLOUD_ELASTIC_SECRET``)."""
        env = os.environ if environ is None else environ
        secret = take_secret() if environ is None else environ.get(SECRET_ENV, "")

        def number(name: str, default: str, kind: type) -> float:
            raw = env.get(name, default)
            try:
                return kind(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r}: not a number") from None

        def flag(name: str, default: str = "1") -> bool:
            raw = env.get(name, default).strip().lower()
            if raw not in ("0", "1", "false", "true", "no", "yes", "off", "on"):
                raise ConfigError(f"{name}={raw!r}: use 0 or 1")
            return raw in ("1", "true", "yes", "on")

        return cls(
            standalone=DRIVER_ENV not in env,
            driver_address=env.get(DRIVER_ENV, ""),
            store_address=env.get(STORE_ENV, ""),
            job_id=env.get(JOB_ID_ENV, "standalone"),
            worker_id=env.get(WORKER_ID_ENV, "standalone"),
            hostname=env.get(HOSTNAME_ENV, "127.0.0.1"),
            slot=int(number(SLOT_ENV, "0", int)),
            host_key=env.get(HOST_KEY_ENV, ""),
            network_interface=env.get(NETWORK_INTERFACE_ENV) or None,
            heartbeat_interval_s=_lenient(env.get(HEARTBEAT_INTERVAL_ENV), 0.5),
            heartbeat_timeout_s=number(HEARTBEAT_TIMEOUT_ENV, "5", float),
            collective_timeout_s=number("CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S", "300", float),
            group_form_timeout_s=number("CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S", "60", float),
            backend=env.get("CLOUD_ELASTIC_BACKEND", "").strip().lower(),
            zero_copy_commit=flag("CLOUD_ELASTIC_ZERO_COPY_COMMIT"),
            follow=flag("CLOUD_ELASTIC_FOLLOW"),
            follow_bytes=max(1, int(number("CLOUD_ELASTIC_FOLLOW_MB", "4", float) * 1e6)),
            follow_window_s=max(0.0, number("CLOUD_ELASTIC_FOLLOW_WINDOW_S", "30", float)),
            commit_mode=env.get("CLOUD_ELASTIC_COMMIT_MODE", "auto").strip().lower(),
            malloc_tuning=flag("CLOUD_ELASTIC_MALLOC_TUNING") and not any(n in env for n in _GLIBC_MALLOC_SETTINGS),
            secret=secret,
            driver_grace_s=number(DRIVER_GRACE_ENV, "", float) if env.get(DRIVER_GRACE_ENV) else None,
            checkpoint_dir=env.get(CHECKPOINT_DIR_ENV, ""),
            checkpoint_interval_s=number(CHECKPOINT_INTERVAL_ENV, "300", float),
            checkpoint_keep=int(number(CHECKPOINT_KEEP_ENV, "2", int)),
            sharded_checkpoint_writes=env.get("CLOUD_ELASTIC_SHARDED_CHECKPOINT_WRITES", "background").strip().lower(),
            selftest_timeout_s=number("CLOUD_ELASTIC_SELFTEST_TIMEOUT_S", "60", float),
            term_grace_s=number("CLOUD_ELASTIC_TERM_GRACE_S", "30", float),
        )


#: Who the worker is and where its driver is: the driver's to set, for each worker. ``run`` refuses them in ``-x``
#: (:func:`check_environ`), and the driver's values win over a forwarded one (``driver/runtime/processes.py``).
IDENTITY_ENV = frozenset({SECRET_ENV, DRIVER_ENV, STORE_ENV, JOB_ID_ENV, WORKER_ID_ENV, HOSTNAME_ENV, SLOT_ENV,
                           HOST_KEY_ENV})
#: What the driver sets from its own flags (:meth:`WorkerSettings.to_environ`) over the environment it inherits.
_FROM_FLAGS_ENV = frozenset({NETWORK_INTERFACE_ENV, HEARTBEAT_INTERVAL_ENV, HEARTBEAT_TIMEOUT_ENV, DRIVER_GRACE_ENV})
_CHECKPOINT_ENV = frozenset({CHECKPOINT_DIR_ENV, CHECKPOINT_INTERVAL_ENV, CHECKPOINT_KEEP_ENV})
#: Each of those and the flag that sets it (None: the driver's own pace): refused in ``-x`` too.
_FLAG_OF = {NETWORK_INTERFACE_ENV: "--network-interface", HEARTBEAT_INTERVAL_ENV: None,
            HEARTBEAT_TIMEOUT_ENV: "--heartbeat-timeout", DRIVER_GRACE_ENV: "--driver-grace",
            CHECKPOINT_DIR_ENV: "--checkpoint-dir", CHECKPOINT_INTERVAL_ENV: "--checkpoint-interval",
            CHECKPOINT_KEEP_ENV: "--checkpoint-keep"}


def check_environ(environ: Mapping[str, str], forwarded: Mapping[str, str], *, checkpointing: bool) -> None:
    """The ConfigError a worker would raise at ``init()`` on the environment a job gives it, raised now, by the
    driver before it starts anything (``cloud-elastic run``: one line, exit code 2, instead of every worker's
    traceback and a failed job): ``environ`` is the driver's, which a local worker inherits, ``forwarded`` the
    ``-x``/``--env`` values over it. What the driver sets itself replaces the inherited values and is not looked
    at: who the worker is, and the heartbeat, grace and (``checkpointing``: ``--checkpoint-dir`` given)
    checkpoint settings of its flags. Neither can be forwarded (:data:`IDENTITY_ENV`, :data:`_FLAG_OF`: a
    ConfigError naming the first; a forwarded grace or heartbeat pace was one the driver's plans did not count on). A job whose workers do not inherit the
    driver's environment (SSH, Ray, Spark) passes an empty ``environ``. The same parser as the worker's, so
    the two cannot disagree."""
    identity = sorted(IDENTITY_ENV.intersection(forwarded))
    if identity:
        raise ConfigError(f"{identity[0]} cannot be forwarded to the workers (-x, or a Python API's env): the driver "
                          "sets it for each worker (who the worker is and where its driver is)")
    flagged = sorted(_FLAG_OF.keys() & forwarded.keys())
    if flagged:  # review h26: a forwarded grace or heartbeat pace the driver's plans did not count on
        flag = _FLAG_OF[flagged[0]]
        raise ConfigError(f"{flagged[0]} cannot be forwarded to the workers (-x, or a Python API's env): the driver "
                          + (f"sets it from {flag} (a Python API's setting of that name, where it has one), and the "
                             "two must agree" if flag else
                             "sets it (the heartbeat pace its --heartbeat-timeout counts on)"))
    replaced = IDENTITY_ENV | _FROM_FLAGS_ENV | (_CHECKPOINT_ENV if checkpointing else frozenset())
    env = {k: v for k, v in environ.items() if k not in replaced}
    env.update(forwarded)
    WorkerSettings.from_environ(env)  # no CLOUD_ELASTIC_DRIVER: standalone, so no secret or address is asked


def _lenient(raw: str | None, default: float) -> float:
    """A number only reported to the script (never acted on): a bad value is the default, not an error."""
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


# The earliest moment the worker library runs in a worker started from scratch: its subprocesses,
# from here on, inherit neither the secret's descriptor nor its variable.
take_secret()
