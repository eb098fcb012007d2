"""A round's group members' addresses, learned from the group's own store instead of the driver's assignment.

The assignment used to list every host of the round, so the driver encoded and signed hosts x workers
names at each round (9.8 s of its time for 8,192 one-slot hosts, a heartbeat held behind them past its
timeout) and every worker downloaded them. A member needs its peers' addresses for two things only:

* to tell its group's connections from the rest of the process's (``reclaim.GroupSockets``): shut down
  when the group is abandoned, a checkpoint upload opened meanwhile must not be among them;
* to say which peers a formation that failed was still trying to reach (partition evidence, see
  ``driver.job.partitions``).

Forming a group, each member writes its own address to the round's store and reads every peer's (Gloo's
full mesh; NCCL's unique id, rank 0's only). :class:`Peers` rides on that: every value a member writes
carries its rank and its host's addresses (:func:`own_addresses`: what its host name resolves to, which
Gloo binds to, or ``--network-interface``'s) in a small envelope that the reader takes off before torch
sees the value. Once the group has formed, a member has read every peer's envelope: no store operation
and no DNS lookup more, and no byte of the driver's. The envelope is inside the value the store signs
(``SignedStore``), so only holders of the job secret can claim an address. A value without one (an older
worker's) is passed on unchanged and tells nothing: the group's connections are then every one its
formation opened, as before.

The evidence a worker sends is addresses, not host names (``RendezvousRequest.unreachable``); the driver
names their hosts by the addresses each worker gives for its own host at rendezvous.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from typing import Any, Callable

from cloud_elastic.protocol import MAX_ADDRESSES
from cloud_elastic.worker.interface import interface_addresses
from cloud_elastic.worker.rounds.reclaim import connecting_to, plain_ip

__all__ = ["Peers", "OwnAddresses", "own_addresses"]

#: Marks a value that carries an envelope (no value torch writes starts with it: ours all do).
_MAGIC = b"\x00ce-peer/1\x00"
#: The most bytes of an envelope's header (a rank and a few addresses).
_MAX_HEADER = 1024


class OwnAddresses:
    """This worker's host's addresses, as :func:`own_addresses` gives them; thread-safe.

    A name resolved is kept for the process's life; a name that does not resolve (one only the driver knows, from
    its ``~/.ssh/config`` or ``/etc/hosts``) is not asked again for ``retry_s``: the resolver's timeout (5 s, twice,
    per search domain by glibc's defaults) was waited at every rendezvous and every round's store. At most
    ``limit`` names are kept, the oldest dropped first. ``resolve`` and ``clock``: ``socket.getaddrinfo`` and
    ``time.monotonic``, or a test's.
    """

    def __init__(self, resolve: Callable[..., Any] = socket.getaddrinfo, clock: Callable[[], float] = time.monotonic,
                 retry_s: float = 60.0, limit: int = 64) -> None:
        self._resolve, self._clock, self._retry_s, self._limit = resolve, clock, retry_s, limit
        self._known: dict[str, tuple[tuple[str, ...], float]] = {}  # name -> (addresses, until when: inf, or a retry)
        self._lock = threading.Lock()

    def __call__(self, hostname: str, interface: str | None = None) -> tuple[str, ...]:
        """The addresses of ``interface`` when given (``--network-interface``: Gloo binds its address, whatever
        the name resolves to, and nothing is resolved), else those ``hostname`` resolves to; () when none."""
        if interface:
            return interface_addresses(interface)[:MAX_ADDRESSES]
        now = self._clock()
        with self._lock:
            known = self._known.get(hostname)
        if known is not None and now < known[1]:
            return known[0]
        try:
            found = self._resolve(hostname, None, proto=socket.IPPROTO_TCP)
            addresses, until = tuple(dict.fromkeys(plain_ip(entry[4][0]) for entry in found))[:MAX_ADDRESSES], math.inf
        except OSError:
            addresses, until = (), now + self._retry_s
        with self._lock:
            self._known.pop(hostname, None)
            self._known[hostname] = (addresses, until)
            while len(self._known) > self._limit:
                del self._known[next(iter(self._known))]
        return addresses


#: The process's (see :class:`OwnAddresses`).
_own = OwnAddresses()


def own_addresses(hostname: str, interface: str | None = None) -> tuple[str, ...]:
    """This worker's host's IP addresses, those Gloo binds its group to: ``interface``'s when given, else what
    ``hostname`` (its host, as the driver names it) resolves to; () when none (see :class:`OwnAddresses`)."""
    return _own(hostname, interface)


class Peers:
    """One group's members as its store told them (see module docstring). Thread-safe: torch reads the store
    on the formation's thread.

    ``rank``, ``size``: this member's place in the group (``rank`` None: write no envelope); ``own``: its
    host's addresses.
    """

    def __init__(self, rank: int | None = None, size: int = 0, own: tuple[str, ...] = ()) -> None:
        self.rank, self.size, self.own = rank, size, tuple(own)
        self._seen: dict[int, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def wrap(self, data: bytes) -> bytes:
        """``data`` with this member's envelope in front."""
        if self.rank is None:
            return data
        header = json.dumps({"r": self.rank, "a": list(self.own)}, separators=(",", ":")).encode()
        return _MAGIC + len(header).to_bytes(2, "big") + header + data

    def unwrap(self, raw: bytes) -> bytes:
        """``raw`` without its envelope, whose member is noted; ValueError when the envelope is malformed."""
        if not raw.startswith(_MAGIC):
            return raw
        start = len(_MAGIC) + 2
        length = int.from_bytes(raw[len(_MAGIC):start], "big")
        try:
            header = json.loads(raw[start:start + length]) if length <= _MAX_HEADER else None
            rank, addresses = header["r"], header["a"]
            if not isinstance(rank, int) or not isinstance(addresses, list) or not all(
                    isinstance(a, str) and 0 < len(a) <= 64 for a in addresses):
                raise TypeError(header)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"a malformed member envelope in the round's store: {exc}") from None
        with self._lock:
            self._seen[rank] = tuple(addresses[:MAX_ADDRESSES])
        return raw[start + length:]

    def addresses(self) -> set[str] | None:
        """The addresses of every member (this one's included), or None until every other member's are known."""
        with self._lock:
            others = {rank: a for rank, a in self._seen.items() if rank != self.rank and 0 <= rank < self.size}
            if self.rank is None or len(others) < self.size - 1:
                return None
            return {a for addresses in others.values() for a in addresses} | set(self.own)

    def unreached(self) -> tuple[str, ...]:
        """The addresses this process is still trying to connect to (its own host's left out): a formation given
        up at its deadline reports them as its evidence. Those of this group's members come first; the others
        (a peer that wrote no envelope, NCCL's) follow, for the driver to name or ignore; at most
        :data:`MAX_ADDRESSES`."""
        with self._lock:
            members = {a for addresses in self._seen.values() for a in addresses}
        trying = connecting_to() - set(self.own)
        ordered = sorted(trying & members) + sorted(trying - members)
        return tuple(ordered[:MAX_ADDRESSES])
