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
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time

from cloud_elastic.driver.net.accepting import AcceptPause, RefusalLog, descriptor_share

__all__ = ["Connection", "SelectorServer"]

log = logging.getLogger(__name__)

#: Selector keys' data for the listener and the wake socket (a connection's key holds its Connection).
_ACCEPT = "accept"
_WAKE = "wake"


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


class SelectorServer:
    """One ``selectors`` thread serving a listening socket's connections, from :meth:`_serve_on` until :meth:`close`.

    A subclass names itself (``name``, for logs and its thread), its share of the descriptor limit
    (``share``, said as ``share_words``) and how much it reads at once (``recv_bytes``), and fills in
    the hooks: :meth:`_connect`, :meth:`_received`, and as it needs :meth:`_refusal`,
    :meth:`_writable`, :meth:`_interest`, :meth:`_flushed`, :meth:`_dropped`, :meth:`_timeout`,
    :meth:`_before_events` and :meth:`_after_events`. Every hook runs on the serving thread.
    """

    name = "server"
    share = 0.25
    share_words = "a quarter of"
    recv_bytes = 1 << 16
    join_s = 5.0
    #: Whether the logs name a client by address and port, or by address alone.
    peer_has_port = True

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
            self._loop()
        except Exception:  # a bug here: every client's next call would wait out its timeout
            log.exception("%s: stopped serving", self.name)
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
                events = self._selector.select(self._pause.timeout(self._timeout()))
            except OSError:  # a descriptor closed under select: go round again
                continue
            self._before_events()
            for key, mask in events:
                if key.data == _ACCEPT:
                    self._accept()
                elif key.data == _WAKE:
                    self._drain_wake()
                elif key.data.open:  # not dropped earlier in this round of events
                    conn = key.data
                    if mask & selectors.EVENT_WRITE:
                        self._writable(conn)
                    if mask & selectors.EVENT_READ and conn.open:
                        self._read(conn)
            self._pause.resume_if_due()
            self._after_events()

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
            at_most = descriptor_share(self.share)
            refusal = (("too many connections", f"{len(self._connections)} connections are open, at most "
                                                f"{at_most} ({self.share_words} the driver's descriptor limit)")
                       if len(self._connections) >= at_most else self._refusal(addr[0]))
            peer = f"{addr[0]}:{addr[1]}" if self.peer_has_port else addr[0]
            if refusal is not None:  # strangers' idle connections must leave descriptors for launches
                self._refusals.refused(refusal[0], peer, refusal[1])
                sock.close()
                continue
            sock.setblocking(False)
            # An answer is one write, so Nagle's algorithm could only delay it.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self._connect(sock, addr[0], peer)
            self._connections.add(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)

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
        self._received(conn)

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
        self._dropped(conn)
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
        """(kind, reason) when a connection from ``address`` must be refused; past the descriptor share already."""
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

    def _timeout(self) -> float | None:
        """How long the loop may wait for events (None: until one comes)."""
        return None

    def _before_events(self) -> None:
        """Each round of the loop, before its events are handled."""

    def _after_events(self) -> None:
        """Each round of the loop, after its events."""
