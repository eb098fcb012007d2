"""The rendezvous store the driver serves, in Python: torch's ``TCPStore`` wire protocol without torch.

Workers reach the driver's store with torch's own client (``torch.distributed.TCPStore``),
and Gloo, NCCL and cloud-elastic's rounds rendezvous through it. The driver never
reads or writes it; it only serves it. Serving it with torch's server would cost every
driver an ``import torch``, most of a small job's driver CPU (for a 2-worker job of 20
steps, 1.6 CPU-seconds with it against 0.3 with this server, which is the standard
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

A client that breaks the protocol (an unknown command, a key over 8 KiB or a value over 8 MiB:
torch's limits) is disconnected; the others are served on. One thread serves every connection
(:class:`~.selector_server.SelectorServer`, shared with the control plane).

**Bounds against strangers.** torch's protocol has no authentication: its validation is a public
magic number, and anyone who reaches the port can read and write keys (the workers sign what they
store, see ``worker/rounds/signed_store.py``). What this server guarantees is that no client can take the
driver's process down or grow it without bound:

* *Validation within* :data:`VALIDATE_TIMEOUT_S` (10 s). torch's client sends ``VALIDATE`` right
  after it connects; a connection that has not is closed then. Idle validated connections are
  kept: a worker's store client idles between rounds.
* *Connections:* all together at most a quarter of the process's descriptor limit (``RLIMIT_NOFILE``,
  read at each accept; the control plane takes at most half, see :func:`~.accepting.descriptor_share`),
  so strangers cannot starve the driver of the descriptors a worker launch needs (its ``os.pipe()``).
  A worker holds one connection, and a new one per abandoned round formation.
* *Strangers cannot lock the workers out* (:mod:`.selector_server`): a connection is proven once a
  command of it names a key in a round's namespace (:func:`round_keys`: only holders of the job secret
  can derive one; every key of the workers' process groups lies in one). A new connection makes room
  by closing the oldest unproven one: of its address, past :data:`MAX_PEER_CONNECTIONS` (256) of them;
  of those that have not validated, past a quarter of the store's share; of those that have not
  validated, else of those that have not named a round's key, when the share is full. A proven
  connection is never closed for a stranger. A worker's connection is unproven from its start until
  its first round forms, so a stranger who speaks torch's validation and keeps opening connections
  can still close it then (the worker's round formation fails and is retried).
* *Memory:* everything the store holds, keys, values, queued items, unfinished commands, awaited
  keys and unsent answers, with what Python spends on each entry, stays within
  :data:`MAX_STORE_BYTES` (256 MiB; a Gloo round counts about ``size * (380 + 8 * size)`` bytes,
  180 KB at 128 workers, 2.2 MB at 512; the driver deletes the keys of rounds before the last two,
  :meth:`StoreServer.forget`, so the bound holds a job's current rounds, not every round it formed).
  What unproven connections wrote (each key and queue counted by the last connection that wrote it)
  stays within a quarter of that: an unproven write past it deletes the oldest of them, never what a
  proven connection wrote, so strangers who fill the store and leave cannot refuse the workers' rounds
  their keys. Their keys are not deleted when they disconnect; the quarter bounds them either way. What they
  hold while connected (unfinished commands, awaited keys, unread answers) stays within another quarter: past
  it, the unproven connection that has held bytes longest is closed (``unproven_bytes``). A round's
  ``hvd.elastic.run`` mark (``worker/joining.py``), written on a fresh connection closed at once, is a
  key of that round: it proves its connection, so no flood evicts it, and goes with the round's keys.
  A command is at most :data:`MAX_COMMAND_BYTES` (17 MiB:
  ``COMPARE_SET``'s two 8 MiB values and its key), a value at most :data:`MAX_PAYLOAD_BYTES` (an
  ``APPEND`` past it is refused: appends would otherwise grow one value without bound), an answer
  at most a command's size; a client that does not read its answers is not read from past
  :data:`MAX_OUTBOX_BYTES` (1 MiB) of them.
* *CPU:* each command is parsed once, field by field as its bytes arrive (a parser that resumes),
  so a large ``MULTI_SET`` sent in small pieces costs no more than sent at once.

A client past a bound is disconnected (torch's protocol has no error answer): its next call
fails. Refusals are logged once per kind, then counted (:class:`~.accepting.RefusalLog`), never
once per client: the clients are strangers and may be many.
"""

from __future__ import annotations

import hmac
import logging
import re
import selectors
import socket
import struct
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Generator

from cloud_elastic.control import round_namespace

from cloud_elastic.driver.net.accepting import STORE_SHARE, RefusalLog
from cloud_elastic.driver.net.selector_server import PROVEN, Connection, SelectorServer

log = logging.getLogger(__name__)

MAGIC = 0x3C85F7CE
(VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET,
 CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN) = range(17)
READY, NOT_READY = 0, 1
STOP_WAITING, WAIT_CANCELED = 0, 1
MAX_KEY_BYTES = 8 * 1024
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
MAX_KEY_COUNT = 128 * 1024
MAX_COMMAND_BYTES = 2 * MAX_PAYLOAD_BYTES + 1024 * 1024
MAX_STORE_BYTES = 256 * 1024 * 1024
#: The part of the store's bound that what unproven connections wrote may take (see the module docstring).
UNPROVEN_STORE_SHARE = 0.25
MAX_OUTBOX_BYTES = 1024 * 1024
MAX_PEER_CONNECTIONS = 256
#: The tier of a connection that sent torch's validation (tier 0: it has not yet).
_VALIDATED = 1
VALIDATE_TIMEOUT_S = 10.0
_RECV_BYTES = 1 << 16
#: What Python spends beyond the bytes themselves, counted against MAX_STORE_BYTES: on a dict or set
#: entry with its bytes objects (110-140 bytes), and on a bytes object in a list or deque (about 45):
#: a million one-byte keys take 140 MB, not 2.
_ENTRY = 128
_ITEM = 48
_U32, _U64, _I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")

#: Each command's fields after its command byte: u32, i64, key, payload (value), keys (a count, then
#: keys), pairs (a count, then key and value each).
_LAYOUTS = {VALIDATE: "u", SET: "kp", COMPARE_SET: "kpp", GET: "k", ADD: "ki", CHECK: "K", WAIT: "K",
            GETNUMKEYS: "", DELETE_KEY: "k", APPEND: "kp", MULTI_GET: "K", MULTI_SET: "P", CANCEL_WAIT: "",
            PING: "u", QUEUE_PUSH: "kp", QUEUE_POP: "k", QUEUE_LEN: "k"}


#: A key in a round's namespace, as torch's client sends it (it puts a "/" before every key).
_ROUND_KEY = re.compile(rb"/?(r(\d{1,9})-[0-9a-f]{32})")


def round_keys(secret: str, job_id: str) -> Callable[[bytes], bool]:
    """Whether a key lies in a namespace of one of job ``job_id``'s rounds (a
    :func:`~cloud_elastic.control.round_namespace`, then a suffix): a key only holders of ``secret`` can name, so
    the connection that names it comes from the job."""
    def proves(key: bytes) -> bool:
        m = _ROUND_KEY.match(key)
        return m is not None and hmac.compare_digest(m[1], round_namespace(secret, job_id, int(m[2])).encode())
    return proves


def _first_key(command: int, fields: list[Any]) -> bytes:
    layout = _LAYOUTS[command]
    if not layout or layout[0] in "ui" or not fields[0]:
        return b""
    first = fields[0] if layout[0] == "k" else fields[0][0]
    return first if layout[0] != "P" else first[0]


class ProtocolError(Exception):
    """The client broke the protocol or a bound; it is disconnected. ``kind`` names the refusal for the log."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


#: What a command parser yields: how many bytes it needs next (it is sent exactly those).
_Parser = Generator[int, bytes, "tuple[int, list[Any]]"]


def _sized(limit: int, what: str) -> Generator[int, bytes, bytes]:
    n = _U64.unpack((yield 8))[0]
    if n > limit:
        raise ProtocolError(f"a {what} of {n} bytes (at most {limit})", f"{what} too long")
    return (yield n) if n else b""


def _command(validated: bool) -> _Parser:
    """Parse one command, field by field: the caller sends each field's bytes once, as they arrive."""
    command = (yield 1)[0]
    if not validated and command != VALIDATE:
        raise ProtocolError("it did not open with torch's store validation", "no validation")
    layout = _LAYOUTS.get(command)
    if layout is None:
        raise ProtocolError(f"unknown store command {command} (a newer torch than this driver knows?)",
                            "unknown command")
    fields: list[Any] = []
    for field in layout:
        if field == "u":
            fields.append(_U32.unpack((yield 4))[0])
        elif field == "i":
            fields.append(_I64.unpack((yield 8))[0])
        elif field == "k":
            fields.append((yield from _sized(MAX_KEY_BYTES, "key")))
        elif field == "p":
            fields.append((yield from _sized(MAX_PAYLOAD_BYTES, "value")))
        else:
            n = _U64.unpack((yield 8))[0]
            if n > MAX_KEY_COUNT:
                raise ProtocolError(f"{n} keys in one command (at most {MAX_KEY_COUNT})", "too many keys")
            items: list[Any] = []
            for _ in range(n):
                key = yield from _sized(MAX_KEY_BYTES, "key")
                items.append(key if field == "K" else (key, (yield from _sized(MAX_PAYLOAD_BYTES, "value"))))
            fields.append(items)
    return command, fields


def _vector(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


class _Client(Connection):
    def __init__(self, sock: socket.socket, address: str, peer: str) -> None:
        super().__init__(sock, address, peer)
        self.validated = False
        self.awaiting: set[bytes] = set()  # the keys a pending WAIT still needs
        self.awaiting_bytes = 0
        self.parser: _Parser | None = None  # the command being read
        self.need = 0  # how many bytes the parser waits for
        self.command_bytes = 0  # bytes the unfinished command has declared so far
        self.pending = 0  # and what they take in memory
        self.footprint = 0  # what this client holds of the store's budget (see StoreServer._account)


class StoreServer(SelectorServer):
    """Serves torch's store protocol on ``listener`` (bound and listening) from a daemon thread, from
    :meth:`start` until :meth:`close`. The server owns ``listener`` from construction: :meth:`close`
    closes it, once.

    ``max_bytes``, ``max_peer_connections`` and ``validate_timeout_s`` override the module's bounds
    (see the module docstring); the driver uses the defaults. ``proves(key)``: whether a command naming
    ``key`` proves its connection comes from the job (:func:`round_keys`; None: none is ever proven, and
    what connections write is not split into proven and unproven shares).
    """

    name = "rendezvous store"
    share = STORE_SHARE
    share_words = "a quarter of"
    recv_bytes = _RECV_BYTES
    tiers = 2
    tier_words = ("it had not validated yet", "it had not named a key of the job's rounds yet")

    def __init__(self, listener: socket.socket, *, max_bytes: int = MAX_STORE_BYTES,
                 max_peer_connections: int = MAX_PEER_CONNECTIONS,
                 validate_timeout_s: float = VALIDATE_TIMEOUT_S,
                 proves: Callable[[bytes], bool] | None = None) -> None:
        super().__init__(RefusalLog(log, "rendezvous store", "rendezvous store: disconnected %s: %s"))
        self.port: int = listener.getsockname()[1]
        self._listener = listener
        self._max_bytes = max_bytes
        self.unproven_per_address = max_peer_connections
        self._proves = proves
        self._validate_timeout_s = validate_timeout_s
        self._data: dict[bytes, bytes] = {}
        self._queues: dict[bytes, deque[bytes]] = {}
        self._waiters: dict[bytes, list[_Client]] = {}
        self._stored = 0  # bytes of keys, values and queued items
        self._held = 0  # bytes the clients hold: unfinished commands, awaited keys, unsent answers
        self._unvalidated: deque[tuple[float, _Client]] = deque()  # by deadline (all have the same timeout)
        self._half_full_said = False
        # What unproven connections wrote, oldest write first: (a queue?, key) -> what it takes of _stored.
        # Oldest first; an OrderedDict, so that taking the oldest is O(1): a dict scanned from the front walks past
        # every slot deleted before, and one command freeing k keys stalled every worker's store for O(k²).
        self._strangers: OrderedDict[tuple[bool, bytes], int] = OrderedDict()
        self._stranger_bytes = 0
        self._strangers_full_said = False
        self._forget_lock = threading.Lock()
        self._to_forget: list[bytes] = []  # namespaces whose keys go, handed over by forget()
        # What unproven connections hold (unfinished commands, awaited keys, unread answers) stays within the same
        # quarter: past it, the one that has held bytes longest is closed (``SelectorServer._keep_to_budget``).
        self.unproven_bytes = int(max_bytes * UNPROVEN_STORE_SHARE) if proves is not None else None

    def start(self) -> "StoreServer":
        """Serve from a daemon thread until :meth:`close`; returns the server."""
        self._serve_on(self._listener)
        return self

    def forget(self, namespace: str) -> None:
        """Delete, from the serving thread, every key that holds ``namespace`` (a finished round's, whose
        process groups formed long ago): nothing else deletes a round's keys, and the store's bound would
        otherwise be reached after some rounds of a large job (a round of ``size`` Gloo workers stores
        about ``size * (250 + 8 * size)`` bytes: 2 MB at 512)."""
        with self._forget_lock:
            self._to_forget.append(namespace.encode())
        self.wake()  # not serving yet: forgotten before its first command

    def _forget_now(self) -> None:
        with self._forget_lock:
            namespaces, self._to_forget = self._to_forget, []
        for namespace in namespaces:
            for key in [k for k in self._data if namespace in k]:
                self._stored -= len(key) + len(self._data.pop(key)) + _ENTRY
                self._owned((False, key), 0, None)

    # ----------------------------------------------------------------- the loop
    def _timeout(self) -> float | None:
        return max(0.0, self._unvalidated[0][0] - time.monotonic()) if self._unvalidated else None

    def _before_events(self) -> None:
        if self._to_forget:  # before any command that arrived after forget() returned
            self._forget_now()

    def _after_events(self) -> None:
        self._expire_unvalidated()

    def _connect(self, sock: socket.socket, address: str, peer: str) -> _Client:
        client = _Client(sock, address, peer)
        self._unvalidated.append((time.monotonic() + self._validate_timeout_s, client))
        return client

    def _expire_unvalidated(self) -> None:
        now = time.monotonic()
        while self._unvalidated and (self._unvalidated[0][0] <= now or not self._unvalidated[0][1].open
                                     or self._unvalidated[0][1].validated):
            _, client = self._unvalidated.popleft()
            if client.open and not client.validated:
                self._disconnect(client, ProtocolError(f"it did not validate within {self._validate_timeout_s:g} s",
                                                       "no validation in time"))

    def _disconnect(self, client: _Client, why: ProtocolError | None = None) -> None:
        if client.open and why is not None:
            self._refusals.refused(why.kind, client.peer, str(why))
        self._drop(client)

    def _dropped(self, conn: Connection) -> None:
        assert isinstance(conn, _Client)
        self._forget_wait(conn)
        conn.parser, conn.pending = None, 0
        conn.inbox, conn.outbox = bytearray(), bytearray()
        self._account(conn)

    def _received(self, conn: Connection) -> None:
        assert isinstance(conn, _Client)
        self._process(conn)

    def _writable(self, conn: Connection) -> None:
        assert isinstance(conn, _Client)
        self._flush(conn)
        self._process(conn)  # commands left unread while its answers were backed up

    def _process(self, client: _Client) -> None:
        """Feed the buffered bytes to the client's command parser, each byte once; run each command it
        completes; send the answers. Stops while the client's unsent answers exceed MAX_OUTBOX_BYTES
        (it is not read from then, and the rest waits in its inbox)."""
        while self._parse(client) and client.open:
            self._flush(client)
            if len(client.outbox) > MAX_OUTBOX_BYTES or len(client.inbox) < (client.need if client.parser else 1):
                return  # the socket's next event (writable, readable) brings the rest
        if client.open:
            self._flush(client)

    def _parse(self, client: _Client) -> bool:
        """Run the commands complete in ``client``'s inbox; True if it stopped for its unsent answers."""
        inbox, pos = client.inbox, 0
        try:
            while client.open:
                if len(client.outbox) > MAX_OUTBOX_BYTES:
                    return True
                if client.parser is None:
                    if pos == len(inbox):
                        break
                    client.parser, client.pending, client.command_bytes = _command(client.validated), 0, 0
                    self._expect(client, next(client.parser))
                if len(inbox) - pos < client.need:
                    break
                field = bytes(inbox[pos:pos + client.need])
                pos += client.need
                try:
                    need = client.parser.send(field)
                except StopIteration as done:
                    client.parser, client.pending = None, 0
                    self._execute(client, *done.value)
                else:
                    self._expect(client, need)
        except ProtocolError as exc:
            self._disconnect(client, exc)
        except Exception as exc:  # ADD to a value that is not a number, say; never the other clients' problem
            kind = "bad number" if isinstance(exc, ValueError) else type(exc).__name__
            self._disconnect(client, ProtocolError(str(exc) or type(exc).__name__, kind))
        finally:
            del inbox[:pos]
        return False

    # ----------------------------------------------------------------- the budget
    def _expect(self, client: _Client, n: int) -> None:
        """The unfinished command declared its next ``n`` bytes: within one command's bound and the store's?"""
        client.need = n
        self._room(n + _ITEM, "a command")
        client.pending += n + _ITEM  # what its fields will take in memory (a length or number: less)
        client.command_bytes += n
        self._account(client)
        if client.command_bytes > MAX_COMMAND_BYTES:
            raise ProtocolError(f"a command of more than {MAX_COMMAND_BYTES} bytes", "command too large")

    def _room(self, n: int, what: str) -> None:
        used = self._stored + self._held
        if used + n > self._max_bytes:
            raise ProtocolError(f"{what} of {n} bytes would take the store past its {self._max_bytes}-byte bound "
                                f"({used} bytes are held)", "store full")
        if not self._half_full_said and used + n > self._max_bytes // 2:
            self._half_full_said = True
            log.warning("rendezvous store: it holds more than half of its %d-byte bound", self._max_bytes)

    def _owned(self, entry: tuple[bool, bytes], size: int, writer: _Client | None) -> None:
        """``entry`` (a queue?, its key) now takes ``size`` bytes of the store (0: it is gone), last written by
        ``writer`` (None: by the driver). Only an unproven writer's entries count against the strangers' share."""
        self._stranger_bytes -= self._strangers.pop(entry, 0)
        if size and writer is not None and self._is_stranger(writer):
            self._strangers[entry] = size
            self._stranger_bytes += size

    def _stranger_room(self, writer: _Client, entry: tuple[bool, bytes], size: int) -> None:
        """Before ``writer`` makes ``entry`` take ``size`` bytes: if it is unproven, delete the oldest entries
        unproven connections wrote (never ``entry``) until theirs stay within a quarter of the bound."""
        if not self._is_stranger(writer):
            return
        share = int(self._max_bytes * UNPROVEN_STORE_SHARE)
        if size > share:
            raise ProtocolError(f"an entry of {size} bytes, past the {share} bytes of the store's bound that "
                                "connections not proven to come from the job may fill", "store full")
        held = self._strangers.pop(entry, None)  # never taken to make room for itself
        try:
            while self._stranger_bytes - (held or 0) + size > share:
                if not self._strangers_full_said:
                    self._strangers_full_said = True
                    log.warning("rendezvous store: what connections that named no key of the job's rounds wrote "
                                "holds %d bytes, its share; their oldest keys are deleted to make room", share)
                victim, taken = self._strangers.popitem(last=False)
                self._stranger_bytes -= taken
                self._stored -= taken
                del (self._queues if victim[0] else self._data)[victim[1]]
        finally:
            if held is not None:
                self._strangers[entry] = held

    def _is_stranger(self, client: _Client) -> bool:
        """Whether what ``client`` writes counts against the strangers' share (never when none can be proven)."""
        return not client.proven and self._proves is not None

    def _account(self, client: _Client) -> None:
        """Bring the store's count of what clients hold up to date with ``client``'s."""
        footprint = client.pending + len(client.outbox) + client.awaiting_bytes
        self._held += footprint - client.footprint
        client.footprint = footprint
        self._count(client)

    def _holds(self, conn: Connection) -> int:
        assert isinstance(conn, _Client)
        return conn.footprint

    def _interest(self, conn: Connection) -> int:
        """Its answers while some wait; its commands while fewer than MAX_OUTBOX_BYTES of answers wait."""
        events = selectors.EVENT_WRITE if conn.outbox else 0
        return events | (selectors.EVENT_READ if len(conn.outbox) <= MAX_OUTBOX_BYTES else 0)

    def _flushed(self, conn: Connection) -> None:
        assert isinstance(conn, _Client)
        self._account(conn)

    # ----------------------------------------------------------------- the commands
    def _execute(self, client: _Client, command: int, f: list[Any]) -> None:
        if not client.validated:
            if f[0] != MAGIC:
                raise ProtocolError("it did not open with torch's store validation", "no validation")
            client.validated = True
            self._promote(client, _VALIDATED)
            return
        if not client.proven and self._proves is not None and self._proves(_first_key(command, f)):
            self._promote(client, PROVEN)
        answer = client.outbox
        if command == SET:
            self._set(client, f[0], f[1])
        elif command == GET:
            answer += self._answer([self._data.get(f[0], b"")])
        elif command == ADD:
            total = int(self._data.get(f[0], b"0")) + f[1]
            self._set(client, f[0], str(total).encode())
            answer += _I64.pack(total)
        elif command == WAIT:
            self._forget_wait(client)  # torch's client waits once at a time; a second wait replaces the first
            missing = {k for k in f[0] if not self._present(k)}
            if not missing:
                answer.append(STOP_WAITING)
            else:
                size = sum(len(k) + _ENTRY for k in missing)
                self._room(size, "a wait")
                client.awaiting, client.awaiting_bytes = missing, size
                for key in missing:
                    self._waiters.setdefault(key, []).append(client)
        elif command == CHECK:
            answer.append(READY if all(self._present(k) for k in f[0]) else NOT_READY)
        elif command == COMPARE_SET:
            key, expected, desired = f
            current = self._data.get(key)
            if current is None and expected:
                answer += _vector(expected)  # torch's answer for a missing key
            elif current is None or current == expected:
                self._set(client, key, desired)
                answer += _vector(desired)
            else:
                answer += _vector(current)
        elif command == MULTI_GET:
            answer += self._answer([self._data.get(k, b"") for k in f[0]])
        elif command == MULTI_SET:
            for key, value in f[0]:
                self._set(client, key, value)
        elif command == APPEND:
            key, value = f
            old = self._data.get(key, b"")
            if len(old) + len(value) > MAX_PAYLOAD_BYTES:
                raise ProtocolError(f"an append past a value of {MAX_PAYLOAD_BYTES} bytes", "value too long")
            self._set(client, key, old + value)
        elif command == DELETE_KEY:
            old = self._data.pop(f[0], None)
            if old is not None:
                self._stored -= len(f[0]) + len(old) + _ENTRY
                self._owned((False, f[0]), 0, None)
            answer += _I64.pack(1 if old is not None else 0)
        elif command == GETNUMKEYS:
            answer += _I64.pack(len(self._data))
        elif command == CANCEL_WAIT:
            self._forget_wait(client)
            answer.append(WAIT_CANCELED)
        elif command == PING:
            answer += _U32.pack(f[0])
        elif command == QUEUE_PUSH:
            key, value = f
            queue = self._queues.get(key)
            # What the queue takes, if a stranger pushes: summed only when it was not a stranger's already.
            size = (self._strangers.get((True, key)) or len(key) + _ENTRY + sum(len(v) + _ITEM for v in queue or ())
                    ) if self._is_stranger(client) else 0
            self._stranger_room(client, (True, key), size + len(value) + _ITEM)
            self._room(len(key) + _ENTRY + len(value) + _ITEM, "a queue push")
            if queue is None:
                queue = self._queues[key] = deque()
                self._stored += len(key) + _ENTRY
            queue.append(value)
            self._stored += len(value) + _ITEM
            self._owned((True, key), size + len(value) + _ITEM, client)
            self._wake(key, one=True)
        elif command == QUEUE_POP:
            queue = self._queues.get(f[0], ())
            answer += _I64.pack(len(queue))
            if queue:
                item = queue.popleft()
                self._stored -= len(item) + _ITEM
                answer += _vector(item)
                if (True, f[0]) in self._strangers:
                    self._strangers[True, f[0]] -= len(item) + _ITEM
                    self._stranger_bytes -= len(item) + _ITEM
        elif command == QUEUE_LEN:
            answer += _I64.pack(len(self._queues.get(f[0], ())))

    def _answer(self, values: list[bytes]) -> bytes:
        size = sum(8 + len(v) for v in values)
        if size > MAX_COMMAND_BYTES:
            raise ProtocolError(f"an answer of {size} bytes (at most {MAX_COMMAND_BYTES})", "answer too large")
        self._room(size, "an answer")
        return b"".join(_vector(v) for v in values)

    def _present(self, key: bytes) -> bool:
        return key in self._data or bool(self._queues.get(key))

    def _set(self, writer: _Client, key: bytes, value: bytes) -> None:
        old = self._data.get(key)
        grows = len(value) - (len(old) if old is not None else -len(key) - _ENTRY)
        self._stranger_room(writer, (False, key), len(key) + len(value) + _ENTRY)
        if grows > 0:
            self._room(grows, "a value")
        self._data[key] = value
        self._stored += grows
        self._owned((False, key), len(key) + len(value) + _ENTRY, writer)
        self._wake(key)

    def _wake(self, key: bytes, one: bool = False) -> None:
        """Answer the waits that ``key`` completes (``one``: the first only, as a queue push does)."""
        waiting = self._waiters.get(key)
        while waiting:
            client = waiting.pop(0)
            if key not in client.awaiting:
                continue
            client.awaiting.discard(key)
            client.awaiting_bytes -= len(key) + _ENTRY
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
        client.awaiting, client.awaiting_bytes = set(), 0
