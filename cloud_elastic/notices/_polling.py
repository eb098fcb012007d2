"""The machinery the three watchers share: plain HTTP with timeouts, one daemon
thread, de-duplication and rate-limited complaints.

HTTP goes through :mod:`http.client` directly, never through urllib's opener:
urllib honours ``HTTP_PROXY``, and a metadata request sent to a proxy either
fails or, worse, reads the proxy host's metadata.
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from .api import Notice, NoticeWatcher, Report

log = logging.getLogger(__name__)

#: How often a polling watcher reads its metadata service. A notice is seen up to this late, and the
#: budget from notice to stepping at the new size is 1 s plus a step: at 1 s, the slowest sightings
#: used all of it. Two or three local HTTP reads per cycle cost nothing measurable.
POLL_INTERVAL_S = 0.5

#: Metadata answers are small; anything bigger is not a metadata service.
MAX_BODY = 1 << 20

#: How many kinds of trouble a watcher's :class:`Complaints` remembers.
MAX_KINDS = 64


class Unreachable(Exception):
    """No connection to the metadata service (refused, no route, connect timeout). Never leaves the package."""


class BadAnswer(Exception):
    """The service was reached but its answer is unusable (status, body, headers, read timeout).

    ``key`` groups complaints for rate-limiting. Never leaves the package.
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace").strip()


class _DeadlineSocket(socket.socket):
    """A socket whose every send and receive ends by ``deadline`` (monotonic): a request's total time limit.

    A plain socket timeout bounds each read alone, so an answer that trickles in a byte at a time
    never times out (and blocks the watcher, and every notice behind it).
    """

    deadline = 0.0

    def _left(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("request time limit reached")
        self.settimeout(left)

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        self._left()
        return super().recv_into(*args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        self._left()
        return super().recv(*args, **kwargs)

    def sendall(self, *args: Any, **kwargs: Any) -> None:
        self._left()
        super().sendall(*args, **kwargs)


_LOOKUPS: dict[str, threading.Event] = {}  # host name -> set when its lookup in flight has ended
_LOOKUPS_LOCK = threading.Lock()


def _addresses(host: str, port: int, deadline: float) -> list[tuple[Any, ...]]:
    """``host``'s addresses for a TCP connection, found by ``deadline`` (monotonic), else ``socket.timeout``.

    The system resolver has no time limit of ours: a metadata host name (GCP's ``metadata.google.internal``) on a
    machine whose DNS does not answer held the request for the resolver's own timeouts (5 s an attempt), past the
    request's limit. A name is looked up on a thread of its own, left to end by itself when the deadline passes;
    while it runs, no other lookup of the same name starts (the watcher polls every half second). An address
    given as numbers is not looked up.
    """
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: dict[str, Any] = {}
    with _LOOKUPS_LOCK:
        ended = _LOOKUPS.get(host)
        if ended is not None and not ended.is_set():
            raise socket.timeout(f"looking up {host} still runs, started by an earlier request")
        ended = _LOOKUPS[host] = threading.Event()

    def look_up() -> None:
        try:
            found["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            found["error"] = exc
        finally:
            ended.set()

    threading.Thread(target=look_up, name=f"cloud-elastic-lookup-{host}", daemon=True).start()
    if not ended.wait(max(0.0, deadline - time.monotonic())):
        raise socket.timeout(f"looking up {host} took longer than the request's time limit")
    if "error" in found:
        raise found["error"]
    return found["addresses"]


class _Connection(http.client.HTTPConnection):
    """An HTTP connection whose name lookup, connect, request, headers and body all end by ``deadline`` (see
    :func:`_addresses` and :class:`_DeadlineSocket`)."""

    def __init__(self, host: str, port: int, deadline: float) -> None:
        super().__init__(host, port, timeout=max(0.001, deadline - time.monotonic()))
        self.deadline = deadline

    def connect(self) -> None:
        error: OSError | None = None
        for family, kind, proto, _name, address in _addresses(self.host, self.port, self.deadline):
            sock = _DeadlineSocket(family, kind, proto)
            sock.deadline = self.deadline
            try:
                sock.settimeout(max(0.001, self.deadline - time.monotonic()))
                sock.connect(address)
            except OSError as exc:  # the next address, as socket.create_connection tries them
                sock.close()
                error = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as http.client's own connect
            self.sock = sock
            return
        raise error or OSError(f"no address found for {self.host}")


def request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    timeout_s: float,
    what: str,
    track: Callable[[http.client.HTTPConnection | None], None] | None = None,
) -> Answer:
    """One HTTP request; :class:`Unreachable` if no connection, :class:`BadAnswer` if it stalls.

    ``timeout_s`` bounds the whole request, from the connect to the answer's
    last byte: a service that hangs, or trickles its answer, costs at most
    that. ``track`` is told the open connection (and None when it is closed),
    so that another thread can cut a long-poll short.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise BadAnswer(f"{what}: url", f"{what}: not an http:// URL: {url!r}")
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = _Connection(parts.hostname, parts.port or 80, time.monotonic() + timeout_s)
    if track is not None:
        track(conn)
    try:
        try:
            conn.connect()
        except (OSError, socket.timeout) as exc:
            raise Unreachable(f"{parts.netloc}: {exc or type(exc).__name__}") from exc
        try:
            conn.request(method, target, body=body, headers=dict(headers or {}))
            resp = conn.getresponse()
            data = resp.read(MAX_BODY + 1)
        except socket.timeout as exc:
            raise BadAnswer(f"{what}: timeout", f"{what}: no answer within {timeout_s:g}s") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise BadAnswer(f"{what}: broken", f"{what}: connection broken: {exc or type(exc).__name__}") from exc
        except ValueError as exc:  # a header value http.client refuses (a newline, not latin-1): never sent
            raise BadAnswer(f"{what}: bad request", f"{what}: request not sent: {str(exc)[:120]}") from exc
        if len(data) > MAX_BODY:
            raise BadAnswer(f"{what}: too big", f"{what}: answer larger than {MAX_BODY} bytes")
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        if track is not None:
            track(None)
        conn.close()


class Complaints:
    """Logs each kind of trouble once, then at most every ``every_s`` with a count.

    It remembers at most :data:`MAX_KINDS` kinds, the oldest forgotten first: a kind can come from
    the service's answer (an unknown Azure event type), and a service that made up a new one at
    every read must not grow the watcher without bound (the kind unused longest is forgotten, and logged
    again if it returns).
    """

    def __init__(self, every_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, key: str, message: str, level: int = logging.WARNING) -> None:
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._every_s:
                self._last[key] = self._last.pop(key)  # the newest in use: forgotten last
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                log.debug("%s", message)
                return
            self._last.pop(key, None)  # re-inserted last: the dict's order is the kinds' age
            self._last[key] = now
            more = self._suppressed.pop(key, 0)
            while len(self._last) > MAX_KINDS:
                oldest = next(iter(self._last))
                del self._last[oldest]
                self._suppressed.pop(oldest, None)
        suffix = f" ({more} more like it since)" if more else ""
        log.log(level, "%s; ignored%s", message, suffix)


class PollingWatcher(NoticeWatcher):
    """A watcher whose one daemon thread runs :meth:`_cycle` until closed.

    Subclasses implement :meth:`_cycle`: read the service, return the notices
    seen (duplicates welcome) and how long to wait before the next cycle (None
    = ``poll_interval_s``). Until one cycle has succeeded, :class:`Unreachable`
    or :class:`BadAnswer` from a cycle means there is no usable service here
    (not on this cloud, or something else answers at the address): logged once
    at INFO, retried every ``unreachable_retry_s``. After that, trouble is
    logged as a WARNING once per kind (rate-limited) and the next cycle comes
    at the normal interval, since a notice may come at any time.
    """

    def __init__(
        self,
        *,
        base_url: str,
        poll_interval_s: float = POLL_INTERVAL_S,
        request_timeout_s: float = 2.0,
        unreachable_retry_s: float = 10.0,
        complain_every_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for name, value in (("poll_interval_s", poll_interval_s), ("request_timeout_s", request_timeout_s),
                            ("unreachable_retry_s", unreachable_retry_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.base_url = base_url.rstrip("/")
        self.poll_interval_s = poll_interval_s
        self.request_timeout_s = request_timeout_s
        self.unreachable_retry_s = unreachable_retry_s
        self._clock = clock
        self._complain = Complaints(complain_every_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._report: Report | None = None
        self._reported: dict[str, Notice] = {}
        self._unreported: dict[str, Notice] = {}  # seen, but no report has gone through yet (first sighting)
        self._resends = 0  # resend() calls: a report in flight across one does not count as reported
        self._answered = False
        self._told_unreachable = False
        self._inflight: http.client.HTTPConnection | None = None

    # -- public ----------------------------------------------------------------------

    def start(self, report: Report) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._report = report
        self._thread = threading.Thread(target=self._run, name=f"notice-watcher-{self.source}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            conn = self._inflight
        if conn is not None and conn.sock is not None:
            try:  # wake a read blocked in a long-poll now rather than at its timeout
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # The request in flight was cut short above; the thread is a
            # daemon, so not waiting longer never holds up the process's exit.
            thread.join(timeout=self.request_timeout_s + 1.0)

    @property
    def reported(self) -> tuple[Notice, ...]:
        """The notices reported so far, oldest first."""
        with self._lock:
            return tuple(self._reported.values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    # -- for subclasses --------------------------------------------------------------

    def _cycle(self) -> tuple[list[Notice], float | None]:
        raise NotImplementedError

    def _track(self, conn: http.client.HTTPConnection | None) -> None:
        """Pass as ``track=`` to :func:`request` from the watcher's thread, so that close() can cut it short."""
        with self._lock:
            self._inflight = conn

    def _trouble(self, exc: BadAnswer) -> None:
        self._complain(f"{self.source}: {exc.key}", f"{self.source} at {self.base_url}: {exc}")

    def _now(self) -> float:
        return self._clock()

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            notices: list[Notice] = []
            delay: float | None = None
            try:
                notices, delay = self._cycle()
            except Exception as exc:
                if self._stop.is_set():
                    return  # closed mid-cycle: the broken request was our own doing
                delay = self._failed(exc)
            else:
                self._answered = True
            for notice in notices:
                self._emit(notice)
            self._stop.wait(self.poll_interval_s if delay is None else delay)

    def _failed(self, exc: Exception) -> float | None:
        """Log a failed cycle; the delay before the next one (None: the normal interval)."""
        if isinstance(exc, Unreachable) or (isinstance(exc, BadAnswer) and not self._answered):
            # Nothing, or something that has never behaved like the service, is there.
            return self._unreachable(exc)
        if isinstance(exc, BadAnswer):
            self._trouble(exc)
        else:  # a bug here must not take the worker down
            self._complain(f"{self.source}: {type(exc).__name__}",
                           f"{self.source}: unexpected {type(exc).__name__} in the notice watcher: {exc}",
                           logging.ERROR)
        return None

    def _unreachable(self, exc: Exception) -> float:
        if self._answered:
            self._complain(f"{self.source}: unreachable", f"{self.source}: metadata service unreachable: {exc}")
            return self.poll_interval_s
        if not self._told_unreachable:
            self._told_unreachable = True
            log.info("no usable %s metadata service at %s (%s); not on that cloud? retrying every %gs",
                     self.source, self.base_url, exc, self.unreachable_retry_s)
        else:
            log.debug("%s still unreachable: %s", self.source, exc)
        return self.unreachable_retry_s

    def _emit(self, notice: Notice) -> None:
        """Report ``notice`` unless it was reported; a failed report is tried again at its next sighting.

        A notice counts as reported only once ``report`` has returned. Every
        attempt reports the notice as first seen (a GCP deadline is counted
        from the first sighting, not from a retry).
        """
        with self._lock:
            if notice.event_id in self._reported:
                return
            first = self._unreported.setdefault(notice.event_id, notice)
            resends = self._resends
        if first is notice:
            log.info("%s notice: %s (%s, deadline %s)", notice.source, notice.kind, notice.reason,
                     "none" if notice.deadline is None else time.strftime("%H:%M:%SZ", time.gmtime(notice.deadline)))
        try:
            if self._report is not None:
                self._report(first)
        except Exception as exc:  # the callback is the caller's; its failure must not stop the watcher
            self._complain(f"{self.source}: report", f"{self.source}: reporting {notice.event_id} failed "
                           f"(tried again at its next sighting): {exc!r}", logging.ERROR)
            return
        with self._lock:
            if resends == self._resends:  # else it may have gone to the driver that resend() was called for
                self._reported[notice.event_id] = self._unreported.pop(notice.event_id, first)

    def resend(self) -> None:
        """Report every notice reported so far again at its next sighting, as first seen.

        For a worker adopted by a restarted driver: the dead one may have taken a notice and
        died before it acted on it (or recorded it anywhere), and the new one knows of none.
        The metadata service still shows a notice until its host goes, so this is robust to a
        driver killed at any moment; one whose condition ended meanwhile is not sighted again
        and stays unreported, as it should.
        """
        with self._lock:
            for event_id, notice in self._reported.items():
                self._unreported.setdefault(event_id, notice)
            self._reported.clear()
            self._resends += 1

    def _forget(self, event_id: str) -> None:
        """Allow ``event_id`` to be reported again (its condition ended, e.g. maintenance back to NONE)."""
        with self._lock:
            self._reported.pop(event_id, None)
            self._unreported.pop(event_id, None)
