"""A worker's link probe, and the test hook that makes a worker's network slow (issue 42, part 3).

**The probe.** Each worker answers probes on a port of its own host
(:class:`LinkProbe`) and reports the port with its heartbeats. One daemon thread
accepts connections and waits for their proofs (``selectors``, no thread per
connection); a connection that proved the job's secret is answered on a thread of
its own, :data:`MAX_CONNECTIONS` at once at most. Strangers therefore never hold a
place a measurement needs:

* a connection proves the secret within :data:`PROOF_S` of being sent its nonce,
  one deadline for all 32 bytes, or is closed: a real link with a round trip of up
  to 10 s is measured (a low figure, which the slow-link drain is after), and a
  stranger trickling its proof is cut all the same;
* at most :data:`MAX_UNPROVEN` connections wait for their proof; while they all
  do and another waits to be accepted, the oldest is closed once it has waited
  :data:`CROWDED_PROOF_S` (a peer's proof comes one round trip after its nonce).

When the driver asks (a :class:`~cloud_elastic.protocol.ProbeOrder` in a poll reply;
see ``driver.job.links`` for who is asked when), it measures its links to the
named peers, one after the other, on a thread of its own, and its next heartbeats
carry the figures. The training thread and the round's
process group are never involved: nothing runs per step.

A measurement: connect, prove the job's secret (an HMAC of the peer's nonce),
then send chunks that the peer echoes back, from 16 KiB doubling to 1 MiB,
until :data:`PROBE_BYTES` have gone each way or :data:`PROBE_S` has passed,
whichever comes first. The figure is the best chunk's rate, both ways, in MB/s:
a process descheduled for part of the probe (a loaded machine) does not lower
it, a slow link lowers every chunk. Its cost: at most 4 MiB each way per peer,
or a quarter of a second plus one chunk, on both ends.

Its sockets are not a round's: its listener is skipped by the group-socket
reclaim (a listener), and its connections last a probe (a stranger's,
:data:`PROOF_S` at most), so one that a round's formation happened to see is
closed before that round is reclaimed (the reclaim checks that a descriptor
still names the same socket); one still open is shut down, which ends that
measurement alone.

**The test hook** (``CLOUD_ELASTIC_TEST_LINK_BYTES_PER_S``, read once, the first
time a worker's link probe is made): a worker given it has a slow network and
normal compute. Every Gloo operation it starts (collectives and point-to-point
alike) first waits ``bytes / rate`` seconds, counted as time in collectives,
not compute, and its probe waits the same for every chunk it sends or receives.
Its peers then wait for it in every collective, as they would for a worker
behind a degraded NIC. For tests only: it slows the process on purpose.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from cloud_elastic.protocol import LinkReport, ProbeOrder

__all__ = ["LinkProbe", "SlowLink", "measure", "link_probe_of", "CROWDED_PROOF_S", "HOOK_ENV", "MAX_CONNECTIONS",
           "MAX_UNPROVEN", "PROBE_BYTES", "PROBE_S", "PROOF_S"]

log = logging.getLogger(__name__)

#: The test hook: this worker's sockets move this many bytes per second (see module docstring).
HOOK_ENV = "CLOUD_ELASTIC_TEST_LINK_BYTES_PER_S"
#: A measurement stops once this many bytes went each way,
PROBE_BYTES = 4 << 20
#: or once this long has passed (seconds).
PROBE_S = 0.25
_FIRST_CHUNK = 16 << 10
_MAX_CHUNK = 1 << 20
_WARM_UP = 1 << 10
_NONCE = 16
_CONNECT_S = 5.0
_IO_S = 10.0
#: An accepted connection proves the job's secret within this many seconds of being sent its nonce, or is closed
#: (as long as a read might wait once the proof is in: a link as slow as that is still measured).
PROOF_S = _IO_S
#: Connections waiting for their proof at once; past them, new ones wait to be accepted,
MAX_UNPROVEN = 64
#: and the oldest waiting is closed once it has waited this long (seconds).
CROWDED_PROOF_S = 1.0
#: Measurements answered at once (a peer's lasts a quarter of a second).
MAX_CONNECTIONS = 4
#: The Gloo operations the hook delays, and the arguments that hold their tensors.
_GLOO_OPS = ("allreduce", "allreduce_coalesced", "broadcast", "allgather", "_allgather_base", "allgather_coalesced",
             "alltoall", "alltoall_base", "reduce", "reduce_scatter", "_reduce_scatter_base", "gather", "scatter",
             "send", "recv", "recv_anysource", "barrier")


class SlowLink:
    """The test hook: ``bytes / bytes_per_s`` seconds of delay for each transfer (see module docstring)."""

    def __init__(self, bytes_per_s: float, progress: Any = None) -> None:
        self.bytes_per_s = bytes_per_s
        self._progress = progress

    @classmethod
    def from_environ(cls, progress: Any = None) -> "SlowLink | None":
        """The hook when ``CLOUD_ELASTIC_TEST_LINK_BYTES_PER_S`` holds a positive number; else None."""
        raw = os.environ.get(HOOK_ENV, "")
        try:
            rate = float(raw) if raw else 0.0
        except ValueError:
            log.warning("%s=%r is not a number: no slow-link hook", HOOK_ENV, raw)
            return None
        return cls(rate, progress) if rate > 0 and rate != float("inf") else None

    def delay(self, nbytes: int) -> None:
        """Wait as a slow link would to move ``nbytes``; on the training thread, as time in collectives."""
        seconds = nbytes / self.bytes_per_s
        progress = self._progress
        if progress is not None and getattr(progress, "_thread", None) == threading.get_ident():
            with progress.waiting():
                time.sleep(seconds)
        else:
            time.sleep(seconds)

    def install(self) -> None:
        """Delay every Gloo operation this process starts by the bytes of its tensors (once per process)."""
        import torch
        import torch.distributed as dist

        cls = dist.ProcessGroupGloo
        if getattr(cls, "_ce_slow_link", None) is not None:
            return
        cls._ce_slow_link = self
        originals: dict[str, Any] = {}
        cls._ce_originals = originals

        def nbytes(value: Any) -> int:
            if isinstance(value, torch.Tensor):
                return value.numel() * value.element_size()
            if isinstance(value, (list, tuple)):
                return sum(nbytes(v) for v in value)
            return 0

        def wrap(name: str) -> None:
            original = getattr(cls, name, None)
            if original is None:
                return
            originals[name] = cls.__dict__.get(name)

            def delayed(pg: Any, *args: Any, **kwargs: Any) -> Any:
                self.delay(sum(nbytes(a) for a in args) + sum(nbytes(v) for v in kwargs.values()))
                return original(pg, *args, **kwargs)

            setattr(cls, name, delayed)

        for name in _GLOO_OPS:
            wrap(name)
        log.warning("test hook %s: this worker's network moves %g bytes/s (collectives and link probes)",
                    HOOK_ENV, self.bytes_per_s)

    @staticmethod
    def uninstall() -> None:
        """Undo :meth:`install` (tests that share a process)."""
        import torch.distributed as dist

        cls = dist.ProcessGroupGloo
        for name, original in getattr(cls, "_ce_originals", {}).items():
            if original is None:
                delattr(cls, name)  # it was inherited
            else:
                setattr(cls, name, original)
        cls._ce_slow_link = cls._ce_originals = None


# -------------------------------------------------------------------- wire
def _recv_exact(sock: socket.socket, n: int, within_s: float | None = None) -> bytes:
    """``n`` bytes; socket.timeout past ``within_s`` in all (:data:`_IO_S` by default): a peer that sends a byte
    a second would hold each read no longer than the socket's timeout, but the measurement without end (review h2,
    2026-12-01)."""
    within_s = _IO_S if within_s is None else within_s
    view, got, deadline = bytearray(n), 0, time.monotonic() + within_s
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"the probe's {n} bytes did not come within {within_s:g}s")
        sock.settimeout(left)
        k = sock.recv_into(memoryview(view)[got:], n - got)
        if k == 0:
            raise ConnectionError("the peer closed the probe connection")
        got += k
    sock.settimeout(within_s)  # the next send of the socket gets its own time, not what this read left
    return bytes(view)


def _proof(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, b"cloud-elastic link probe\0" + nonce, hashlib.sha256).digest()


def measure(address: tuple[str, int], secret: bytes, hook: SlowLink | None = None) -> float:
    """The bandwidth to the probe at ``address``, in MB/s (see module docstring). Raises OSError on failure."""
    with socket.create_connection(address, timeout=_CONNECT_S) as sock:
        sock.settimeout(_IO_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = _recv_exact(sock, _NONCE)
        sock.sendall(_proof(secret, nonce))

        def echo(size: int) -> float:
            payload = bytes(size)
            began = time.monotonic()
            if hook is not None:
                hook.delay(size)
            sock.sendall(struct.pack("!I", size) + payload)
            _recv_exact(sock, size)
            if hook is not None:
                hook.delay(size)
            return 2 * size / max(time.monotonic() - began, 1e-6)

        echo(_WARM_UP)
        started, moved, size, best = time.monotonic(), 0, _FIRST_CHUNK, 0.0
        while moved < PROBE_BYTES and time.monotonic() - started < PROBE_S:
            best = max(best, echo(size))
            moved += size
            size = min(size * 2, _MAX_CHUNK)
        sock.sendall(struct.pack("!I", 0))
    return best / 1e6


class LinkProbe:
    """One worker's probe: it answers peers' measurements and runs the driver's orders (see module docstring).

    ``start()`` binds and starts the answering thread; ``close()`` stops it. Never
    raises from :meth:`order` or :meth:`report`: a probe that fails costs a figure,
    not the training.
    """

    def __init__(self, bind_host: str, secret: str, hook: SlowLink | None = None) -> None:
        self._bind_host = bind_host
        self._secret = secret.encode()
        self._hook = hook
        self._listener: socket.socket | None = None
        self._closed = threading.Event()
        self._places = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._asked = 0
        self._result: tuple[int, tuple[tuple[str, float], ...]] = (0, ())
        self.port = 0

    def start(self) -> None:
        """Listen on a free port of the worker's host address and answer probes on a daemon thread."""
        try:  # the address its peers know the host by, as the round's group binds
            family, _, _, _, address = socket.getaddrinfo(self._bind_host, 0, type=socket.SOCK_STREAM)[0]
            listener = socket.socket(family, socket.SOCK_STREAM)
            try:
                listener.bind(address)
            except OSError:
                listener.close()
                raise
        except OSError:  # a name that is not this machine's own address (behind NAT): every address
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("", 0))
        listener.listen(MAX_UNPROVEN)
        listener.setblocking(False)
        self._listener, self.port = listener, listener.getsockname()[1]
        threading.Thread(target=self._serve, name="cloud-elastic-link-probe", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            self._listener.close()

    def _serve(self) -> None:
        """Accept connections and read their proofs until :meth:`close` (see the module docstring)."""
        listener = self._listener
        assert listener is not None
        waiting: dict[socket.socket, _Unproven] = {}  # oldest first
        with selectors.DefaultSelector() as selector:
            try:
                watching = False
                while not self._closed.is_set():
                    now = time.monotonic()
                    while waiting and now - next(iter(waiting.values())).since >= PROOF_S:
                        self._drop(selector, waiting, next(iter(waiting)))
                    oldest = next(iter(waiting.values())).since if waiting else now
                    room = len(waiting) < MAX_UNPROVEN or now - oldest >= CROWDED_PROOF_S
                    if room != watching:  # a full room leaves new connections in the backlog, not spinning on them
                        try:
                            if room:
                                selector.register(listener, selectors.EVENT_READ)
                            else:
                                selector.unregister(listener)
                        except (OSError, ValueError, KeyError):  # the listener closed under it: the loop ends
                            self._closed.wait(0.1)
                            continue
                        watching = room
                    due = oldest + (PROOF_S if room else CROWDED_PROOF_S) if waiting else now + 1.0
                    try:
                        events = selector.select(min(max(due - now, 0.0), 1.0))
                    except OSError:  # the listener closed under it: the loop ends
                        continue
                    for key, _ in events:
                        if key.fileobj is listener:
                            self._admit(listener, selector, waiting)
                        elif key.fileobj in waiting:
                            self._read_proof(key.fileobj, selector, waiting)
            finally:
                for conn in list(waiting):
                    self._drop(selector, waiting, conn)

    def _admit(self, listener: socket.socket, selector: selectors.BaseSelector,
               waiting: dict[socket.socket, "_Unproven"]) -> None:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:  # closed; or out of descriptors: a moment's pause, not a spin
            if not self._closed.is_set():
                log.debug("link probe: cannot accept a connection: %s", exc)
                self._closed.wait(0.1)
            return
        if len(waiting) >= MAX_UNPROVEN:  # full, and the oldest has waited CROWDED_PROOF_S: it makes room
            self._drop(selector, waiting, next(iter(waiting)))
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = os.urandom(_NONCE)
            if conn.send(nonce) != _NONCE:  # a fresh connection's buffer takes 16 bytes
                raise ConnectionError("the nonce did not go in one send")
            selector.register(conn, selectors.EVENT_READ)
        except (OSError, ValueError) as exc:
            log.debug("link probe: a connection ended before its nonce went: %s", exc)
            conn.close()
            return
        waiting[conn] = _Unproven(nonce, time.monotonic())

    def _read_proof(self, conn: socket.socket, selector: selectors.BaseSelector,
                    waiting: dict[socket.socket, "_Unproven"]) -> None:
        entry = waiting[conn]
        try:
            data = conn.recv(32 - len(entry.got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(selector, waiting, conn)
            return
        entry.got += data
        if len(entry.got) < 32:
            return
        selector.unregister(conn)
        del waiting[conn]
        if not hmac.compare_digest(bytes(entry.got), _proof(self._secret, entry.nonce)):
            conn.close()  # not one of the job's workers
            return
        try:
            threading.Thread(target=self._answer_then_close, args=(conn,), name="cloud-elastic-link-probe-answer",
                             daemon=True).start()
        except RuntimeError:  # no thread to be had: this measurement goes unanswered, the probe serves on
            conn.close()

    @staticmethod
    def _drop(selector: selectors.BaseSelector, waiting: dict[socket.socket, "_Unproven"],
              conn: socket.socket) -> None:
        del waiting[conn]
        try:
            selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _answer_then_close(self, conn: socket.socket) -> None:
        try:
            with conn, self._places:
                self._answer(conn)
        except (OSError, ConnectionError, struct.error) as exc:
            log.debug("link probe: a measurement ended early: %s", exc)

    def _answer(self, conn: socket.socket) -> None:
        """Echo a proven peer's chunks until it sends a chunk of 0 bytes (or too many)."""
        conn.settimeout(_IO_S)
        served = 0
        while True:
            (size,) = struct.unpack("!I", _recv_exact(conn, 4))
            if size == 0 or size > _MAX_CHUNK or served > 2 * PROBE_BYTES:
                return
            data = _recv_exact(conn, size)
            if self._hook is not None:
                self._hook.delay(size)  # received
                self._hook.delay(size)  # to send
            conn.sendall(data)
            served += size

    # ------------------------------------------------------------ orders
    def order(self, probe: ProbeOrder | None) -> None:
        """Run the driver's probe order on a thread of its own, once per order."""
        if probe is None or probe.seq <= self._asked:
            return
        self._asked = probe.seq
        threading.Thread(target=self._run, args=(probe,), name=f"cloud-elastic-link-probe-{probe.seq}",
                         daemon=True).start()

    def _run(self, probe: ProbeOrder) -> None:
        figures = []
        for peer in probe.peers:
            worker, _, address = peer.partition("@")
            host, _, port = address.rpartition(":")
            try:
                figures.append((worker, round(measure((host, int(port)), self._secret, self._hook), 3)))
            except (OSError, ValueError, ConnectionError) as exc:
                log.info("link probe: could not measure the link to %s: %s", peer, exc)
        self._result = (probe.seq, tuple(figures))
        log.debug("link probe %d: %s", probe.seq, figures)

    def report(self) -> LinkReport:
        """What the next heartbeat says: the port, and the figures of the last order done."""
        seq, figures = self._result
        return LinkReport(self.port, seq, figures)


@dataclass
class _Unproven:
    """A connection waiting for its proof: the nonce it was sent, when, and the bytes of its proof so far."""

    nonce: bytes
    since: float
    got: bytearray = field(default_factory=bytearray)


class _NoProbe:
    """The probe of a worker that has none (standalone, or its port could not be bound)."""

    port = 0

    def order(self, probe: ProbeOrder | None) -> None:
        pass

    def report(self) -> LinkReport | None:
        return None


def link_probe_of(ctx: Any, make: Callable[..., LinkProbe] = LinkProbe) -> LinkProbe | _NoProbe:
    """The worker context's link probe, made and started at the first call (the heartbeat thread's),
    with the test hook installed when its variable is set. Never raises."""
    probe = ctx.__dict__.get("_link_probe")
    if probe is not None:
        return probe
    try:
        hook = SlowLink.from_environ(ctx.progress)
        if hook is not None:
            hook.install()
        probe = make(ctx.hostname, ctx.settings.secret, hook)
        probe.start()
    except Exception as exc:  # noqa: BLE001 - a worker without a probe trains on; the driver just has no figures
        log.warning("worker %s: no link probe: %s", getattr(ctx, "worker_id", "?"), exc)
        probe = _NoProbe()
    ctx.__dict__["_link_probe"] = probe
    return probe
