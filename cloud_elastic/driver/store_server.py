"""The rendezvous store the driver serves, in Python: torch's ``TCPStore`` wire protocol without torch.

Workers reach the driver's store with torch's own client (``torch.distributed.TCPStore``),
and Gloo, NCCL and cloud-elastic's rounds rendezvous through it. The driver never
reads or writes it; it only serves it. Serving it with torch's server cost every
driver an ``import torch``: most of a small job's driver CPU (a 2-worker job of 20
steps here: 1.6 CPU-seconds with it, 0.3 with this server, which is the standard
library only and starts at once).

The protocol is c10d's (``TCPStoreLibUvBackend.cpp``): a client is ignored until it
sends ``VALIDATE`` with the magic number; then each command is one byte, followed by
keys and payloads as a little-endian u64 length and the bytes, and integers as
little-endian i64. The command numbers are torch's ``QueryType`` (torch appends new
ones at the end). Answers and semantics follow torch's server: ``ADD`` stores the
decimal string; ``COMPARE_SET`` answers the value now held (or ``expected`` for a
missing key and a non-empty ``expected``); ``WAIT`` answers ``STOP_WAITING`` once
every key exists, and a client whose wait timed out sends ``CANCEL_WAIT``; ``CHECK``
and ``WAIT`` count a non-empty queue as present; ``QUEUE_POP`` answers the queue's
length and, when not empty, its first item.

A client that breaks the protocol (no validation, an unknown command, a key over
8 KiB or a payload over 8 MiB: torch's limits) is disconnected with one warning; the
others are served on. One thread serves every connection (``selectors``).
"""

from __future__ import annotations

import logging
import selectors
import socket
import struct
import threading
from collections import deque

from cloud_elastic.driver.accepting import AcceptPause

log = logging.getLogger(__name__)

MAGIC = 0x3C85F7CE
(VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET,
 CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN) = range(17)
READY, NOT_READY = 0, 1
STOP_WAITING, WAIT_CANCELED = 0, 1
MAX_KEY_BYTES = 8 * 1024
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
MAX_KEY_COUNT = 128 * 1024
_U32, _U64, _I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")


class _Incomplete(Exception):
    """The client's buffer ends inside a command: wait for more bytes."""


class ProtocolError(Exception):
    """The client broke the protocol; it is disconnected."""


class _Reader:
    """Reads one command from a buffer; raises :class:`_Incomplete` where the buffer ends."""

    def __init__(self, buf: bytearray) -> None:
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise _Incomplete
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def u64(self) -> int:
        return _U64.unpack(self.take(8))[0]

    def i64(self) -> int:
        return _I64.unpack(self.take(8))[0]

    def count(self) -> int:
        n = self.u64()
        if n > MAX_KEY_COUNT:
            raise ProtocolError(f"{n} keys in one command (at most {MAX_KEY_COUNT})")
        return n

    def key(self) -> bytes:
        n = self.u64()
        if n > MAX_KEY_BYTES:
            raise ProtocolError(f"a key of {n} bytes (at most {MAX_KEY_BYTES})")
        return self.take(n)

    def payload(self) -> bytes:
        n = self.u64()
        if n > MAX_PAYLOAD_BYTES:
            raise ProtocolError(f"a value of {n} bytes (at most {MAX_PAYLOAD_BYTES})")
        return self.take(n)


def _vector(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


class _Client:
    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.validated = False
        self.awaiting: set[bytes] = set()  # the keys a pending WAIT still needs


class StoreServer:
    """Serves torch's store protocol on ``listener`` (bound and listening) from a daemon thread until :meth:`close`."""

    def __init__(self, listener: socket.socket) -> None:
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._data: dict[bytes, bytes] = {}
        self._queues: dict[bytes, deque[bytes]] = {}
        self._waiters: dict[bytes, list[_Client]] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._pause = AcceptPause(self._selector, listener, None, "rendezvous store")
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="rendezvous-store", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close every connection and the listening socket. Idempotent."""
        if self._closing:
            return
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(5)

    # ----------------------------------------------------------------- the loop
    def _serve(self) -> None:
        try:
            self._loop()
        except Exception:  # a bug here: every worker's next store call would wait out its timeout
            log.exception("rendezvous store: stopped serving")
        finally:
            for key in list(self._selector.get_map().values()):
                key.fileobj.close()
            self._selector.close()
            self._wake_w.close()

    def _loop(self) -> None:
        while not self._closing:
            for key, mask in self._selector.select(self._pause.timeout(None)):
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    self._wake_r.recv(64)
                else:
                    if mask & selectors.EVENT_READ:
                        self._receive(key.data)
                    if mask & selectors.EVENT_WRITE:
                        self._flush(key.data)
            self._pause.resume_if_due()

    def _accept(self) -> None:
        try:
            sock, addr = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:  # out of descriptors, say: the connection waits in the backlog
            if not self._pause.failed(exc):
                log.warning("rendezvous store: cannot accept a connection: %s", exc)
            return
        self._pause.accepted()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._selector.register(sock, selectors.EVENT_READ, _Client(sock, f"{addr[0]}:{addr[1]}"))

    def _disconnect(self, client: _Client, why: str | None = None) -> None:
        if why:
            log.warning("rendezvous store: disconnected %s: %s", client.peer, why)
        self._forget_wait(client)
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            return  # already gone
        client.sock.close()

    def _receive(self, client: _Client) -> None:
        try:
            chunk = client.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._disconnect(client)
            return
        client.inbox += chunk
        while client.inbox:
            reader = _Reader(client.inbox)
            try:
                self._command(client, reader)
            except _Incomplete:
                break
            except Exception as exc:  # ProtocolError, a bad number for ADD; never the other clients' problem
                self._disconnect(client, str(exc) or type(exc).__name__)
                return
            del client.inbox[:reader.pos]
        self._flush(client)

    def _flush(self, client: _Client) -> None:
        while client.outbox:
            try:
                sent = client.sock.send(client.outbox)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._disconnect(client)
                return
            del client.outbox[:sent]
        try:
            self._selector.modify(client.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if client.outbox else 0),
                                  client)
        except (KeyError, ValueError):
            pass  # disconnected meanwhile

    # ----------------------------------------------------------------- the commands
    def _command(self, client: _Client, r: _Reader) -> None:
        command = r.u8()
        if not client.validated:
            if command != VALIDATE or r.u32() != MAGIC:
                raise ProtocolError("it did not open with torch's store validation")
            client.validated = True
            return
        answer = client.outbox
        if command == SET:
            key, value = r.key(), r.payload()
            self._set(key, value)
        elif command == GET:
            answer += _vector(self._data.get(r.key(), b""))
        elif command == ADD:
            key, delta = r.key(), r.i64()
            total = int(self._data.get(key, b"0")) + delta
            self._set(key, str(total).encode())
            answer += _I64.pack(total)
        elif command == WAIT:
            keys = [r.key() for _ in range(r.count())]
            missing = {k for k in keys if not self._present(k)}
            if not missing:
                answer.append(STOP_WAITING)
            else:
                client.awaiting = missing
                for key in missing:
                    self._waiters.setdefault(key, []).append(client)
        elif command == CHECK:
            keys = [r.key() for _ in range(r.count())]
            answer.append(READY if all(self._present(k) for k in keys) else NOT_READY)
        elif command == COMPARE_SET:
            key, expected, desired = r.key(), r.payload(), r.payload()
            current = self._data.get(key)
            if current is None and expected:
                answer += _vector(expected)  # torch's answer for a missing key
            elif current is None or current == expected:
                self._set(key, desired)
                answer += _vector(desired)
            else:
                answer += _vector(current)
        elif command == MULTI_GET:
            keys = [r.key() for _ in range(r.count())]
            answer += b"".join(_vector(self._data.get(k, b"")) for k in keys)
        elif command == MULTI_SET:
            pairs = [(r.key(), r.payload()) for _ in range(r.count())]
            for key, value in pairs:
                self._set(key, value)
        elif command == APPEND:
            key, value = r.key(), r.payload()
            self._set(key, self._data.get(key, b"") + value)
        elif command == DELETE_KEY:
            answer += _I64.pack(1 if self._data.pop(r.key(), None) is not None else 0)
        elif command == GETNUMKEYS:
            answer += _I64.pack(len(self._data))
        elif command == CANCEL_WAIT:
            self._forget_wait(client)
            answer.append(WAIT_CANCELED)
        elif command == PING:
            answer += _U32.pack(r.u32())
        elif command == QUEUE_PUSH:
            key, value = r.key(), r.payload()
            self._queues.setdefault(key, deque()).append(value)
            self._wake(key, one=True)
        elif command == QUEUE_POP:
            queue = self._queues.setdefault(r.key(), deque())
            answer += _I64.pack(len(queue))
            if queue:
                answer += _vector(queue.popleft())
        elif command == QUEUE_LEN:
            answer += _I64.pack(len(self._queues.get(r.key(), ())))
        else:
            raise ProtocolError(f"unknown store command {command} (a newer torch than this driver knows?)")

    def _present(self, key: bytes) -> bool:
        return key in self._data or bool(self._queues.get(key))

    def _set(self, key: bytes, value: bytes) -> None:
        self._data[key] = value
        self._wake(key)

    def _wake(self, key: bytes, one: bool = False) -> None:
        """Answer the waits that ``key`` completes (``one``: the first only, as a queue push does)."""
        waiting = self._waiters.get(key)
        while waiting:
            client = waiting.pop(0)
            client.awaiting.discard(key)
            if not client.awaiting:
                client.outbox.append(STOP_WAITING)
                self._flush(client)
                if one:
                    break
        if not waiting:
            self._waiters.pop(key, None)

    def _forget_wait(self, client: _Client) -> None:
        for key in client.awaiting:
            waiting = self._waiters.get(key)
            if waiting and client in waiting:
                waiting.remove(client)
                if not waiting:
                    del self._waiters[key]
        client.awaiting = set()
