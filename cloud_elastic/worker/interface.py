"""Whether a machine has the network interface ``--network-interface`` names.

A mistyped name (``eht0``) was not checked: every round's process group failed in Gloo ("Unable to find
address for: eht0") and the job formed failing rounds for ``--elastic-timeout`` (600 s by default) before its
one clear line. It is checked where the workers run instead:

* the CLI refuses it at start (exit 2) when the workers run on this machine (``-H localhost``);
* a worker on another host checks it before it registers (:func:`exit_if_missing`) and exits (code 1) with one
  line naming the interface and its host, which the driver reads back as that worker's reason
  (:func:`~cloud_elastic.protocol_reports.said_own_reason`); a failure like any other, so the host's slots are
  blacklisted as a failing host's are.

The interface's own addresses (:func:`interface_addresses`) are what a worker bound to it gives the driver as its
host's (``worker.rounds.peers.own_addresses``): Gloo binds the interface's, whatever the host's name resolves to.

Standard library only: the CLI imports it, and it must not import torch.
"""

from __future__ import annotations

import ctypes
import socket
import sys

__all__ = ["exit_if_missing", "missing_interface", "unresolved_host", "interface_addresses"]

#: The most interface names a refusal lists (a machine with hundreds of veth devices says "...").
_LISTED = 12


def unresolved_host(host: str) -> str | None:
    """None when ``host`` resolves on this machine; else the one line saying it does not. Gloo binds a group to the
    address the host's name resolves to: a name only the driver knows (its ``~/.ssh/config``, its ``/etc/hosts``)
    failed every round ("Cannot resolve NAME to a (local) address") for the whole ``--elastic-timeout``, and the
    job's end line blamed the firewall."""
    try:
        socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        return None
    except (OSError, UnicodeError) as exc:
        return (f"host name {host[:80]!r}{_NOT_RESOLVED} ({exc}): the process group binds to the address a host's "
                "name resolves to; name the host by its IP address, or give --network-interface")


#: What :func:`unresolved_host`'s line says after the name: the driver reads the line back as the worker's reason
#: (:func:`~cloud_elastic.protocol_reports.said_own_reason`).
_NOT_RESOLVED = " does not resolve on that host"


def missing_interface(name: str, where: str) -> str | None:
    """None when this machine has a network interface ``name``; else the one line saying that ``where`` (``this
    machine``, ``host 10.0.0.5``) has none of that name, with the names it has."""
    try:
        socket.if_nametoindex(name)
        return None
    except (OSError, ValueError):  # ValueError: a NUL in the name
        pass
    try:
        names = sorted(n for _, n in socket.if_nameindex())
    except OSError:
        names = []
    listed = ", ".join(names[:_LISTED]) + (", ..." if len(names) > _LISTED else "")
    has = f" (it has: {listed})" if names else ""
    return f"--network-interface {name[:40]!r}: {where} has no network interface of that name{has}"


def exit_if_missing(name: str | None, worker_id: str, host: str, gloo: bool = False) -> None:
    """Exit this worker (code 1) with one line when its machine lacks interface ``name`` or, with no ``name`` and a
    ``gloo`` group to form, when ``host`` (its host, as the driver names it) does not resolve here
    (:func:`unresolved_host`): the group it would form fails on every try."""
    why = missing_interface(name, f"host {host}") if name else unresolved_host(host) if gloo else None
    if why is not None:
        print(f"cloud-elastic: worker {worker_id}: {why}", file=sys.stderr, flush=True)
        raise SystemExit(1)


class _Sockaddr(ctypes.Structure):  # Linux's: the family is the first two bytes (BSDs put a length byte first)
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 26)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [("next", ctypes.POINTER(_Ifaddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_Sockaddr)), ("netmask", ctypes.c_void_p), ("ifu", ctypes.c_void_p),
                     ("data", ctypes.c_void_p)]
#: Where a family's address lies in its sockaddr's data (after the port; IPv6: and the flow label), and its length.
_ADDRESS_AT = {socket.AF_INET: (2, 4), socket.AF_INET6: (6, 16)}


def interface_addresses(name: str) -> tuple[str, ...]:
    """The IP addresses of this machine's network interface ``name`` (IPv4 and IPv6), in the order ``getifaddrs``
    lists them, the one Gloo binds to first; () when it has none or they cannot be read (not Linux)."""
    if not sys.platform.startswith("linux"):
        return ()
    libc = ctypes.CDLL(None)  # the process's own symbols: libc's among them
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return ()
    found: list[str] = []
    try:
        entry = head
        while entry:
            item = entry.contents
            at = _ADDRESS_AT.get(item.addr.contents.family) if item.addr else None
            if at is not None and item.name == name.encode():
                (start, length), raw = at, bytes(item.addr.contents.data)
                found.append(socket.inet_ntop(item.addr.contents.family, raw[start:start + length]))
            entry = item.next
    finally:
        libc.freeifaddrs(head)
    return tuple(dict.fromkeys(found))
