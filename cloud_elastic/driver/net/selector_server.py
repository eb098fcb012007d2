"""What the driver's two servers share: one ``selectors`` thread serving every connection.

:class:`SelectorServer` is the loop of the control plane (:mod:`.control_server`) and of the
rendezvous store (:mod:`.store_server`): it accepts connections (paused, not spinning, while the
process is out of descriptors, :class:`~.accepting.AcceptPause`; at most the server's share of
the descriptor limit, :func:`~.accepting.descriptor_share`), reads what arrives, sends what is
queued without ever blocking, drops connections, and is woken from other threads through a
socket pair. Each server keeps a :class:`Connection` (or a subclass) per client and says what it
makes of the bytes that arrived (:meth:`SelectorServer._received`), what else it does each round
of events and when it must next look again.

One thread serves every connection: a large group keeps a connection or two per worker open,
mostly idle or holding a long-poll, and a thread per connection costs more in switching than the
requests themselves.

**Strangers cannot lock the workers out.** A connection is *unproven* until it shows it comes from
a holder of the job's secret (the control plane: a request signed with it; the store: a key of a
round's namespace, which only the secret derives); a server may tell unproven connections apart by
how far they got (its ``tier``: the store's tier 1 is a connection that validated, the next step
of torch's client). A new connection always finds room: when its address holds
``unproven_per_address`` unproven connections, the oldest of them is closed; when the lowest tier
holds :data:`~.accepting.UNPROVEN_SHARE` of the server's share, its oldest is closed; when the
server's share is full, the oldest connection of the lowest tier is. Only when every connection is
proven is the new one refused. Before a connection is closed for a newer one, what it has sent is
read: a worker whose signed request waited behind a burst of connections proves itself then. A
proven connection is never closed to make room for a stranger. A server may also bound the bytes
that unproven connections hold together (``unproven_bytes``; what a connection holds is its inbox, or
what the server says, :meth:`SelectorServer._holds`: the store counts its unfinished command, awaited keys and
unread answers): past it, the unproven connection that has held bytes longest is closed, after the same read.

**Nothing a client does ends the serving thread.** A hook that raises while handling one connection (a bug, or a
reply the server cannot make) costs that connection: :meth:`SelectorServer._failed` answers or drops it, and the
error is logged once per kind, with its traceback. A hook that raises outside any connection is logged the same
way, and the loop goes on; were the loop itself to fail, it starts again. Before, one reply over the control
plane's size limit ended the thread, and every worker's next call was refused for the rest of the job.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from typing import Any, Callable

from cloud_elastic.driver.net.accepting import UNPROVEN_SHARE, AcceptPause, RefusalLog, descriptor_share, power_of_ten

__all__ = ["Connection", "PROVEN", "SelectorServer", "listening"]

log = logging.getLogger(__name__)

#: Selector keys' data for the listener and the wake socket (a connection's key holds its Connection).
_ACCEPT = "accept"
_WAKE = "wake"
#: The tier of a connection that proved it comes from the job (see the module docstring).
PROVEN = -1
#: Kinds of failure told apart; past them, everything is "other" (a bound, should a bug vary its text).
_MAX_FAILURE_KINDS = 64
#: How long the loop waits before starting again after it failed outside any hook (it cannot have: a last guard).
_RESTART_S = 0.1


def listening(bind: str, port: int, backlog: int, *, family: int = socket.AF_INET) -> socket.socket:
    """A socket bound to ``bind:port`` (port 0: any free one) and listening; OSError when it cannot bind, and
    nothing is left open then."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


class Connection:
    """One client: its socket, the bytes it sent that are not handled yet (``inbox``) and those to send it
    (``outbox``). ``open`` turns False once it is dropped; ``last`` is when it last sent something."""

    def __init__(self, sock: socket.socket, address: str, peer: str) -> None:
        self.sock = sock
        self.address = address
        self.peer = peer  # how the logs name it
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.open = True
        self.last = time.monotonic()
        self.events = selectors.EVENT_READ  # what the selector watches for on it
        self.tier = 0  # how far it got towards proving it comes from the job; PROVEN once it did
        self.counted = 0  # the bytes of its inbox counted against the server's unproven_bytes

    @property
    def proven(self) -> bool:
        return self.tier == PROVEN


class SelectorServer:
    """One ``selectors`` thread serving a listening socket's connections, from :meth:`_serve_on` until :meth:`close`.

    A subclass names itself (``name``, for logs and its thread), its share of the descriptor limit
    (``share``, said as ``share_words``), how many unproven connections one address may hold
    (``unproven_per_address``) and how many bytes their inboxes may hold together (``unproven_bytes``),
    how many tiers of unproven connections it tells apart (``tiers``) and what each had not done yet
    (``tier_words``, for the log) and how much it reads at once (``recv_bytes``), calls :meth:`_promote`
    as a connection gets further, and fills in the hooks: :meth:`_connect`, :meth:`_received`, and as it
    needs :meth:`_refusal`, :meth:`_writable`, :meth:`_interest`, :meth:`_flushed`, :meth:`_dropped`, :meth:`_timeout`,
    :meth:`_before_events` and :meth:`_after_events`, and :meth:`_failed` for a connection whose hook raised.
    Every hook runs on the serving thread. ``max_connections`` caps the connections below the share (None: the
    share alone).
    """

    name = "server"
    share = 0.25
    share_words = "a quarter of"
    recv_bytes = 1 << 16
    join_s = 5.0
    tiers = 1
    unproven_per_address = 64
    #: What a connection of each tier had not done yet, for the log.
    tier_words: tuple[str, ...] = ("it had not proven it comes from the job",)
    #: Whether the logs name a client by address and port, or by address alone.
    peer_has_port = True
    #: How many bytes the inboxes of unproven connections may hold together (None: no bound here).
    unproven_bytes: int | None = None
    #: The most connections open at once, whatever the descriptor limit (None: the share alone).
    max_connections: int | None = None

    def __init__(self, refusals: RefusalLog) -> None:
        self._refusals = refusals
        self._listener: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._thread: threading.Thread | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._signalled = False
        self._closing = False
        self._connections: set[Connection] = set()
        # The unproven connections, oldest first (dicts keep their order): by tier, and by address.
        self._unproven: list[dict[Connection, None]] = [{} for _ in range(self.tiers)]
        self._unproven_from: dict[str, dict[Connection, None]] = {}
        # The unproven connections whose inboxes hold bytes, in the order they began to, and those bytes.
        self._holding: dict[Connection, None] = {}
        self._holding_bytes = 0
        self._failures: dict[tuple[str, str], int] = {}  # how often each kind of failure was seen

    # ------------------------------------------------------------- lifecycle
    def _serve_on(self, listener: socket.socket) -> None:
        """Serve ``listener`` (bound and listening; the server owns it from now on) from a daemon thread."""
        if self._thread is not None:
            raise RuntimeError(f"the {self.name} server is already started")
        listener.setblocking(False)
        self._listener = listener
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, _ACCEPT)
        self._pause = AcceptPause(self._selector, listener, _ACCEPT, self.name)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._serve, name=self.name.replace(" ", "-"), daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving; the serving thread closes every connection, the listener and its own sockets
        (each once). Idempotent; a server never started closes only its listener, if it has one."""
        if self._closing:
            return
        self._closing = True
        if self._thread is None:
            if self._listener is not None:
                self._listener.close()
            return
        self.wake()
        if self._thread is not threading.current_thread():
            self._thread.join(self.join_s)

    def wake(self) -> None:
        """Make the serving thread go round its loop now (from any thread)."""
        if not self._signalled and self._wake_w is not None:
            self._signalled = True
            try:
                self._wake_w.send(b"x")
            except OSError:  # full (the loop is behind and will look anyway) or closed
                pass

    # ------------------------------------------------------------------ loop
    def _serve(self) -> None:
        try:
            while not self._closing:
                try:
                    self._loop()
                except Exception as exc:  # a bug in the loop itself: stopping would refuse every client from now on
                    self._log_failure("its loop failed; it goes on", exc)
                    time.sleep(_RESTART_S)
        finally:
            for conn in list(self._connections):
                self._drop(conn)
            assert self._selector is not None and self._listener is not None
            self._selector.close()
            self._listener.close()
            for s in (self._wake_r, self._wake_w):
                if s is not None:
                    s.close()

    def _loop(self) -> None:
        assert self._selector is not None
        while not self._closing:
            try:
                timeout = self._timeout()
            except Exception as exc:
                self._log_failure("its timeout hook failed", exc)
                timeout = 1.0
            try:
                events = self._selector.select(self._pause.timeout(timeout))
            except OSError:  # a descriptor closed under select: go round again
                continue
            self._hook(self._before_events)
            for key, mask in events:
                if key.data == _ACCEPT:
                    self._accept()
                elif key.data == _WAKE:
                    self._drain_wake()
                elif key.data.open:  # not dropped earlier in this round of events
                    conn = key.data
                    if mask & selectors.EVENT_WRITE:
                        try:
                            self._writable(conn)
                        except Exception as exc:
                            self._fail(conn, exc)
                    if mask & selectors.EVENT_READ and conn.open:
                        self._read(conn)
                        self._hook(self._keep_to_budget)
            self._pause.resume_if_due()
            self._hook(self._after_events)

    def _hook(self, hook: Callable[[], None]) -> None:
        """Run a hook that concerns no one connection; a failure is logged (once per kind) and the loop goes on."""
        try:
            hook()
        except Exception as exc:
            self._log_failure(f"{hook.__name__.strip('_').replace('_', ' ')} failed", exc)

    def _fail(self, conn: Connection, exc: Exception) -> None:
        """A hook raised ``exc`` while handling ``conn``: log it once per kind; :meth:`_failed` answers or drops it."""
        self._log_failure(f"failed handling a connection from {conn.peer}", exc)
        try:
            self._failed(conn, exc)
        except Exception as again:
            self._log_failure(f"failed answering a connection from {conn.peer} after an error", again)
            self._drop(conn)

    def _log_failure(self, what: str, exc: Exception, *, trace: bool = True, kind: str = "") -> None:
        """Log a failure at ERROR the first time its kind (its type, and where it was raised) is seen, with its
        traceback (a bug) or in one line (``trace`` False: a limit the job ran into), then count that kind at 10,
        100, 1,000...: a client that sets off the same failure again and again cannot flood the log. ``kind`` tells
        apart failures raised at the same place (the control plane: the kind of request)."""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        # Where it was raised, not its text: the same failure's text may name sizes or clients that vary.
        where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else str(exc)[:200]
        key = (type(exc).__name__, where + kind)
        if key not in self._failures and len(self._failures) >= _MAX_FAILURE_KINDS:
            key = ("other", "")
        n = self._failures[key] = self._failures.get(key, 0) + 1
        if n == 1 and not trace:
            log.error("%s: %s: %s", self.name, what, exc)
        elif n == 1:
            log.error("%s: %s (a bug; please report it)", self.name, what, exc_info=(type(exc), exc, exc.__traceback__))
        elif power_of_ten(n):
            log.error("%s: %d failures of this kind so far (the latest: %s: %s)", self.name, n, key[0],
                      str(exc)[:200])

    def _drain_wake(self) -> None:
        assert self._wake_r is not None
        self._signalled = False  # before the hooks look at their queues, so a later wake signals again
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # out of descriptors (paused a moment), or a connection reset before accept
                if not self._pause.failed(exc):
                    log.warning("%s: cannot accept a connection: %s", self.name, exc)
                return
            self._pause.accepted()
            try:
                self._take(sock, addr)
            except Exception as exc:
                self._log_failure(f"failed accepting a connection from {addr[0]}", exc)
                conn = next((c for c in self._connections if c.sock is sock), None)
                if conn is not None:
                    self._drop(conn)
                else:
                    sock.close()

    def _take(self, sock: socket.socket, addr: tuple[Any, ...]) -> None:
        """Serve the connection just accepted, unless there is no room for it (then it is closed)."""
        assert self._selector is not None
        peer = f"{addr[0]}:{addr[1]}" if self.peer_has_port else addr[0]
        refusal = self._make_room(addr[0])
        if refusal is not None:  # strangers' idle connections must leave descriptors for launches
            self._refusals.refused(refusal[0], peer, refusal[1])
            sock.close()
            return
        sock.setblocking(False)
        # An answer is one write, so Nagle's algorithm could only delay it.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self._connect(sock, addr[0], peer)
        self._connections.add(conn)
        self._unproven[0][conn] = None
        self._unproven_from.setdefault(conn.address, {})[conn] = None
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _make_room(self, address: str) -> tuple[str, str] | None:
        """Close unproven connections so that one more from ``address`` fits (see the module docstring);
        (kind, reason) when it cannot: every connection open is proven, or :meth:`_refusal` says no."""
        refusal = self._refusal(address)
        if refusal is not None:
            return refusal
        at_most = descriptor_share(self.share)
        if self.max_connections is not None:
            at_most = min(at_most, self.max_connections)
        mine = self._unproven_from.get(address)
        if mine is not None and len(mine) >= self.unproven_per_address:
            self._evict(mine, f"{len(mine)} such from {address} are open, at most {self.unproven_per_address}")
        first = self._unproven[0]
        if len(first) >= max(1, int(at_most * UNPROVEN_SHARE)):
            self._evict(first, f"{len(first)} such are open, at most {int(at_most * UNPROVEN_SHARE)} (a quarter of "
                               f"the {at_most} connections the {self.name} may hold)")
        while len(self._connections) >= at_most:
            pool = next((tier for tier in self._unproven if tier), None)
            if pool is None:
                return ("too many connections", f"{len(self._connections)} connections are open, at most "
                                                f"{at_most} ({self.share_words} the driver's descriptor limit)")
            self._evict(pool, f"{len(self._connections)} connections are open, at most {at_most} "
                              f"({self.share_words} the driver's descriptor limit)")
        return None

    def _keep_to_budget(self) -> None:
        """Close unproven connections, those that have held bytes longest first, while their inboxes hold more
        than ``unproven_bytes`` together: a worker's request is in the inbox for a read or two."""
        while self.unproven_bytes is not None and self._holding_bytes > self.unproven_bytes and self._holding:
            self._evict(self._holding, f"unproven connections hold {self._holding_bytes} bytes, "
                                       f"at most {self.unproven_bytes}", room_for="newer bytes")

    def _evict(self, pool: dict[Connection, None], why: str, *, room_for: str = "a newer connection") -> None:
        """Close the oldest connection of ``pool`` that what it sent so far does not take out of it (or let one
        go that its read closes): a worker's request may have waited unread behind a burst of strangers'."""
        while pool:
            conn = next(iter(pool))
            self._read(conn)
            if conn in pool:
                self._refusals.refused(f"closed for {room_for}", conn.peer,
                                       f"closed to make room for {room_for}: {self.tier_words[conn.tier]} ({why})")
                self._drop(conn)
            if not conn.open:
                return

    def _promote(self, conn: Connection, tier: int) -> None:
        """``conn`` got as far as ``tier`` (:data:`PROVEN`: it proved it comes from the job)."""
        if conn.tier == tier or conn.proven or not conn.open:
            return
        self._unproven[conn.tier].pop(conn, None)
        conn.tier = tier
        if tier == PROVEN:
            self._forget_unproven(conn)
        else:
            self._unproven[tier][conn] = None

    def _forget_unproven(self, conn: Connection) -> None:
        self._count(conn)
        mine = self._unproven_from.get(conn.address)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._unproven_from[conn.address]

    def _read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(self.recv_bytes)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self._drop(conn)
            return
        conn.inbox += data
        conn.last = time.monotonic()
        try:
            self._received(conn)
        except Exception as exc:
            self._fail(conn, exc)
        self._count(conn)

    def _count(self, conn: Connection) -> None:
        """Bring the count of the bytes unproven connections hold (``unproven_bytes``) up to date with ``conn``'s."""
        if self.unproven_bytes is None:
            return
        held = self._holds(conn) if conn.open and not conn.proven else 0
        self._holding_bytes += held - conn.counted
        conn.counted = held
        if held:
            self._holding.setdefault(conn, None)
        else:
            self._holding.pop(conn, None)

    def _holds(self, conn: Connection) -> int:
        """The bytes ``conn`` holds against ``unproven_bytes``: its inbox (the store counts its own memory)."""
        return len(conn.inbox)

    def _flush(self, conn: Connection) -> None:
        """Send what the socket takes now of ``conn``'s outbox; watch for it to take more, or drop it on an error."""
        if not conn.open:
            return
        try:
            while conn.outbox:
                sent = conn.sock.send(conn.outbox)
                del conn.outbox[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # the client went away
            self._drop(conn)
            return
        events = self._interest(conn)
        if events != conn.events:
            conn.events = events
            assert self._selector is not None
            self._selector.modify(conn.sock, events, conn)
        self._flushed(conn)

    def _drop(self, conn: Connection) -> None:
        """Close ``conn`` and forget it (once)."""
        if not conn.open:
            return
        conn.open = False
        self._connections.discard(conn)
        try:
            if not conn.proven:
                self._unproven[conn.tier].pop(conn, None)
                self._forget_unproven(conn)
            self._dropped(conn)
        except Exception as exc:  # noqa: BLE001 - the socket must still go: left registered, select spins on it
            self._log_failure(f"failed forgetting a connection from {conn.peer}", exc)
        try:
            assert self._selector is not None
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        conn.sock.close()

    # ------------------------------------------------------------------ hooks
    def _connect(self, sock: socket.socket, address: str, peer: str) -> Connection:
        """The record of a connection just accepted."""
        return Connection(sock, address, peer)

    def _refusal(self, address: str) -> tuple[str, str] | None:
        """(kind, reason) when a connection from ``address`` must be refused, before any is closed to make room."""
        return None

    def _received(self, conn: Connection) -> None:
        """Bytes arrived in ``conn.inbox``: handle what is complete."""
        raise NotImplementedError

    def _writable(self, conn: Connection) -> None:
        """The socket of ``conn`` takes more: send."""
        self._flush(conn)

    def _interest(self, conn: Connection) -> int:
        """What to watch ``conn``'s socket for after a flush: its replies, while some wait, and its requests."""
        return selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0)

    def _flushed(self, conn: Connection) -> None:
        """After a flush of ``conn`` (still open)."""

    def _dropped(self, conn: Connection) -> None:
        """``conn`` is being dropped (its socket still open)."""

    def _failed(self, conn: Connection, exc: Exception) -> None:
        """A hook raised ``exc`` while handling ``conn`` (already logged): answer it if the protocol can say so, and
        drop it; what it had sent cannot be trusted to be where the hook left it."""
        self._drop(conn)

    def _timeout(self) -> float | None:
        """How long the loop may wait for events (None: until one comes)."""
        return None

    def _before_events(self) -> None:
        """Each round of the loop, before its events are handled."""

    def _after_events(self) -> None:
        """Each round of the loop, after its events."""
