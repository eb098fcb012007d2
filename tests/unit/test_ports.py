"""The driver's ports (cloud_elastic.driver.net.ports): chosen where the kernel hands them to no one else, and bound
again by a restarted driver once whatever held one lets go.

A dead driver's port from the ephemeral range could be handed to any other socket on the machine before the
driver was restarted, and the restarted driver then gave up adopting its running workers at once (seen about once
in 30 runs of tests/ssh/test_ssh_adopted_output.py). Real sockets on loopback.
"""

from __future__ import annotations

import errno
import socket
import threading
import time

import pytest

from cloud_elastic.driver.net import ports
from cloud_elastic.driver.net.ports import DYNAMIC, kept_ports, listening_kept, retrying_taken
from cloud_elastic.driver.net.selector_server import listening

pytestmark = pytest.mark.timeout(30)


def test_the_kept_ports_are_the_dynamic_ones_above_the_default_ephemeral_range_less_the_reserved_ones() -> None:
    assert kept_ports((32768, 60999)) == list(range(61000, DYNAMIC[1] + 1))  # the kernel's default range
    assert kept_ports((32768, 61000)) == list(range(61001, DYNAMIC[1] + 1))  # older kernels' default
    assert kept_ports((32768, 60999), frozenset({61000, 65535})) == list(range(61001, 65535))
    # A range set otherwise says where this machine's listeners belong (the Terraform modules set it to the
    # firewall's training ports, below or inside the dynamic range): the kernel chooses there, as before.
    for ephemeral in ((29400, 30399), (50000, 51000), (32768, 50000), (1024, 65535), (49152, 65535), None):
        assert kept_ports(ephemeral) == [], ephemeral


def _here() -> list[int]:
    return kept_ports(ports._ephemeral(), ports._reserved())


_NOT_HERE = "this machine's ephemeral range is not the kernel's default: the kernel chooses the driver's ports"


def test_a_driver_port_is_one_the_kernel_hands_to_no_one_else() -> None:
    if not _here():
        pytest.skip(_NOT_HERE)
    with listening_kept("127.0.0.1", 0, 8) as sock:
        port = sock.getsockname()[1]
    low, high = ports._ephemeral()
    assert port in _here() and not low <= port <= high


class _Picks:
    """An injected random source that picks ``first`` first (then the rest in order)."""

    def __init__(self, first: int) -> None:
        self.first = first

    def sample(self, population: list[int], k: int) -> list[int]:
        return [self.first] + [p for p in population if p != self.first][:k - 1]


def test_a_taken_kept_port_is_passed_over_for_another() -> None:
    candidates = _here()
    if not candidates:
        pytest.skip(_NOT_HERE)
    for taken_port in candidates:
        try:
            taken = listening("127.0.0.1", taken_port, 8)
            break
        except OSError:
            continue
    with taken, listening_kept("127.0.0.1", 0, 8, rng=_Picks(taken_port)) as sock:
        port = sock.getsockname()[1]
    assert port != taken_port and port in candidates


def test_a_port_held_for_a_moment_is_bound_once_it_is_let_go_and_said_once() -> None:
    holder = listening("127.0.0.1", 0, 8)
    port = holder.getsockname()[1]
    said: list[str] = []
    release = threading.Timer(0.6, holder.close)
    release.start()
    started = time.monotonic()
    try:
        sock = retrying_taken(lambda: listening("127.0.0.1", port, 8), until=time.time() + 20, wait=lambda s:
                              time.sleep(s) or False, taken=lambda exc, left: said.append(f"{exc.errno} {left:.0f}"))
    finally:
        release.join()
    with sock:
        assert sock.getsockname()[1] == port
    assert time.monotonic() - started >= 0.5
    assert said == [f"{errno.EADDRINUSE} 20"]


def test_a_port_held_past_the_bound_is_given_up_with_the_bind_error() -> None:
    with listening("127.0.0.1", 0, 8) as holder:
        port = holder.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(OSError) as raised:
            retrying_taken(lambda: listening("127.0.0.1", port, 8), until=time.time() + 1, wait=lambda s:
                           time.sleep(s) or False, taken=lambda exc, left: None)
    assert raised.value.errno == errno.EADDRINUSE and 0.9 <= time.monotonic() - started < 10


def test_a_stop_or_an_address_that_is_not_there_ends_the_tries_at_once() -> None:
    with listening("127.0.0.1", 0, 8) as holder:
        port = holder.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(OSError):
            retrying_taken(lambda: listening("127.0.0.1", port, 8), until=time.time() + 20, wait=lambda s: True,
                           taken=lambda exc, left: None)
        assert time.monotonic() - started < 5
    said: list[OSError] = []
    with pytest.raises(OSError) as raised:  # TEST-NET-1: no interface here has it, and none will by waiting
        retrying_taken(lambda: listening("192.0.2.1", 0, 8), until=time.time() + 20, wait=lambda s: False,
                       taken=lambda exc, left: said.append(exc))
    assert raised.value.errno == errno.EADDRNOTAVAIL and said == []
