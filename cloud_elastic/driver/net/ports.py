"""The driver's ports: chosen where nothing else on the machine is handed them, and taken back after a restart.

A driver restarted within ``--driver-grace`` adopts its predecessor's running workers only where they poll: at the
predecessor's control and store ports (:mod:`cloud_elastic.driver.restart`). A port the kernel hands out (a bind to
port 0) is one of its ephemeral ports (Linux: ``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default).
Once the driver has died and its last connections on it are gone, any other bind to port 0 on the machine, or
outgoing connection, may be handed that port, and whatever holds it then (a listener; a connection, and for 60 s its
TIME_WAIT) refuses the restarted driver's bind, SO_REUSEADDR or not. Its workers then cannot be adopted.

* :func:`listening_kept` binds port 0 as a free port of the IANA dynamic range (49152-65535, which no service
  registers) above the kernel's default ephemeral range, less ``ip_local_reserved_ports`` (:func:`kept_ports`:
  61000-65535): the kernel hands those to no one. A machine whose ephemeral range was set otherwise said where its
  listeners belong (the Terraform modules set it to the firewall's training ports, so that what the kernel hands
  out lands there, the driver's ports included), and there, as where the range cannot be read (not Linux) or no
  such port is free after :data:`TRIES` random tries, it binds port 0: the kernel's choice, as before.
* :func:`retrying_taken` binds a predecessor's ports again while another socket holds one (EADDRINUSE), for as long
  as the predecessor's workers may still come back: such a holder may be short-lived (a connection, another
  program's server), and the job would wait that long before resuming from its checkpoint anyway.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import time
from pathlib import Path
from typing import Callable, TypeVar

from cloud_elastic.driver.net.selector_server import listening

__all__ = ["DEFAULT_EPHEMERAL", "DYNAMIC", "RETRY_S", "TRIES", "kept_ports", "listening_kept", "retrying_taken"]

log = logging.getLogger(__name__)

#: The IANA dynamic (private) port range: no service is registered there.
DYNAMIC = (49152, 65535)
#: Linux's default ephemeral port range (32768-61000 in older kernels): a machine that has it said nothing of its ports.
DEFAULT_EPHEMERAL = ((32768, 60999), (32768, 61000))
#: How many free-looking ports :func:`listening_kept` tries before it leaves the choice to the kernel.
TRIES = 32
#: How often :func:`retrying_taken` tries a taken port again.
RETRY_S = 0.25
_PROC = Path("/proc/sys/net/ipv4")

T = TypeVar("T")


def kept_ports(ephemeral: tuple[int, int] | None, reserved: frozenset[int] = frozenset()) -> list[int]:
    """The ports of :data:`DYNAMIC` above ``ephemeral`` (the kernel's ephemeral range, inclusive), less ``reserved``;
    none unless ``ephemeral`` is one of :data:`DEFAULT_EPHEMERAL` (see module docstring)."""
    if ephemeral not in DEFAULT_EPHEMERAL:
        return []
    return [p for p in range(ephemeral[1] + 1, DYNAMIC[1] + 1) if p not in reserved]


def _ephemeral() -> tuple[int, int] | None:
    try:
        low, high = (int(x) for x in (_PROC / "ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def _reserved() -> frozenset[int]:
    """``ip_local_reserved_ports`` ("8080,9000-9010"): kept for whoever reserved them."""
    try:
        text = (_PROC / "ip_local_reserved_ports").read_text().strip()
    except OSError:
        return frozenset()
    ports: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        try:
            ports.update(range(int(first), int(last or first) + 1))
        except ValueError:
            continue
    return frozenset(ports)


def listening_kept(bind: str, port: int, backlog: int, *, rng: random.Random | None = None) -> socket.socket:
    """A socket listening at ``bind:port``; port 0: a port of :func:`kept_ports` when one is free, else the kernel's
    choice (see module docstring). OSError as :func:`~.selector_server.listening` raises it."""
    if port:
        return listening(bind, port, backlog)
    candidates = kept_ports(_ephemeral(), _reserved())
    for candidate in (rng or random.SystemRandom()).sample(candidates, min(TRIES, len(candidates))):
        try:
            return listening(bind, candidate, backlog)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    if candidates:
        log.info("no free port outside the ephemeral range after %d tries; listening on one the kernel chose, which "
                 "a driver restarted after this one may find taken", TRIES)
    return listening(bind, 0, backlog)


def retrying_taken(start: Callable[[], T], *, until: float, wait: Callable[[float], bool],
                   taken: Callable[[OSError, float], None], clock: Callable[[], float] = time.time) -> T:
    """``start()``; while it raises EADDRINUSE, again every :data:`RETRY_S` until ``clock()`` reaches ``until``, or
    ``wait(seconds)`` returns True (the job was stopped). ``taken(error, seconds left)`` is called at the first such
    failure, to say so once. Another OSError, or the last one, is raised."""
    told = False
    while True:
        try:
            return start()
        except OSError as exc:
            left = until - clock()
            if exc.errno != errno.EADDRINUSE or left <= 0:
                raise
            if not told:
                taken(exc, left)
                told = True
            if wait(min(RETRY_S, left)):
                raise
