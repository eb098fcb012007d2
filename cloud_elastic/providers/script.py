"""A user's discovery script (``--host-discovery-script``): prints ``host[:slots]`` per line."""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import Mapping

from cloud_elastic.config import check_seconds
from cloud_elastic.errors import ConfigError, DiscoveryError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers._common import one_line
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery, ProviderOption
from cloud_elastic.providers.hostspec import parse_host_list

__all__ = ["DiscoveryScript"]

#: The most a script may print on stdout per call; past it the script is killed (its output is not kept).
MAX_OUTPUT = 1 << 20
#: Of its stderr only the end is kept (the last line goes into the error message).
_KEPT_STDERR = 64 * 1024
_CHUNK = 64 * 1024
#: Once the script has exited, how long its output pipes may stay open: a child it left in the background
#: (``sleep 1000 & echo host``) holds them, and what the script printed is its answer all the same.
_EXITED_GRACE_S = 0.2
#: How often the script is checked for having exited while its pipes stay open.
_POLL_S = 0.05
#: How long past ``timeout_s`` the driver waits for a call: the kill and the last read of its pipes.
_KILL_MARGIN_S = 2.0


class _TooMuch(Exception):
    pass


class DiscoveryScript(HostDiscovery):
    """Runs an executable and parses its standard output.

    Every failure of the script (non-zero exit, garbage output, zero or
    negative slots, duplicate hosts, running past ``timeout_s``, printing more
    than :data:`MAX_OUTPUT`) raises RetryableDiscoveryError with a one-line
    message; the driver treats the first failing call as fatal and later ones
    as transient, keeping the last good snapshot. A script that hangs or prints
    too much is killed (its whole process group) as soon as it does: its output
    is read as it comes, never more than the limit held. A script the system
    cannot run at all (no ``#!`` line, or one naming no interpreter: CRLF line
    endings) raises FatalDiscoveryError instead, saying why. :meth:`cancel`
    kills a script running on another thread (the job is stopping).
    """

    name = "script"
    description = "run an executable that prints host[:slots] per line (what --host-discovery-script uses)"
    options = (
        ProviderOption("path", "path of the executable discovery script", required=True),
        ProviderOption("timeout_s", "seconds before a hanging script is killed", default="30"),
    )

    def __init__(self, path: str, *, slots_per_host: int = 1, timeout_s: float = 30.0) -> None:
        self.path = path
        self.slots_per_host = slots_per_host
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._running: subprocess.Popen | None = None
        self._cancelled = False

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "DiscoveryScript":
        cls.check_options(options)
        path = options["path"]
        if not os.path.isfile(path):
            raise ConfigError(f"discovery script {path!r} does not exist or is not a file")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"discovery script {path!r} is not readable")
        if not os.access(path, os.X_OK):
            raise ConfigError(f"discovery script {path!r} is not executable (chmod +x it)")
        try:
            timeout_s = float(options.get("timeout_s", "30"))
        except ValueError as exc:
            raise ConfigError(f"option 'timeout_s' must be a number, got {options['timeout_s']!r}") from exc
        # At most a year, as every duration (1e12 overflowed a wait in the driver's discovery thread, which died)
        check_seconds("option 'timeout_s'", timeout_s)
        return cls(os.path.abspath(path), slots_per_host=slots_per_host or 1, timeout_s=timeout_s)

    def find_limit_s(self, timeout_s: float) -> float:
        """A call ends by its own ``timeout_s`` (the script is killed at it), so the driver waits that long, not just
        ``--discovery-timeout`` ``timeout_s`` (see :func:`~cloud_elastic.providers.multi.call_limit_s`)."""
        return self.timeout_s + _KILL_MARGIN_S

    def cancel_find(self) -> None:
        """From any thread: kill the script running now (its whole process group), and start none again.

        The job is stopping (Ctrl-C during a slow first call): the script runs in a session of its own, so the
        terminal's signal never reaches it, and the call in progress ends as it would past ``timeout_s``. The
        script is reaped here (within 2 s; at once, killed): a driver that ends right after (Ctrl-C) leaves none
        of its processes running behind it, where the call's own thread, a daemon, may not get to reap it first.
        """
        with self._lock:
            self._cancelled, proc = True, self._running
        if proc is not None:
            _signal_group(proc)
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        self.cancel_find()  # a call still running on the discovery thread as the driver ends leaves no script behind

    def find(self) -> DiscoveredHosts:
        with self._lock:
            if self._cancelled:
                raise RetryableDiscoveryError(f"discovery script {self.path} was not run: the job is stopping")
            try:
                proc = subprocess.Popen(
                    [self.path],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except OSError as exc:
                raise _not_started(self.path, exc) from exc
            self._running = proc
        try:
            out, err = _collect(proc, time.monotonic() + self.timeout_s)
        except subprocess.TimeoutExpired:
            raise RetryableDiscoveryError(
                f"discovery script {self.path} did not finish within {self.timeout_s:g}s and was killed"
            ) from None
        except _TooMuch:
            raise RetryableDiscoveryError(
                f"discovery script {self.path} printed more than {MAX_OUTPUT >> 20} MiB and was killed"
            ) from None
        except OSError as exc:  # the driver out of descriptors (the selector's own), as when it cannot start it
            _kill_group(proc)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            raise RetryableDiscoveryError(f"discovery script {self.path} could not be read: {exc}") from None
        finally:
            with self._lock:
                self._running = None
        if self._cancelled:
            raise RetryableDiscoveryError(f"discovery script {self.path} was killed: the job is stopping")
        if proc.returncode != 0:
            last = err.decode(errors="replace").strip().splitlines()[-1:]
            said = f": {one_line(last[0], 200)}" if last else " (nothing on its stderr)"
            raise RetryableDiscoveryError(f"discovery script {self.path} exited with code {proc.returncode}{said}")
        try:
            hosts = parse_host_list(
                out.decode(errors="replace").splitlines(),
                default_slots=self.slots_per_host,
                source=f"discovery script {os.path.basename(self.path)}",  # the line's room is for what it printed
                unit="line",
            )
        except ValueError as exc:
            raise RetryableDiscoveryError(str(exc)) from exc
        return DiscoveredHosts(ready=hosts)


def _collect(proc: subprocess.Popen, deadline: float) -> tuple[bytes, bytes]:
    """Read the script's stdout and stderr as they come, and wait for it to exit, by ``deadline`` (monotonic).

    Kills its process group and raises TimeoutExpired past the deadline, or _TooMuch once stdout exceeds
    MAX_OUTPUT: ``communicate()`` would hold everything until the end (``yes`` printed 2 GB in a second).
    Once the script has exited, its pipes are read for :data:`_EXITED_GRACE_S` more at most; then what is
    left of its process group (a background child holding them) is killed.
    """
    out, err = bytearray(), bytearray()
    streams = {proc.stdout: out, proc.stderr: err}
    try:
        with selectors.DefaultSelector() as selector:
            for stream in streams:
                selector.register(stream, selectors.EVENT_READ)
            exited = False
            while selector.get_map():
                if not exited and proc.poll() is not None:
                    exited, deadline = True, time.monotonic() + _EXITED_GRACE_S
                left = deadline - time.monotonic()
                if left <= 0 and exited:
                    _kill_group(proc)  # the leftover child; the script's answer is complete
                    break
                if left <= 0:
                    raise subprocess.TimeoutExpired(proc.args, 0)
                for key, _ in selector.select(min(left, _POLL_S)):
                    chunk = os.read(key.fd, _CHUNK)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    kept = streams[key.fileobj]
                    kept += chunk
                    if kept is out and len(out) > MAX_OUTPUT:
                        raise _TooMuch()
                    if kept is err and len(err) > 2 * _KEPT_STDERR:
                        del err[:-_KEPT_STDERR]
        proc.wait(max(0.0, deadline - time.monotonic()))  # it closed its output; it may still be running
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        for stream in streams:
            stream.close()
    return bytes(out), bytes(err)


def _not_started(path: str, exc: OSError) -> DiscoveryError:
    """Why the script at ``path`` did not start. Fatal when it is the file itself (no retry can help): an
    interpreter its ``#!`` line names that does not exist (the kernel's ENOENT names the script, not the
    interpreter: with CRLF line endings it is ``/bin/sh\\r``), or no ``#!`` line at all (ENOEXEC)."""
    if exc.errno == errno.ENOEXEC:
        return FatalDiscoveryError(f"discovery script {path} is not a program the system can run: it needs a "
                                   "'#!' line naming its interpreter (e.g. #!/bin/sh)")
    if exc.errno == errno.ENOENT and os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                first = f.readline(4096)
        except OSError:
            first = b""
        if first.startswith(b"#!"):
            words = first[2:].rstrip(b"\n").replace(b"\t", b" ").split(b" ")
            interpreter = next((w for w in words if w), b"").decode(errors="replace")
            crlf = " (CRLF line endings? convert the script with dos2unix)" if interpreter.endswith("\r") else ""
            return FatalDiscoveryError(
                f"discovery script {path} could not start: its interpreter {interpreter!r} was not found{crlf}")
    return RetryableDiscoveryError(f"discovery script {path} could not start: {exc}")


def _signal_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    _signal_group(proc)
    proc.wait()
