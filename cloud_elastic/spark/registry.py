"""The driver side of the Spark executor: tasks register here; discovery and launch read and write it.

Each of the job's Spark tasks registers when it starts (``register``), then
long-polls for orders (``order``), which is also its heartbeat, and reports each
of its workers' exits (``exited``). A task whose worker was sent away (exit 0)
stays registered and may run another; one whose worker failed or returned its
result says it is ``leaving``, and its host leaves discovery at once. The messages ride the control plane's signed JSON
(:class:`~cloud_elastic.driver.net.control_server.ControlServer`) under a key of their own
that reached the tasks inside their Spark closure.

That server answers every connection from one thread, so an ``order`` poll
never blocks it: with nothing to say, the registry returns a
:class:`~cloud_elastic.driver.net.control_server.Held` reply, answered by :meth:`TaskRegistry.order`
(an order), :meth:`TaskRegistry.finish` (exit) or, after :data:`ORDER_POLL_S`,
with ``none``. (Waiting in the handler instead queued every task's poll behind
the others': eight idle tasks were each heard from only every four seconds, and
from eleven on, past the five-second staleness limit, healthy tasks were declared dead.)

A task is a host with one slot, named ``<ip>/task<index>.<attempt>``: a retry
of a failed task (Spark's way of giving capacity back) is a new host, so the
driver admits it at once instead of waiting out the failed slot's cooldown.

The driver's per-job secret and the worker's environment (which holds the
user's ``env=`` values) travel in the ``start`` order sealed under the registry
key (:func:`seal`), never in clear.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cloud_elastic.control import Codec
from cloud_elastic.driver.net.control_server import ControlServer, Held
from cloud_elastic.errors import ControlPlaneError

__all__ = ["TaskEntry", "TaskRegistry", "seal", "unseal"]

log = logging.getLogger(__name__)

#: How long one ``order`` long-poll is held when there is no order: the task looks at its
#: worker between polls, so this bounds how late it reports the worker's exit.
ORDER_POLL_S = 0.5


def _keystream(key: str, nonce: bytes, length: int) -> bytes:
    out = b""
    counter = 0
    while len(out) < length:
        out += hmac.new(key.encode(), nonce + counter.to_bytes(4, "big"), hashlib.sha256).digest()
        counter += 1
    return out[:length]


def seal(key: str, secret: str) -> str:
    """``secret`` encrypted and authenticated under ``key`` (HMAC-SHA256 in counter mode, then a MAC), as hex."""
    nonce = secrets.token_bytes(16)
    data = secret.encode()
    body = nonce + bytes(a ^ b for a, b in zip(data, _keystream(key, b"enc" + nonce, len(data))))
    tag = hmac.new(key.encode(), b"mac" + body, hashlib.sha256).digest()
    return (body + tag).hex()


def unseal(key: str, sealed: str) -> str:
    """The secret :func:`seal` sealed; ValueError when it was not sealed under ``key``."""
    raw = bytes.fromhex(sealed)
    body, tag = raw[:-32], raw[-32:]
    if len(body) < 16 or not hmac.compare_digest(tag, hmac.new(key.encode(), b"mac" + body, hashlib.sha256).digest()):
        raise ValueError("the sealed secret does not verify")
    nonce, data = body[:16], body[16:]
    return bytes(a ^ b for a, b in zip(data, _keystream(key, b"enc" + nonce, len(data)))).decode()


@dataclass
class TaskEntry:
    """What the driver knows about one registered task attempt."""

    key: str
    index: int
    attempt: int
    ip: str
    last_seen: float
    orders: list[dict[str, Any]] = field(default_factory=list)
    worker_id: str | None = None
    #: Worker id -> its exit code, for every worker of this task that exited.
    exits: dict[str, int] = field(default_factory=dict)
    #: The task ended (its worker failed or returned): it runs no other worker.
    leaving: bool = False
    #: Worker id -> why it failed, in one line (its training function raised, or its value cannot be pickled).
    errors: dict[str, str] = field(default_factory=dict)


class TaskRegistry:
    """Registered tasks, their orders and their workers' exits. Thread-safe; ``start()`` serves, ``close()`` stops.

    ``stale_s``: a task silent this long is gone (its executor died); its host
    leaves discovery and its worker counts as lost.
    """

    def __init__(self, job_id: str, *, bind: str = "127.0.0.1", stale_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job_id = job_id
        self.key = secrets.token_hex(32)
        self.stale_s = stale_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tasks: dict[str, TaskEntry] = {}
        self._waiting: dict[str, Held] = {}  # task key -> its order poll, held until there is news
        self._closing = False
        self._server = ControlServer(Codec(self.key, job_id), self._handle, bind=bind)

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> None:
        self._server.start()

    def finish(self) -> None:
        """Training is over: every task polling or registering from now on is told to exit at once."""
        with self._lock:
            self._closing = True
            for key in list(self._waiting):
                self._answer_waiting(key)

    def close(self) -> None:
        self.finish()
        self._server.close()

    # ------------------------------------------------------------ driver side
    def alive(self) -> dict[str, TaskEntry]:
        """Tasks that poll and have not ended: the hosts discovery reports."""
        now = self._clock()
        with self._lock:
            return {k: t for k, t in self._tasks.items()
                    if not t.leaving and now - t.last_seen <= self.stale_s and not self._closing}

    def errors(self) -> list[tuple[str, str]]:
        """``(worker id, why it failed)`` of each worker that reported a reason, in registration order."""
        with self._lock:
            return [item for t in self._tasks.values() for item in t.errors.items()]

    def entry(self, key: str) -> TaskEntry | None:
        with self._lock:
            return self._tasks.get(key)

    def exit_code(self, key: str, worker_id: str) -> int | None:
        """The exit code of worker ``worker_id`` of task ``key``; None while it has not exited."""
        with self._lock:
            t = self._tasks.get(key)
            return None if t is None else t.exits.get(worker_id)

    def is_stale(self, key: str) -> bool:
        with self._lock:
            t = self._tasks.get(key)
            return t is None or self._clock() - t.last_seen > self.stale_s

    def order(self, key: str, order: dict[str, Any]) -> bool:
        """Queue ``order`` for task ``key``; False when there is no such task."""
        with self._lock:
            t = self._tasks.get(key)
            if t is None:
                return False
            if order.get("order") == "start":
                t.worker_id = order["worker_id"]
            t.orders.append(order)
            self._answer_waiting(key)
            return True

    # ------------------------------------------------------------- task side
    def _handle(self, kind: str, msg: dict[str, Any]) -> dict[str, Any] | Held:
        if kind == "register":
            return self._register(msg)
        key = msg.get("key")
        if not isinstance(key, str):
            raise ControlPlaneError("message lacks a task key")
        with self._lock:
            t = self._tasks.get(key)
            if t is None:
                return {"order": "exit"}
            t.last_seen = self._clock()
            if kind == "exited":
                code = msg.get("code")
                if not isinstance(code, int) or isinstance(code, bool):
                    raise ControlPlaneError("malformed exited message")
                worker_id = msg.get("worker_id")
                worker_id = worker_id if isinstance(worker_id, str) and worker_id else t.worker_id or ""
                t.exits[worker_id] = code
                t.leaving = t.leaving or msg.get("leaving", True) is not False
                error = msg.get("error")
                if isinstance(error, str) and error:
                    t.errors[worker_id] = error[:500]
                return {"ok": True}
            if kind != "order":
                raise ControlPlaneError(f"unknown message kind {kind!r}")
            reply = self._news(t)
            if reply is not None:
                return self._taken(t, reply)
            # A task polls once at a time: a poll still held is a connection it gave up.
            stale = self._waiting.pop(key, None)
            if stale is not None:
                stale.finish({"order": "none"})
            held = Held(ORDER_POLL_S, lambda: self._at_deadline(key, held))
            self._waiting[key] = held
            return held

    def _news(self, t: TaskEntry) -> dict[str, Any] | None:
        """What task ``t`` must hear now (its next order, or exit once training ended), if anything."""
        if t.orders:
            return t.orders[0]
        if self._closing:  # a task with a worker still running stops it, then exits
            return {"order": "exit"}
        return None

    def _taken(self, t: TaskEntry, reply: dict[str, Any]) -> dict[str, Any]:
        """``reply`` reached task ``t``'s poll: an order leaves the queue."""
        if t.orders and t.orders[0] is reply:
            t.orders.pop(0)
        t.last_seen = self._clock()
        return reply

    def _answer_waiting(self, key: str) -> None:
        """Answer task ``key``'s held poll if it has news (under the lock)."""
        held = self._waiting.get(key)
        reply = self._news(self._tasks[key])
        if held is None or reply is None:
            return
        del self._waiting[key]
        if held.finish(reply):
            self._taken(self._tasks[key], reply)
        # else its deadline fired first: _at_deadline, waiting for the lock, takes the news instead

    def _at_deadline(self, key: str, held: Held) -> dict[str, Any]:
        """The reply of a poll held for ORDER_POLL_S (on the server's thread)."""
        with self._lock:
            if self._waiting.get(key) is held:
                del self._waiting[key]
            t = self._tasks[key]
            return self._taken(t, self._news(t) or {"order": "none"})

    def _register(self, msg: dict[str, Any]) -> dict[str, Any]:
        index, attempt, ip = msg.get("index"), msg.get("attempt"), msg.get("ip")
        if not isinstance(index, int) or not isinstance(attempt, int) or not isinstance(ip, str) or not ip:
            raise ControlPlaneError("malformed register message")
        with self._lock:
            if self._closing:
                log.info("job %s: spark task %d (attempt %d) started after training ended; told to exit",
                         self.job_id, index, attempt)
                return {"order": "exit"}
            key = f"{ip}/task{index}.{attempt}"
            if key not in self._tasks:
                self._tasks[key] = TaskEntry(key, index, attempt, ip, self._clock())
                log.info("job %s: spark task %d (attempt %d) registered on %s", self.job_id, index, attempt, ip)
            return {"key": key}
