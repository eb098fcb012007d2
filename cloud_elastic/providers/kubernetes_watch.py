"""List, then watch, one kind of Kubernetes object on a thread of its own (what client-go's reflector does).

:class:`ResourceWatch` lists the objects (pages of 500), hands the complete
list to the view, then watches from the list's ``resourceVersion``:

* every event moves the kept ``resourceVersion`` on (``BOOKMARK`` events too),
  and a change that matters to the driver calls ``on_news``;
* a watch the server ends (at its ``timeoutSeconds``: ``watch_s`` in whole
  seconds, :func:`asked_s`) is started again at once, from the kept version,
  so nothing between the two is missed; one ended with nothing before its
  timeout (no line within 0.9 × the ``timeoutSeconds`` asked of the stream's
  opening: a proxy or server that will not hold a watch) is started again
  after a back-off of 0.5 s doubling to 30 s, and three such
  ends in a row are an outage from the first of them (a WARNING, once), as no
  change reaches the view meanwhile;
* a watch that goes **silent** is trouble too: the API server ends each watch
  at its ``timeoutSeconds`` and, since we ask for bookmarks, sends a
  ``BOOKMARK`` about two seconds before (and about once a minute on longer
  watches), so a healthy stream is never quiet for longer than the
  ``timeoutSeconds`` asked. The read timeout is :func:`silence_s` (that + the
  ``timeoutSeconds`` again, at least 3 s and at most 10 s): no byte for that long (a stalled
  path, a proxy that stopped forwarding, a peer gone without a reset) ends the
  request like a cut connection would. A read timeout is reset by every byte,
  so a stream that trickles (a blank line now and then) or is never ended
  would outlive it: each stream is also **cut** :func:`silence_s` after it
  opened, on the wall clock, whatever it sent, and that counts as a failure
  (:class:`WatchOverdue`), so the watch reconnects (after the back-off below);
* a line that is not a watch event (a JSON object whose ``type`` is
  ``ADDED``, ``MODIFIED``, ``DELETED``, ``BOOKMARK`` or ``ERROR``: say a List,
  from a proxy that dropped ``?watch=true``, or an HTML page), or a line
  longer than :data:`MAX_LINE`, is a failure
  too (:class:`NotAnEvent`, one WARNING an outage), not a sign of health;
  the stream is read in pieces of 64 KiB whatever the server sends (a
  chunk that says it is huge, an answer that is not chunked), so a line is
  refused once it passes the bound, not once it has all come;
* ``410 Gone`` (the kept version is older than the server's history, sent as
  an ``ERROR`` event or as the status of the request) relists: the view is
  replaced by the fresh list, so what happened in the gap is neither missed
  nor doubled, and the watch goes on from the new list's version. A second
  410 in a row (the watch from the fresh list's version refused too, with no
  event between) relists after a back-off of 0.5 s doubling to 30 s, with
  jitter, as client-go's reflector does, and the third is one WARNING: a
  server whose watch cache cannot serve its own lists costs a list every
  30 s, not a dozen a second. The view is then as old as the last list, and
  :meth:`ResourceWatch.trouble` says so once that is past :func:`silence_s`
  (never with the defaults: the back-off stays under 40 s);
* anything else (a connection cut or refused, a 5xx, a 429) is retried from
  the kept version after a back-off of 0.5 s doubling to 30 s, with jitter
  (back to 0.5 s once a stream has applied an event: a cut after serving well,
  a proxy's or an API server's under an event flood, is not an outage), or,
  for a 429 or 503 with ``Retry-After``, after what it asks if longer (at most
  30 s: :func:`~.kubernetes_stream.retry_after`).
  :meth:`ResourceWatch.trouble` says why, and since when the view may be
  stale: the failure, or the last line (event or bookmark) or response from
  the server when the stream had been silent past ``silence_s`` before it
  failed (a quiet healthy stream is no outage; a stalled one is reported
  ``silence_s`` after its last word at the latest, failed or not). An
  outage ends when a stream shows it is healthy (an event or bookmark
  applied, or a proper end) or a relist succeeds, not when a request is
  answered 200: a watch that is accepted and then fails (an ``ERROR`` event
  such as etcd's 500, a cut right after the headers) or goes silent goes on
  with the outage from its first failure, so retrying cannot hide it. Only
  the reconnect after an outage's first failure (one younger than
  ``silence_s``: not the end of a silence) is not reported while it has yet
  to show anything, as a healthy stream on a quiet cluster writes nothing
  until its bookmark; it is reported ``silence_s`` after it was answered at
  the latest. The worst case, from the last word: a failure just before
  ``silence_s``, that reconnect accepted and then silent for ``silence_s``:
  2 × ``silence_s`` + the first back-off (81 s with the defaults).

A list is bounded: at most :data:`MAX_ITEMS` objects and :data:`MAX_PAGES`
pages (:class:`ListTooLarge`), each page at most :data:`MAX_PAGE` bytes
(:class:`ListTooLarge`), all within ``LIST_TIMEOUTS`` × ``timeout_s``
(:class:`ListTooSlow`), on the wall clock: the connection of a page still
being read at that deadline is shut, so a body that trickles in (a byte a
second resets any read timeout) ends there too. An API server (or something
posing as one) that never ends a list costs one error, not the driver's memory.
Each page is read into the view's records as it comes (``read``), so a list
holds one page's JSON at a time, not the whole cluster's.
A page of the wrong shape (not JSON, its ``items`` not a list) is a
:class:`~cloud_elastic.providers.kubernetes_view.MalformedObject` naming the
field; one malformed object in it is the view's to leave out.

Events are parsed as plain JSON, not into the client's models: the view reads
a few fields, and building a ``V1Pod`` costs far more than reading it.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from typing import Any, Callable, Mapping

from cloud_elastic.providers.api import MAX_HOSTS
from cloud_elastic.providers.kubernetes_stream import (MAX_LINE, NotAnEvent, _close, _describe, _lines,  # noqa: F401
                                                      _parse, _shut, _Watchdog, retry_after)
from cloud_elastic.providers.kubernetes_view import Fields, MalformedObject, shown

__all__ = ["ResourceWatch", "Gone", "ListTooLarge", "ListTooSlow", "NotAnEvent", "WatchOverdue", "PAGE_SIZE",
           "silence_s", "asked_s", "keepalive_options"]

_log = logging.getLogger(__name__)

PAGE_SIZE = 500
_BACKOFF_FIRST_S = 0.5
_BACKOFF_MAX_S = 30.0
#: How long past its timeoutSeconds a watch may stay silent: the server's bookmark comes ~2 s before its deadline,
#: and the end of the stream at it; the rest is room for a busy server and the network.
_SILENCE_MARGIN_S = 10.0
#: A stream that ends with no line in it shows the watch healthy only if it was held this share of the
#: ``timeoutSeconds`` asked (:func:`asked_s`):
#: one that a proxy or server ends with nothing before its timeout has shown nothing, and must not end an outage.
_HELD_FRACTION = 0.9
#: Watches in a row ended with nothing before their timeout that make the watch down (from the first of them), warned once:
#: one such end may be a server's restart; three (0.5 + 1 + 2 s of back-off) are a proxy that will not hold a
#: watch, and the view gets no change meanwhile.
_EMPTY_ENDS = 3
#: TCP keepalive on the client's sockets: a peer that stops acknowledging (a node or NAT gone) fails the read after
#: 15 s idle + 3 unanswered probes 5 s apart = 30 s, before the read timeout; the probes also keep a NAT or load
#: balancer from dropping a quiet watch's connection.
_KEEPALIVE = {"TCP_KEEPIDLE": 15, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}
#: The most objects one list keeps: more pods than the driver takes hosts, more nodes than a cluster has (5,000).
MAX_ITEMS = MAX_HOSTS
#: The most pages one list reads: three times what MAX_ITEMS takes in full pages (the API server fills them).
MAX_PAGES = 100
#: The most bytes one page may have: 500 objects of 128 KiB (a pod or node is a few KiB to a few tens).
MAX_PAGE = 64 * 1024 * 1024
#: A whole list (every page) must end within this many ``timeout_s``.
LIST_TIMEOUTS = 6
#: 410s in a row (each after a relist, with no event between) from which the relists back off, and from which
#: one WARNING says so.
_GONE_BACKOFF_FROM = 2
_GONE_WARN_AT = 3


def asked_s(watch_s: float) -> int:
    """The ``timeoutSeconds`` a watch of ``watch_s`` asks for: whole seconds (rounded down), at least 1.

    The server ends a healthy watch then, so an end is measured against this, not ``watch_s``: a 2.5 s watch
    the server properly ends at 2 s (with no bookmark on a quiet cluster) is held, not empty."""
    return max(1, int(watch_s))


def silence_s(watch_s: float) -> float:
    """The read timeout of a watch of ``watch_s`` seconds: a stream quiet this long is stalled.

    Measured from the ``timeoutSeconds`` asked (:func:`asked_s`), which the server holds a quiet watch for: a
    ``watch_s`` of 0.4 asks for 1 s, and a read timeout of 0.8 s would cut every healthy quiet watch. The
    margin past it is at least 3 s: a loaded API server (or driver) that ends a 1 s watch a second late is
    not stalled (a margin of 1 s made such a watch a false outage in a loaded test run)."""
    asked = asked_s(watch_s)
    return asked + min(_SILENCE_MARGIN_S, max(asked, 3.0))


def keepalive_options(base: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``base`` (urllib3's default socket options) with TCP keepalive on, where the platform has the knobs."""
    options = list(base) + [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in _KEEPALIVE.items():
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


class Gone(Exception):
    """The kept resourceVersion is too old (HTTP 410): relist."""


class WatchError(Exception):
    """An ``ERROR`` event other than 410: retried with back-off."""


class ListTooLarge(Exception):
    """A list past :data:`MAX_ITEMS` objects, :data:`MAX_PAGES` pages or a page past :data:`MAX_PAGE` bytes."""


class ListTooSlow(Exception):
    """A list that did not end within ``LIST_TIMEOUTS`` × ``timeout_s``."""


class WatchOverdue(Exception):
    """A watch stream still open :func:`silence_s` after it opened (a trickle, a server that ignores
    ``timeoutSeconds``): cut, and retried with back-off like a cut connection."""


class ResourceWatch:
    """One kind's list and watch (see the module docstring).

    ``call(**kwargs)`` is the client's list function with its path arguments
    bound (``CoreV1Api.list_namespaced_pod`` with the namespace); it is always
    called with ``_preload_content=False``. ``replace(items)`` and
    ``apply(kind, obj)`` feed the view under ``lock`` and return whether the
    snapshot may have changed; ``read(objs)``, under ``lock`` too, reads each
    page of a list as it comes (the view's small records, not the page's JSON,
    are what ``replace`` then gets). :meth:`sync` runs on the caller's thread and
    raises the client's errors as they are; :meth:`start` runs the watch on a
    daemon thread until :meth:`stop`.
    """

    def __init__(self, what: str, call: Callable[..., Any], *, replace: Callable[[list], bool],
                 apply: Callable[[str, Mapping[str, Any]], bool], lock: threading.Lock,
                 on_news: Callable[[], None], selector: str | None = None, timeout_s: float = 10.0,
                 watch_s: float = 30.0, rng: random.Random | None = None, narrow: str | None = None,
                 read: Callable[[list], list] = list) -> None:
        self.what = what
        #: What a list past MAX_ITEMS tells the user to do: the option that narrows it.
        self._narrow = narrow or f"narrow the {what} selector"
        self._call = call
        self._replace = replace
        self._read = read
        self._apply = apply
        self._lock = lock
        self._on_news = on_news
        self._selector = selector
        self._timeout_s = timeout_s
        self._watch_s = watch_s
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self._trouble: tuple[float, str] | None = None
        #: The outage a watch now open may end: it is over once the stream shows it is healthy, and goes on (from
        #: its first failure) if the stream fails before. Not reported meanwhile: a healthy quiet stream writes
        #: nothing until its bookmark. Only the reconnect after an outage's first failure, while it is younger
        #: than silence_s, is such: any later one leaves the outage reported until its stream shows it is healthy.
        self._resuming: tuple[float, str] | None = None
        self._failures = 0  # of the present outage (requests failed, accepted streams that showed nothing)
        self._heard = time.time()  # the last line or response from the server: the view is current up to then
        self._empty: list[float] = []  # when each watch of the present run of empty ends ended
        self._gones = 0  # 410s in a row, each after a relist, with no event between
        #: The stream (or a relist) showed the server healthy since the last failure: the back-off starts again.
        self._proven = False
        self._warned_not_event = False  # the WARNING of the present outage for an answer that is not an event
        self._refused = False  # its first list failed (refused()): start() lists before it watches
        #: The resourceVersion the next watch starts from (of the last list or event).
        self.resource_version: str | None = None
        #: Counters, for tests and benchmarks: lists made (the first included), watch requests, events.
        self.lists = 0
        self.watches = 0
        self.events = 0

    # -- list ----------------------------------------------------------------------------

    def _selection(self) -> dict[str, Any]:
        return {"label_selector": self._selector} if self._selector else {}

    def list_all(self) -> tuple[list[dict], str]:
        """Every object, in pages; returns (items, the list's resourceVersion).

        Bounded (see the module docstring): ListTooLarge, ListTooSlow; the client's errors as they are.
        """
        items = self._read([])  # the type read() gives (a ClusterView.read's ReadList)
        token: str | None = None
        version = ""
        deadline = time.monotonic() + LIST_TIMEOUTS * self._timeout_s
        for pages in range(1, MAX_PAGES + 1):
            extra = {"_continue": token} if token else {}
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._too_slow(pages)
            resp = self._call(limit=PAGE_SIZE, _preload_content=False, _request_timeout=min(self._timeout_s, left),
                              **self._selection(), **extra)
            fields, meta = self._read_page(self._page(resp, deadline, pages), items)  # the page's JSON ends here
            if len(items) > MAX_ITEMS:
                raise ListTooLarge(f"listing {self.what}: more than {MAX_ITEMS} objects, the most one list keeps "
                                   f"({self._narrow})")
            version = version or fields.get(meta, "metadata", "resourceVersion", str, "")
            token = fields.get(meta, "metadata", "continue", str)
            if not token:
                return items, version
        raise ListTooLarge(f"listing {self.what}: no end after {MAX_PAGES} pages ({len(items)} objects): the API "
                           "server keeps sending a continue token")

    def _read_page(self, body: bytes, items: list) -> tuple[Fields, Mapping[str, Any]]:
        """A page's items read (``read``, under the lock: the view's records, one that is malformed left out
        there) and added to ``items``; the page's fields and its metadata. MalformedObject, naming the field, for a page of the wrong shape."""
        context = f"listing {self.what}: "
        try:
            page = json.loads(body)
        except ValueError as exc:
            raise MalformedObject(f"{context}a page that is not JSON ({shown(body, 60)}: {exc})") from None
        fields = Fields("page", page, context)
        objs = fields.get(page, "", "items", list, [])
        with self._lock:
            items.extend(self._read(objs))
        return fields, fields.get(page, "", "metadata", Mapping, {})

    def _too_slow(self, pages: int) -> ListTooSlow:
        return ListTooSlow(f"listing {self.what}: no end within {LIST_TIMEOUTS * self._timeout_s:g} s "
                           f"({LIST_TIMEOUTS} x timeout_s), at page {pages}")

    def _page(self, resp: Any, deadline: float, pages: int) -> bytes:
        """A page's body, read whole within the bounds; the connection is reused only when read to the end.

        At the list's deadline a watchdog shuts the connection, so a body that trickles in ends there."""
        body = bytearray()
        watchdog = _Watchdog(resp, deadline - time.monotonic())
        try:
            with watchdog:
                for chunk in resp.stream(amt=1 << 16):
                    body += chunk
                    if len(body) > MAX_PAGE:
                        raise ListTooLarge(f"listing {self.what}: a page larger than {MAX_PAGE} bytes")
                    if time.monotonic() > deadline:
                        raise self._too_slow(pages)
            if watchdog.fired:  # the read ended at the shut connection: what came is not the whole page
                raise self._too_slow(pages)
        except (ListTooLarge, ListTooSlow):
            _close(resp)
            raise
        except BaseException as exc:
            _close(resp)
            if watchdog.fired:
                raise self._too_slow(pages) from exc
            raise
        resp.release_conn()
        return bytes(body)

    def sync(self) -> bool:
        """List everything and replace the view's table; True if the snapshot may have changed."""
        items, version = self.list_all()
        with self._lock:
            changed = self._replace(items)
            self.resource_version = version
        self._heard = time.time()
        self.lists += 1
        return changed

    # -- watch ---------------------------------------------------------------------------

    def start(self) -> None:
        """Watch on a daemon thread from the version of the last :meth:`sync`; after :meth:`refused`, list first,
        retried with the watch's back-off until a list succeeds."""
        self._heard = time.time()  # silence counts from here: what changed since the list comes with the first lines
        self._thread = threading.Thread(target=self._run, args=(self._refused,), name=f"k8s-watch-{self.what}",
                                        daemon=True)
        self._thread.start()

    def refused(self, why: str) -> float:
        """The first :meth:`sync` failed (``why``): the watch is down from now (:meth:`trouble`) until a list
        started by :meth:`start` succeeds. Returns the outage's start."""
        self._refused = True
        self._trouble = (time.time(), why)
        return self._trouble[0]

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the watch: the open stream is shut so its read returns now. Idempotent."""
        self._stop.set()
        _shut(self._resp)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def trouble(self) -> tuple[float, str] | None:
        """(since when the view may be stale, why) while the watch is down; None while it runs.

        Down: a request failed and no stream has shown it is healthy since (an event or bookmark applied, a
        proper end: one held for about the ``timeoutSeconds`` asked, not an empty one ended before; a relist),
        or the server has been silent longer than :func:`silence_s` (the thread may still be waiting on it: a
        request urllib3 retries can take several read timeouts before it fails), or, after 410s in a row, the
        relists' back-off has left the view older than that. The stream reconnected after an outage's
        first failure is not reported while it has yet to show anything (a healthy one on a quiet cluster
        writes nothing until its bookmark); if it fails or goes silent, the outage goes on from its start.
        """
        trouble, resuming = self._trouble, self._resuming
        quiet = time.time() - self._heard
        if trouble is None and self._thread is not None and quiet > silence_s(self._watch_s):
            if resuming is not None:  # a reconnect that said nothing: the outage it was to end goes on
                return resuming[0], f"no word from the API server for {quiet:.0f} s since it reconnected after: " \
                                    f"{resuming[1]}"
            gones = self._gones
            if gones >= _GONE_BACKOFF_FROM:  # waiting to relist: the view is the last list's
                return self._heard, f"{gones} watches in a row answered 410 Gone right after a relist; relisting " \
                                    f"with back-off, the view is {quiet:.0f} s old"
            return self._heard, f"no word from the API server for {quiet:.0f} s (a stalled connection?)"
        return trouble

    def _run(self, relist: bool = False) -> None:
        delay = _BACKOFF_FIRST_S
        while not self._stop.is_set():
            try:
                if relist:
                    if self._gones >= _GONE_BACKOFF_FROM:  # refused again right after a relist: back off
                        doublings = min(16, self._gones - _GONE_BACKOFF_FROM)
                        gone_delay = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** doublings)
                        if self._stop.wait(gone_delay * (0.75 + 0.5 * self._rng.random())):
                            return
                    changed = self.sync()
                    relist = False
                    first, self._refused = self._refused, False
                    if first:  # not a watch resumed: one whose first list succeeded at last
                        self._trouble = self._resuming = None
                        _log.info("%s listed at last, at version %s: watching from it", self.what,
                                  self.resource_version)
                    self._healthy()  # the view is the server's, as of now
                    if not first:
                        _log.info("%s watch: resourceVersion expired (410 Gone); relisted %s at version %s",
                                  self.what, self.what, self.resource_version)
                    if changed:
                        self._on_news()
                held = self._watch_once()
                self._gones = 0  # the watch served its version
                if held:
                    delay = _BACKOFF_FIRST_S
                else:  # ended with nothing before its timeout: a proxy or server that will not hold a watch
                    self._ended_empty()
                    self._stop.wait(delay)
                    delay = min(_BACKOFF_MAX_S, delay * 2)
            except Gone:
                relist = self._gone()
            except Exception as exc:  # cut, refused, 5xx, 429, a bad line: back off, resume from the kept version
                if self._stop.is_set():
                    return
                if getattr(exc, "status", None) == 410:  # the request itself answered 410 Gone
                    relist = self._gone()
                    continue
                reason = _describe(exc)
                if isinstance(exc, NotAnEvent) and not self._warned_not_event:
                    self._warned_not_event = True
                    _log.warning("%s watch: %s; retrying with back-off, and no change reaches the view until a "
                                 "watch is answered with events", self.what, reason)
                self._failures += 1
                if self._trouble is None and self._resuming is None:
                    self._trouble = (self._down_since(), reason)
                    _log.info("%s watch interrupted (%s); reconnecting from version %s", self.what, reason,
                              self.resource_version)
                else:  # a retry failed, or its stream did before it showed it was healthy: the outage goes on
                    self._trouble = (self._trouble[0] if self._trouble else self._down_since(self._resuming), reason)
                    _log.debug("%s watch still down: %s", self.what, reason)
                self._resuming = None
                if self._proven:  # its stream applied an event before it was cut: the server is there (a proxy
                    delay = _BACKOFF_FIRST_S  # that resets long streams): reconnect soon, as client-go does
                self._proven = False
                asked = retry_after(exc)  # a throttled answer: not again before it says (within bounds)
                self._stop.wait(max(delay * (0.75 + 0.5 * self._rng.random()), asked[1] if asked else 0.0))
                delay = min(_BACKOFF_MAX_S, delay * 2)

    def _gone(self) -> bool:
        """A 410 Gone: count it (in a row, since a watch last served its version) and warn once at the third."""
        self._gones += 1
        self._heard = time.time()  # an answer: the view is current up to the relist that follows
        if self._gones == _GONE_WARN_AT:
            _log.warning("%s watch: %d watches in a row answered 410 Gone right after a relist (an API server whose "
                         "watch cache cannot serve its own lists?); relisting with back-off up to %g s, so changes "
                         "reach the view only at each relist", self.what, self._gones, _BACKOFF_MAX_S)
        return True

    def _down_since(self, outage: tuple[float, str] | None = None) -> float:
        """Since when a watch that just failed has been down.

        From ``outage`` when the stream reconnected after a failure and failed (or went silent) before it showed
        it was healthy: retrying must not restart the clock, and the outage began before the reconnect. Else from
        the last word if the stream had been silent for :func:`silence_s` (its read timeout): it was stalled (what
        :meth:`trouble` already reported), and the view has been stale since. Else from now: a healthy but quiet
        stream (a real server writes nothing between a watch's start and its bookmark ~2 s before its end) says
        nothing about the time before the failure, and dating it from the last word would report a 2 s reconnect
        late in a watch as an outage of ``watch_s``.
        """
        now = time.time()
        if outage is not None:
            return outage[0]
        if now - self._heard >= silence_s(self._watch_s):
            return self._heard
        return now

    def _ended_empty(self) -> None:
        """A watch ended with nothing in it before its timeout. The :data:`_EMPTY_ENDS`-th in a row makes the watch down
        since the first of them (warned once; it ends as any outage does, when a stream shows it is healthy)."""
        if self._stop.is_set() or self._trouble is not None:
            return  # an outage already under way goes on (see _watch_once)
        self._empty.append(time.time())
        if len(self._empty) >= _EMPTY_ENDS:
            reason = f"{len(self._empty)} watches in a row ended with nothing in them before their timeout"
            self._trouble = (self._empty[0], reason)
            _log.warning("%s watch: %s (a proxy or API server that will not hold a watch?); no change reaches "
                         "the view until one holds", self.what, reason)

    def _healthy(self) -> None:
        """The stream showed it is healthy (an event or bookmark applied, a proper end), or a relist succeeded."""
        self._empty.clear()
        self._failures = 0
        self._warned_not_event = False
        self._proven = True
        if self._trouble is not None or self._resuming is not None:
            _log.info("%s watch resumed at version %s", self.what, self.resource_version)
            self._trouble = self._resuming = None

    def _watch_once(self) -> bool:
        """One watch request, its events applied until the stream ends; False if it ended with nothing in it
        before :data:`_HELD_FRACTION` × the ``timeoutSeconds`` asked (timed from the stream's opening), or was
        not read."""
        asked = asked_s(self._watch_s)
        resp = self._call(watch=True, resource_version=self.resource_version, allow_watch_bookmarks=True,
                          timeout_seconds=asked, _preload_content=False,
                          _request_timeout=(self._timeout_s, silence_s(self._watch_s)), **self._selection())
        self.watches += 1
        self._resp = resp
        self._heard = time.time()
        if self._stop.is_set():  # stop() ran while the request was under way: it could not shut this one
            self._resp = None
            _close(resp)
            return False
        # The reconnect after an outage's first failure (not the end of a silence) is given the benefit of the
        # doubt until it shows something; any later one leaves the outage reported (each accepted reconnect of a
        # path that then says nothing hid it for silence_s again, and dated it anew).
        trouble = self._trouble
        if trouble is None or (self._failures == 1 and time.time() - trouble[0] < silence_s(self._watch_s)):
            self._resuming, self._trouble = trouble, None  # over once the stream shows it is healthy
        lines = 0
        opened = time.monotonic()
        # A read timeout is reset by every byte: a stream that trickles blank lines, or one the server never ends,
        # is cut on the wall clock where a silent one would have timed out.
        bound = silence_s(self._watch_s)
        watchdog = _Watchdog(resp, bound)
        try:
            try:
                with watchdog:
                    for line in _lines(resp):
                        if self._stop.is_set():
                            break
                        event = _parse(line)
                        lines += 1
                        self._heard = time.time()
                        self._event(event)
                        self._gones = 0
                        self._healthy()
            except Exception as exc:
                if watchdog.fired and not self._stop.is_set():
                    raise self._overdue(bound, asked, lines) from exc
                raise
            if watchdog.fired and not self._stop.is_set():  # it ended at the shut connection, not the server's end
                raise self._overdue(bound, asked, lines)
            self._heard = time.time()  # the server ended the stream: it was there until now
            held = bool(lines) or time.monotonic() - opened >= _HELD_FRACTION * asked
            if held:
                self._healthy()  # a proper end
            elif self._resuming is not None:  # an empty stream ended early (a proxy that will not hold a watch)
                self._trouble, self._resuming = self._resuming, None  # shows nothing: the outage goes on
                self._failures += 1
        finally:
            self._resp = None
            _close(resp)
        return held

    @staticmethod
    def _overdue(bound: float, asked: int, lines: int) -> WatchOverdue:
        what = f"after {lines} event(s)" if lines else "with no event or bookmark in it"
        return WatchOverdue(f"the stream was still open {bound:g} s after it opened, {what}, although "
                            f"{asked} s was asked (a server or proxy that trickles or ignores timeoutSeconds?): cut")

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event["object"]  # an object (a Status) in an ERROR or BOOKMARK; in a change, whatever came (_parse)
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise WatchError(f"{obj.get('code')} {obj.get('reason', '')}: {obj.get('message', '')}")
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        version = version if isinstance(version, str) else None  # an object that does not read: the view says so
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.events += 1
            with self._lock:
                changed = self._apply(kind, obj)
                if version:
                    self.resource_version = str(version)
            if changed:
                self._on_news()
        elif kind == "BOOKMARK" and version:
            with self._lock:
                self.resource_version = str(version)
