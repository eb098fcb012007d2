"""What the SSH launcher and its remote wrapper (:mod:`cloud_elastic.driver.launch.ssh_remote`) say to each other.

The wrapper's command line (:class:`WrapperArgs`, :func:`wrapper_argv`, :func:`parse_args`), the variables on its
stdin's second line (:func:`parse_env`), the marker line that reports the worker's exact status (:func:`marker_line`,
:func:`parse_marker`, :func:`exit_code`) and the line before it that counts the output sent (:func:`sent_line`),
the lines ``--exit-reports`` answers with (:func:`report_line`,
:func:`parse_report_line`, :data:`REPORT_DIR_NOT_PRIVATE`), the exit report's shape (:func:`parse_exit_report`, for
the wrapper and the driver alike), and the pipe the worker reads the per-job secret from (:func:`secret_pipe`,
:func:`secret_fd_value`; the local launcher uses it too).

Like the wrapper, it imports the standard library only: it runs on worker hosts whose environment may be broken.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from itertools import takewhile
from typing import Sequence

__all__ = ["SECRET_ENV", "SECRET_FD_ENV", "MARKER", "STARTED", "MODULE", "REASON_NONE", "REASON_KEEPALIVE",
           "REASON_GONE", "REASON_GONE_UNKNOWN", "WrapperArgs", "wrapper_argv", "parse_args", "parse_env",
           "secret_pipe", "secret_fd_value", "exit_code", "marker_line", "parse_marker", "SENT", "sent_line",
           "EXIT_REPORT_ENV", "REPORT",
           "REPORT_LIMIT", "report_line", "parse_report_line", "REPORT_DIR_NOT_PRIVATE", "parse_exit_report"]

#: The variable the secret must never travel in (the launcher refuses it in a worker's environment).
SECRET_ENV = "CLOUD_ELASTIC_SECRET"
#: The variable naming the descriptor the worker reads the per-job secret from.
SECRET_FD_ENV = "CLOUD_ELASTIC_SECRET_FD"
#: First word of the status line the wrapper writes on stderr when the worker ends.
MARKER = "CLOUD_ELASTIC_EXIT"
#: The line ``STARTED NONCE`` on stderr: the worker runs (``--attach``: the wrapper answers), the connection is set up.
STARTED = "CLOUD_ELASTIC_STARTED"
#: The variable naming where a worker whose training function returned leaves its exit report on its host (the
#: wrapper completes it with the exact status; the contract's owner is ``cloud_elastic.records``).
EXIT_REPORT_ENV = "CLOUD_ELASTIC_EXIT_REPORT"
#: First word of each line of ``--exit-reports``: ``REPORT NONCE "JSON string of the report's bytes"``.
REPORT = "CLOUD_ELASTIC_REPORT"
#: The line ``--exit-reports`` answers with instead of any report when the reports' directory on the host is not
#: private to the user (anyone could have left them): ``REPORT_DIR_NOT_PRIVATE DIRECTORY``.
REPORT_DIR_NOT_PRIVATE = "CLOUD_ELASTIC_REPORT_DIR_NOT_PRIVATE"
#: The most bytes of an exit report anyone reads; a longer one is refused (the report is a few dozen bytes).
REPORT_LIMIT = 4096
#: ``python3 -m`` target of the remote command.
MODULE = "cloud_elastic.driver.launch.ssh_remote"

#: Marker reasons: the worker ended on its own or was stopped by an order ("-"),
#: the driver's keepalive stopped ("keepalive"), the wrapper could not start the
#: worker ("cwd", "exec").
REASON_NONE = "-"
REASON_KEEPALIVE = "keepalive"
#: ``--attach`` found no wrapper for the nonce: the worker has ended, and its exit report on the host says the
#: marker's status ("gone"), or there is none that can be read ("gone-unknown": the status is unknown, never 0 or 1).
REASON_GONE = "gone"
REASON_GONE_UNKNOWN = "gone-unknown"


@dataclass(frozen=True)
class WrapperArgs:
    """What one wrapper runs, as the launcher put it on the remote command line."""

    nonce: str
    grace_s: float
    keepalive_timeout_s: float
    cwd: str
    command: tuple[str, ...]
    env_on_stdin: bool = False  # ``--env``: the second line of stdin holds variables for the worker
    term_kills: bool = False  # ``--term-kills``: a SIGTERM to the wrapper KILLs the worker's group


def wrapper_argv(args: WrapperArgs) -> list[str]:
    """The arguments after ``-m cloud_elastic.driver.launch.ssh_remote`` that :func:`parse_args` reads back."""
    flag = ["--env"] * args.env_on_stdin + ["--term-kills"] * args.term_kills
    return [*flag, args.nonce, repr(args.grace_s), repr(args.keepalive_timeout_s), args.cwd, *args.command]


def parse_args(argv: Sequence[str]) -> WrapperArgs:
    """Read the wrapper's arguments; ValueError with a one-line message if they are not ours."""
    flags = list(takewhile(lambda arg: arg in ("--env", "--term-kills"), argv))
    argv = argv[len(flags):]
    if len(argv) < 5:
        raise ValueError(f"expected NONCE GRACE_S KEEPALIVE_S CWD COMMAND..., got {len(argv)} argument(s)")
    nonce, grace, keepalive, cwd, *command = argv
    try:
        grace_s, keepalive_s = float(grace), float(keepalive)
    except ValueError:
        raise ValueError(f"GRACE_S and KEEPALIVE_S must be numbers, got {grace!r} and {keepalive!r}") from None
    if not nonce or grace_s < 0 or keepalive_s < 0:
        raise ValueError("NONCE must be non-empty and GRACE_S, KEEPALIVE_S >= 0")
    return WrapperArgs(nonce, grace_s, keepalive_s, cwd, tuple(command), "--env" in flags, "--term-kills" in flags)


def parse_env(line: str) -> dict[str, str]:
    """The variables on the ``--env`` line: a JSON object (ASCII, so any value, newlines and bytes, comes exactly)."""
    return {str(name): str(value) for name, value in json.loads(line).items()}


def secret_pipe(secret: str) -> int:
    """The read end of a pipe holding ``secret``, its write end closed: start the worker with it in
    ``pass_fds`` and its number in :data:`SECRET_FD_ENV`, then close it here.

    The worker reads it once and closes it (``worker.settings.take_secret``). Not inheritable until passed.
    """
    read_fd, write_fd = os.pipe()
    try:
        os.set_blocking(write_fd, False)  # a secret larger than the pipe raises rather than hangs
        data = secret.encode()
        while data:
            data = data[os.write(write_fd, data):]
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    if read_fd < 3:  # a parent started without stdin: the child's stdin would replace it
        moved = fcntl.fcntl(read_fd, fcntl.F_DUPFD_CLOEXEC, 3)
        os.close(read_fd)
        read_fd = moved
    return read_fd


def secret_fd_value(fd: int) -> str:
    """:data:`SECRET_FD_ENV` for the pipe at ``fd``, ``N:INODE``: the worker reads that very pipe, through its
    parent (``/proc/PPID/fd/N``) when a wrapper did not pass it on (``subprocess`` closes it)."""
    return f"{fd}:{os.fstat(fd).st_ino}"


def exit_code(status: int) -> int:
    """The wrapper's own exit code for a worker status (``-N`` = signal N), as a shell would give it."""
    if 0 <= status < 255:
        return status
    return 128 - status if status < 0 else 254


def marker_line(nonce: str, status: int, reason: str) -> str:
    """The line that tells the launcher the worker's exact status (without the newline)."""
    return f"{MARKER} {nonce} {status} {reason}"


def parse_marker(line: str, nonce: str) -> tuple[int, str] | None:
    """``(status, reason)`` if ``line`` is this wrapper's marker line, else ``None``.

    The nonce is per launch, so a worker that prints something that looks like a marker cannot forge its own status.
    """
    words = line.split()
    if len(words) != 4 or words[0] != MARKER or words[1] != nonce:
        return None
    try:
        return int(words[2]), words[3]
    except ValueError:
        return None


#: The wrapper's line just before its marker: how many bytes of the worker's output it sent on that connection's
#: stdout. ssh's client holds up to its channel's window of stdout that a slow driver has not read yet, while the
#: marker on stderr goes past it; counted, the exit is told after the last line whatever the load, where a quiet
#: spell of 50 ms was taken for the end before (a clean clone under load told an exit 591 of its 15,001 lines early).
SENT = "CLOUD_ELASTIC_SENT"


def sent_line(nonce: str, count: int) -> str:
    """The line that says ``count`` bytes of output went before the marker (without the newline)."""
    return f"{SENT} {nonce} {count}"


def report_line(nonce: str, data: bytes) -> str:
    """The line that carries the exit report ``data`` of launch ``nonce`` (without the newline): its text as one
    JSON string, so that any bytes of it stay on one line."""
    return f"{REPORT} {nonce} {json.dumps(data.decode('utf-8', 'replace'))}"


def parse_report_line(line: str) -> tuple[str, bytes] | None:
    """``(nonce, report bytes)`` of a :func:`report_line`, else None."""
    words = line.split(" ", 2)
    if len(words) != 3 or words[0] != REPORT:
        return None
    try:
        text = json.loads(words[2])
    except ValueError:
        return None
    return (words[1], text.encode()) if isinstance(text, str) else None


def parse_exit_report(data: bytes) -> tuple[object, int, int | None]:
    """(round, rank, exit code or None) of an exit report's bytes (``{"v": 1, "round", "rank", "code", "error"}``,
    see ``driver.restart.record``), wherever it was left; ValueError with a short reason for one over
    :data:`REPORT_LIMIT` bytes or not of that shape."""
    if len(data) > REPORT_LIMIT:
        raise ValueError(f"over {REPORT_LIMIT} bytes")
    try:
        raw = json.loads(data)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(raw, dict):
        raise ValueError("malformed")
    rank, code = raw.get("rank"), raw.get("code", False)
    if raw.get("v") != 1 or type(rank) is not int or rank < 0 or not (code is None or type(code) is int):
        raise ValueError("malformed")
    return raw.get("round"), rank, code
