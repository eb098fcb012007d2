"""The driver's sign of life beside the checkpoints, for a driver restarted where no local record is.

A running driver keeps ``driver-alive.json`` next to ``job.json`` fresh::

    {"format": "cloud-elastic-checkpoint", "job_id": "5f3a9c1e", "alive": 1795444453.5,
     "grace_s": 60.0, "host": "driver-vm", "pid": 4242, "stopped": false, "raised": {"gpu-od": 2},
     "cost": {"dollars": 12.5, "slot_hours": 9.75, "unpriced_slot_hours": 0.0, "idle_slot_hours": 1.5,
              "by_source": {"gpu-spot": 3.1, "gpu-od": 9.4}}, "instance": "9f2c61d0a4b7e853"}

``alive`` is the Unix time of the latest refresh on the driver's clock (a
restarted driver on another machine compares it with its own: clocks are
assumed in sync within seconds, as NTP keeps them), ``grace_s`` the
``--driver-grace`` its workers were given, ``stopped`` true once the driver
ended and stopped its workers, ``raised`` the host groups ``--manage-capacity``
raised whose 0 the cloud has not taken (a driver restarted after a crash sets them back
when the job no longer needs them), ``cost`` what the job had cost so far (a job with
several host sources, :mod:`cloud_elastic.cost`: the driver restarted after a crash
goes on from it; null without one), ``instance`` which process of that host and
pid wrote it (a container's PID 1 restarted in place has both again). It holds nothing secret. :class:`AliveRefresher`
rewrites it every :data:`REFRESH_S` seconds from a thread of its own, so slow
storage never holds up the driver's loop; each write is atomic (a reader sees
the old entry or the new one). A group raised is written at once, not at the
next refresh, and a raise call waits (up to :data:`REFRESH_S`) for the entry
to say it before it is sent (:meth:`AliveRefresher.raising`): a driver killed
during or just after the call leaves the group to its successor.

A driver started again without its predecessor's local record (another
machine, a rebooted VM whose runtime directory was emptied) reads it to know
whether the predecessor's workers may still be training, and waits them out.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from cloud_elastic.checkpoint.api import FORMAT, CheckpointError
from cloud_elastic.checkpoint.safety import one_line
from cloud_elastic.checkpoint.store import CheckpointStore, read_record
from cloud_elastic.config import MAX_DRIVER_GRACE_S
from cloud_elastic.cost import CostSoFar

__all__ = ["ALIVE_RECORD", "MAX_GRACE_S", "REFRESH_S", "WRITE_AHEAD_S", "AliveRefresher", "DriverAlive",
           "entry_bytes", "read_driver_alive", "read_entry", "write_driver_alive"]

log = logging.getLogger(__name__)

ALIVE_RECORD = "driver-alive.json"
#: How often a running driver refreshes its entry: a dead driver's last refresh is at most this old.
REFRESH_S = 5.0
#: The most a raise's call waits for its write-ahead (:meth:`AliveRefresher.raising`), once per value: it waits on
#: the discovery thread, so a slow or hung checkpoint store must not hold every find() up.
WRITE_AHEAD_S = 1.0
#: The largest ``grace_s`` an entry may give: a restarted driver waits at most this long for old workers
#: (``--driver-grace`` is refused above it, so a running driver never writes an entry its successor refuses).
MAX_GRACE_S = MAX_DRIVER_GRACE_S
#: How far ahead of this machine's clock an entry's ``alive`` may be (clocks are assumed in sync within seconds).
MAX_CLOCK_AHEAD_S = 24 * 3600.0
#: The most groups ``raised`` may name, and the largest capacity it may give one (storage is not trusted).
MAX_RAISED = 64
MAX_RAISED_HOSTS = 100_000
#: The largest figure (dollars, slot-hours) ``cost`` may give; its ``by_source`` names at most MAX_RAISED sources.
MAX_COST = 1e12


#: This process among all that had its host name and pid (a container's PID 1 restarted in place has both again).
THIS_INSTANCE = os.urandom(8).hex()


@dataclass(frozen=True)
class DriverAlive:
    """What a driver last said about itself beside the checkpoints (see module docstring)."""

    job_id: str
    alive: float
    grace_s: float
    host: str
    pid: int
    stopped: bool = False
    #: (host source, desired capacity) of each group this driver raised and has not set back to 0.
    raised: tuple[tuple[str, int], ...] = ()
    #: What the job had cost so far, this driver's predecessors included (None: not a job that is priced).
    cost: CostSoFar | None = None
    #: The process that wrote it among those with its host name and pid (:data:`THIS_INSTANCE`; "": not said).
    instance: str = field(default_factory=lambda: THIS_INSTANCE)
    #: The parts of the entry refused when it was read, each ("raised" or "cost", one line: the file and what was
    #: wrong), read as absent; never written (:func:`read_entry`).
    refused: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def is_this_process(self) -> bool:
        """Written by this process: the same host and pid, and the same instance where the entry names one (a
        dead driver whose pid this one reuses is not this process)."""
        return self.host == socket.gethostname() and self.pid == os.getpid() and self.instance in ("", THIS_INSTANCE)


def write_driver_alive(store: CheckpointStore, entry: DriverAlive) -> None:
    """Replace the entry atomically; CheckpointError when the storage refuses or a number is not finite."""
    data = entry_bytes(store, ALIVE_RECORD, entry)
    try:
        store.backend.write(ALIVE_RECORD, lambda f: f.write(data))
    except Exception as exc:
        raise CheckpointError(f"could not write {store.backend.url(ALIVE_RECORD)}: {' '.join(str(exc).split())}") \
            from exc


def entry_bytes(store: CheckpointStore, path: str, entry: DriverAlive, **more: Any) -> bytes:
    """``entry`` (and ``more``) as the JSON stored at ``path``; CheckpointError when a number is not finite."""
    try:
        cost = None if entry.cost is None else {**asdict(entry.cost), "by_source": dict(entry.cost.by_source)}
        fields = {k: v for k, v in asdict(entry).items() if k != "refused"}
        return json.dumps({"format": FORMAT, **fields, "raised": dict(entry.raised), "cost": cost, **more},
                          sort_keys=True, allow_nan=False).encode()
    except ValueError as exc:
        raise CheckpointError(f"not writing {store.backend.url(path)}: {exc}") from exc


def read_driver_alive(store: CheckpointStore, *, now: float | None = None) -> DriverAlive | None:
    """The entry, or None when there is none; CheckpointError (one line) when it cannot be read or parsed.

    The storage is not trusted with numbers a restarted driver waits on: ``grace_s`` must be finite
    and within [0, :data:`MAX_GRACE_S`], ``alive`` finite and at most :data:`MAX_CLOCK_AHEAD_S`
    ahead of ``now`` (this machine's clock by default). An entry outside them is refused as
    unreadable, so NaN, Infinity or 1e12 never reach a wait (where they overflowed or disabled it).
    A ``raised`` or ``cost`` out of bounds (:func:`_raised`, :func:`_cost`) is refused alone, and said in
    :attr:`DriverAlive.refused`: the rest of the entry (the wait, the other part) still holds.
    """
    return read_entry(store, ALIVE_RECORD, "driver entry", now=now)


def read_entry(store: CheckpointStore, path: str, kind: str, *, now: float | None = None) -> DriverAlive | None:
    """The :class:`DriverAlive` stored at ``path`` (a sign of life, or a driver's claim: :mod:`.claims`), checked as
    :func:`read_driver_alive` says; None when there is none."""
    now = time.time() if now is None else now
    url = store.backend.url(path)

    def parse(body: dict[str, Any]) -> DriverAlive:
        alive, grace_s = float(body["alive"]), float(body["grace_s"])
        if not (math.isfinite(grace_s) and 0.0 <= grace_s <= MAX_GRACE_S):
            raise ValueError(f"grace_s {grace_s:g} is not a number of seconds in [0, {MAX_GRACE_S:g}]")
        if not (math.isfinite(alive) and 0.0 <= alive <= now + MAX_CLOCK_AHEAD_S):
            raise ValueError(f"alive {alive:g} is not a Unix time up to {MAX_CLOCK_AHEAD_S:g}s ahead of this "
                             "machine's clock")
        entry = DriverAlive(str(body["job_id"]), alive, grace_s, str(body["host"]), int(body["pid"]),
                            bool(body.get("stopped", False)), instance=_instance(body.get("instance")))
        # Each part alone: a cost a bug or a forger put out of bounds must not lose the groups a successor lowers
        # (paid for), nor the reverse.
        raised, bad = _raised(body.get("raised") or {})
        refused = [("raised", f"{url}: {bad}")] if bad else []
        try:
            cost = _cost(body.get("cost"))
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            cost = None
            refused.append(("cost", f"{url}: {one_line(exc)}"))
        return replace(entry, raised=raised, cost=cost, refused=tuple(refused))

    return read_record(store, path, url, kind, parse)


def _instance(raw: Any) -> str:
    """An entry's ``instance``: "" when absent (an older driver's entry); ValueError unless a short string."""
    if raw is None:
        return ""
    if not isinstance(raw, str) or len(raw) > 64:
        raise ValueError("instance is not a string of at most 64 characters")
    return raw


def _raised(raw: Any) -> tuple[tuple[tuple[str, int], ...], str]:
    """An entry's ``raised``, checked, and what of it was refused ("": nothing). Not a mapping of at most
    :data:`MAX_RAISED` names: all of it (which groups were raised is not known); else each group whose name is
    over 256 characters or whose capacity is not an integer in [1, :data:`MAX_RAISED_HOSTS`], the others kept."""
    if not isinstance(raw, dict) or len(raw) > MAX_RAISED:
        return (), f"raised is not a mapping of at most {MAX_RAISED} host sources to capacities"

    def good(name: str, hosts: Any) -> bool:
        return isinstance(hosts, int) and not isinstance(hosts, bool) and 1 <= hosts <= MAX_RAISED_HOSTS \
            and len(name) <= 256
    bad = [f"{name[:80]!r} the capacity {hosts!r:.80}" if len(name) <= 256 else f"{name[:80]!r}... a name of "
           f"{len(name)} characters" for name, hosts in raw.items() if not good(name, hosts)]
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    return tuple(sorted((name, hosts) for name, hosts in raw.items() if good(name, hosts))), (
        f"raised gives host source {', '.join(bad[:3])}{more}: a capacity is an integer in [1, {MAX_RAISED_HOSTS}], "
        "a name at most 256 characters" if bad else "")


def _cost(raw: Any) -> CostSoFar | None:
    """An entry's ``cost``, checked: each figure (``dollars``, ``slot_hours``, ``unpriced_slot_hours``,
    ``idle_slot_hours``, and each source's dollars in ``by_source``) a finite number in [0, :data:`MAX_COST`],
    ``idle_slot_hours`` and ``unpriced_slot_hours`` each at most ``slot_hours`` (they are parts of them), the
    sources' dollars together at most ``dollars``, ``by_source`` at most
    :data:`MAX_RAISED` names of at most 256 characters (ValueError otherwise: the part is then refused).
    ``idle_slot_hours`` absent (an entry of a driver from before it was kept): 0. None when there is none."""
    if raw is None:
        return None
    by_source = raw.get("by_source") if isinstance(raw, dict) else None
    if not isinstance(by_source, dict) or len(by_source) > MAX_RAISED or any(len(n) > 256 for n in by_source):
        raise ValueError(f"cost is not a mapping of figures with at most {MAX_RAISED} sources' dollars")
    figures = {name: raw.get(name) for name in ("dollars", "slot_hours", "unpriced_slot_hours")}
    figures["idle_slot_hours"] = raw.get("idle_slot_hours", 0.0)
    for name, value in [*figures.items(), *((f"dollars of {n[:80]!r}", v) for n, v in by_source.items())]:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= MAX_COST:
            raise ValueError(f"cost gives {name} {value!r:.80}, not a number in [0, {MAX_COST:g}]")
    for part in ("idle_slot_hours", "unpriced_slot_hours"):
        if figures[part] > figures["slot_hours"]:
            raise ValueError(f"cost gives {part} {figures[part]:g}, more than its slot_hours {figures['slot_hours']:g}")
    # The sources' dollars are the total's parts (each written rounded to 6 decimals: that much is let through).
    if sum(by_source.values()) > figures["dollars"] * (1 + 1e-9) + 1e-6 * (len(by_source) + 1):
        raise ValueError(f"cost gives its sources {sum(by_source.values()):g} dollars, more than its total "
                         f"{figures['dollars']:g}")
    dollars, slot_hours, unpriced, idle = (float(v) for v in figures.values())
    return CostSoFar(dollars, slot_hours, unpriced, tuple(sorted((str(n), float(v)) for n, v in by_source.items())),
                     idle)


class AliveRefresher:
    """Rewrites this driver's entry every ``interval_s`` from a daemon thread, and at once when a group is raised
    (:meth:`set_raised`, :meth:`raising`); ``close`` ends it.

    A failed write is one WARNING (then DEBUG until a write succeeds again): a
    missed refresh only makes a restarted driver wait longer. The constructor
    does no I/O.
    """

    def __init__(self, store: CheckpointStore, job_id: str, grace_s: float, *, interval_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._entry = DriverAlive(job_id, 0.0, grace_s, socket.gethostname(), os.getpid())
        self._interval_s = interval_s
        self._clock = clock
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._raised: tuple[tuple[str, int], ...] = ()
        self._written_raised: tuple[tuple[str, int], ...] = ()
        self._cost: CostSoFar | None = None
        self._written_cost: CostSoFar | None = None
        # A raise about to be sent (:meth:`raising`): group -> (hosts, set_raised calls seen when it was).
        self._sending: dict[str, tuple[int, int]] = {}
        self._set_calls = 0
        self._refused: set[str] = set()  # groups whose raise was proven refused since the last set_raised
        self._waited: dict[str, int] = {}  # group -> the largest raise waited for (its write slow or failed)
        self._wake = threading.Event()  # a write wanted now: the loop writes at once
        self._done = threading.Condition()
        self._asked_seq = self._done_seq = 0  # changes made, and the last one a write attempt has included

    def set_raised(self, raised: dict[str, int]) -> None:
        """What the next writes say this driver raised (``Sourcing.raised``): any thread, no I/O. A group new or
        larger than before is written at once (on the refresher's thread), not at the next refresh: a driver killed
        meanwhile would leave a paid group raised that no successor knows of. A group no longer raised (the cloud
        took its 0) is written out at once too: a successor that still found it would set it to 0, an operator's
        raise made during the successor's wait included (one write per lowering); a raise proven refused (an
        operator's group) is written out at once by :meth:`refused`."""
        with self._done:
            before, view = dict(self._raised_now()), dict(self._raised)
            # A group whose raise was proven refused (:meth:`refused`) since the last call: this view may have been
            # read during the call, when the group counted as the job's; the next one is read after it.
            self._raised = tuple(sorted((n, h) for n, h in raised.items() if n not in self._refused))
            self._refused.clear()
            self._set_calls += 1
            # A raise's own entry is kept through the first call after it (its tick may have read the group before
            # the call started), then the job's view counts it (a call made is the job's: GroupCapacity.started).
            self._sending = {n: v for n, v in self._sending.items() if self._set_calls - v[1] < 2}
            self._changed(before, grew=any(hosts > view.get(name, 0) for name, hosts in self._raised))

    def raising(self, source: str, hosts: int, *, timeout_s: float = WRITE_AHEAD_S) -> bool:
        """A call about to set ``source``'s group to ``hosts``: have the entry say so before it is sent, waiting up
        to ``timeout_s`` for the write (the call's thread; the provider's ``on_raise``), once per value: a call that
        retries a value already waited for and still unwritten does not wait again (the refresher keeps trying).
        Whether the entry now says it (False: not started or closed, or the write failed or is slow: the call goes
        on, the write lands later)."""
        with self._done:
            if self._closing.is_set():
                return False
            self._sending[source] = (hosts, self._set_calls)
            self._refused.discard(source)  # a new call: its own entry says it
            if hosts <= dict(self._written_raised).get(source, 0):
                return True  # on disk already
            self._asked_seq += 1
            wanted = self._asked_seq
            self._wake.set()
            if self._thread is None or hosts <= self._waited.get(source, 0):
                return False  # the first write, at start, says it; or waited for once already (the store is slow)
            if self._done.wait_for(lambda: self._done_seq >= wanted or self._closing.is_set(), timeout_s) \
                    and hosts <= dict(self._written_raised).get(source, 0):
                return True
            self._waited[source] = hosts
            return False

    def refused(self, source: str, hosts: int) -> None:
        """The cloud refused the call :meth:`raising` announced, provably (no attempt landed), and the group is not
        the job's (its owner before the call was not): the entry no longer says it, written at once; any thread,
        no I/O. The job's view, which a tick during the call may have given it (the group counted as the job's
        then), drops it too, and so does the next :meth:`set_raised` (its view may have been read during the call)."""
        with self._done:
            before = dict(self._raised_now())
            if self._sending.get(source, (None,))[0] == hosts:
                del self._sending[source]
            self._raised = tuple((n, h) for n, h in self._raised if n != source)
            self._refused.add(source)
            self._changed(before)

    def _changed(self, before: dict[str, int], *, grew: bool = False, drop: bool = True) -> None:
        """Write at once where the entry's groups changed from ``before`` (one new, larger, or with ``drop`` gone) or
        the job's view ``grew`` (with the lock)."""
        now = dict(self._raised_now())
        gone = drop and before.keys() - now.keys()
        if grew or gone or any(hosts > before.get(name, 0) for name, hosts in now.items()):
            self._asked_seq += 1
            self._wake.set()

    def _raised_now(self) -> tuple[tuple[str, int], ...]:
        """What the entry says was raised: the job's view, with each raise about to be sent (the larger value)."""
        merged = dict(self._raised)
        for name, (hosts, _) in self._sending.items():
            merged[name] = max(hosts, merged.get(name, 0))
        return tuple(sorted(merged.items()))

    def set_cost(self, cost: CostSoFar | None) -> None:
        """What the next writes say the job has cost so far: a snapshot (immutable), set by the driver at each
        tick of its loop; any thread, no I/O."""
        self._cost = cost

    def start(self) -> "AliveRefresher":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="cloud-elastic-alive", daemon=True)
            self._thread.start()
        return self

    def close(self, *, stopped: bool) -> None:
        """Stop refreshing; with ``stopped`` (every worker of the job is gone) say so in a last write.

        Without it the last refresh stays, and a restarted driver waits out the grace from it (written once
        more when the groups it says were raised changed since, one set back to 0 at the end, or the cost did).
        """
        with self._done:
            self._closing.set()
            self._sending.clear()  # the job's calls have ended or were waited on: its own view is the last word
            self._done.notify_all()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10.0)  # a write stuck past this lands late, saying "alive": the safe side
        if self._thread is not None and (stopped or self._raised != self._written_raised
                                         or self._cost != self._written_cost):
            self._write(stopped=stopped)  # a group set back to 0 at the end must not be taken over as raised

    def _loop(self) -> None:
        while not self._closing.is_set():
            self._wake.clear()  # a raise set from here on is in this write or wakes the wait below
            self._write(stopped=False)
            self._wake.wait(self._interval_s)

    def _write(self, *, stopped: bool) -> None:
        with self._done:
            raised, seq = self._raised_now(), self._asked_seq
        entry = DriverAlive(self._entry.job_id, self._clock(), self._entry.grace_s, self._entry.host,
                            self._entry.pid, stopped, raised, self._cost)
        try:
            write_driver_alive(self._store, entry)
        except CheckpointError as exc:
            (log.debug if self._failing else log.warning)("driver sign of life not refreshed: %s", exc)
            self._failing = True
        else:
            self._failing = False
            with self._done:
                self._written_raised, self._written_cost = entry.raised, entry.cost
        finally:
            with self._done:
                self._done_seq = max(self._done_seq, seq)
                self._done.notify_all()
