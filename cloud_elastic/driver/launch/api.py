"""The launcher seam: how the driver starts and stops one worker process.

A :class:`Launcher` turns a :class:`WorkerSpec` into a running
:class:`WorkerProcess`. Implementations: :class:`~cloud_elastic.driver.launch.local.LocalLauncher`
(loopback hosts, child processes) and :class:`~cloud_elastic.driver.launch.ssh.SSHLauncher`
(remote hosts through the system ssh client).

Guarantees every launcher gives:

* ``launch`` returns quickly; it never waits for the worker to start training.
  A failure to even start raises :class:`~cloud_elastic.errors.LaunchError`.
* The per-job secret is handed to the worker out of band (an inherited pipe,
  the fork server's socket, stdin of ssh), never on a command line nor in the
  worker's environment (which ``/proc/PID/environ`` shows to the user's other
  processes for the worker's life).
* ``terminate`` stops the worker's whole process group (TERM, then KILL after
  the grace period) and is idempotent. It may block up to the grace period,
  so the driver calls it from a thread of its own.
* ``poll`` and ``kill`` return at once, so the driver's loop thread can call
  them for many workers: ``kill`` sends the KILL (to the whole group, and for
  SSH the order to the remote side) and leaves the waiting to ``poll`` and to
  the launcher's own threads; a stopped worker leaves no process behind.
* ``poll`` tells an exit only once the worker's output has gone to ``on_output`` to its end (or a short
  bound after the exit, when something else holds that output open): the last line a worker printed,
  often why it ended, is known when its exit is judged.
* Output is delivered line by line to the ``on_output`` callback from a
  thread the launcher owns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from cloud_elastic.driver.job.exit_status import ExitStatus, signal_name

__all__ = ["WorkerSpec", "ExitStatus", "WorkerProcess", "Launcher", "is_local_host", "signal_name"]

OutputSink = Callable[[str], None]


@dataclass(frozen=True)
class WorkerSpec:
    """What to start, where. ``env`` never contains the secret; ``secret`` carries it."""

    worker_id: str
    host: str
    slot: int
    command: tuple[str, ...]
    env: Mapping[str, str]
    secret: str = field(repr=False)
    cwd: str
    #: The cloud's id of the instance behind ``host`` when discovery knows it
    #: (an address can be reused by a later instance); ``None`` otherwise.
    instance: str | None = None


class WorkerProcess(Protocol):
    """A started worker. Methods are safe to call from the driver's loop thread."""

    spec: WorkerSpec

    def poll(self) -> ExitStatus | None:
        """The exit status if the process has ended and its output was read (see module docstring), else ``None``.
        Never blocks."""

    def terminate(self, grace_s: float = 5.0) -> None:
        """Stop the whole process group: TERM, then KILL after ``grace_s``. Idempotent; may block up to grace_s."""

    def kill(self) -> None:
        """KILL the whole process group; return at once (``poll`` reports the end). Idempotent."""


class Launcher(Protocol):
    """Starts workers on one kind of host."""

    def launch(self, spec: WorkerSpec, on_output: OutputSink) -> WorkerProcess:
        """Start ``spec``; return at once. Raises LaunchError if it cannot start at all."""

    def close(self) -> None:
        """Release resources (for SSH: control connections). Workers are stopped separately."""


_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "::1"}


def is_local_host(host: str) -> bool:
    """``localhost`` and every loopback address are started as local processes."""
    return host in _LOCAL_NAMES or host.startswith("127.")
