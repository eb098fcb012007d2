"""The driver's rendezvous store (cloud_elastic.driver.net.store_server) answers torch's own TCPStore client.

The server runs in its own process, as in the driver: some of torch's client calls
(``queue_len``) hold the GIL while they wait for the answer, so a server thread in
the client's process would never answer them.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from cloud_elastic.driver.net.store_server import MAGIC

pytestmark = pytest.mark.timeout(60)

_SERVE = """
import logging, socket, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from cloud_elastic.driver.net.store_server import StoreServer
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(64)
server = StoreServer(sock).start()
print(server.port, flush=True)
sys.stdin.read()  # until the test closes it
server.close()
print("closed", flush=True)
"""


class Served:
    """A StoreServer in a child process: its port, and the lines it logged."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.logged: list[str] = []
        threading.Thread(target=lambda: self.logged.extend(iter(self.proc.stderr.readline, "")), daemon=True).start()

    def close(self) -> str:
        self.proc.stdin.close()
        out = self.proc.stdout.read()
        self.proc.wait(10)
        return out


@pytest.fixture
def server():
    served = Served()
    yield served
    if served.proc.poll() is None:
        served.close()


def client(srv: Served, timeout_s: float = 10.0) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", srv.port, None, False, timeout=timedelta(seconds=timeout_s))


def test_every_operation_of_torchs_client_gets_torchs_answers(server):
    c = client(server)
    c.set("a", b"1")
    assert c.get("a") == b"1"
    assert c.add("n", 5) == 5 and c.add("n", -2) == 3 and c.get("n") == b"3"
    assert c.check(["a", "n"]) and not c.check(["a", "absent"])
    assert c.compare_set("cs", "", "x") == b"x"  # missing key, empty expected: set
    assert c.compare_set("cs", "y", "z") == b"x"  # mismatch: the value held
    assert c.compare_set("cs", "x", "z") == b"z"
    assert c.compare_set("absent2", "e", "v") == b"e" and not c.check(["absent2"])  # torch's answer, nothing set
    c.append("ap", b"ab")
    c.append("ap", b"cd")
    assert c.get("ap") == b"abcd"
    c.multi_set(["m1", "m2"], [b"1", b"2"])
    assert c.multi_get(["m1", "m2"]) == [b"1", b"2"]
    assert c.num_keys() == 6
    assert c.delete_key("a") and not c.delete_key("a")
    c.queue_push("q", b"first")
    c.queue_push("q", b"second")
    assert c.queue_len("q") == 2
    assert c.queue_pop("q") == b"first" and c.queue_pop("q") == b"second" and c.queue_len("q") == 0


def test_a_wait_returns_when_another_client_sets_the_key_and_a_timed_out_wait_leaves_the_client_usable(server):
    waiter, setter = client(server), client(server)
    threading.Timer(0.3, lambda: setter.set("late", b"v")).start()
    started = time.monotonic()
    waiter.wait(["late"])
    assert time.monotonic() - started >= 0.25 and waiter.get("late") == b"v"

    with pytest.raises(dist.DistStoreError):
        waiter.wait(["never"], timedelta(seconds=0.5))
    waiter.set("after", b"1")  # the cancelled wait left nothing half-read on the connection
    assert waiter.get("after") == b"1"
    setter.set("never", b"now")  # and a later set of that key answers nobody twice
    assert waiter.get("never") == b"now"


def test_a_blocking_queue_pop_waits_for_the_push(server):
    popper, pusher = client(server), client(server)
    threading.Timer(0.3, lambda: pusher.queue_push("jobs", b"one")).start()
    assert popper.queue_pop("jobs") == b"one"


def _raw(srv: Served, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        return s.recv(64)  # b"" once the server closed the connection


@pytest.mark.parametrize("forged, why", [
    (b"\x01" + struct.pack("<Q", 1) + b"k" + struct.pack("<Q", 1) + b"v", "did not open with torch's store validation"),
    (b"\x00" + struct.pack("<I", MAGIC + 1), "did not open with torch's store validation"),
    (b"\x00" + struct.pack("<I", MAGIC) + b"\x63", "unknown store command 99"),
    (b"\x00" + struct.pack("<I", MAGIC) + b"\x01" + struct.pack("<Q", 1 << 40), "a key of 1099511627776 bytes"),
    # torch's client stores "ap" as "/ap" (TCPStore's key prefix)
    (b"\x00" + struct.pack("<I", MAGIC) + b"\x04" + struct.pack("<Q", 3) + b"/ap" + struct.pack("<q", 1),
     "invalid literal for int()"),
], ids=["no-validation", "wrong-magic", "unknown-command", "huge-key", "add-to-a-non-number"])
def test_a_client_breaking_the_protocol_is_disconnected_with_one_warning_and_the_others_are_served(
        server, forged, why):
    good = client(server)
    good.set("ap", b"not a number")
    answer = _raw(server, forged)
    deadline = time.monotonic() + 5
    while not server.logged and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(server.logged) == 1, server.logged
    assert server.logged[0].startswith("rendezvous store: disconnected 127.0.0.1:") and why in server.logged[0]
    assert answer == b""
    good.set("still", b"served")
    assert good.get("still") == b"served" and good.get("ap") == b"not a number"


def test_close_stops_serving_and_frees_the_port(server):
    c = client(server, timeout_s=2)
    c.set("k", b"v")
    assert server.close() == "closed\n"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()


#: Leaves the serving process a few descriptors, once it serves: the rest of its limit taken by files it
#: holds (the driver's other work), so that the servers' own caps on connections (a share of the limit, and
#: a quarter of that for connections that sent nothing yet) are not what stops them.
FEW_FDS = """
import os, resource
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
_taken = [os.open(os.devnull, os.O_RDONLY) for _ in range(1018)]
"""


def short_of_descriptors(script: str, *argv: str) -> tuple[subprocess.Popen, int, list[str]]:
    """``script`` (which prints its port once it serves) run with ``FEW_FDS`` applied just before that
    print: the process, its port, and the lines it logs as they come."""
    script = script.replace("print(", FEW_FDS + "print(", 1)
    proc = subprocess.Popen([sys.executable, "-c", script, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    logged: list[str] = []
    threading.Thread(target=lambda: logged.extend(iter(proc.stderr.readline, "")), daemon=True).start()
    return proc, port, logged


def logged_soon(logged: list[str], text: str, timeout_s: float = 10.0) -> bool:
    """Whether a line with ``text`` is among ``logged`` within ``timeout_s`` (it comes through a pipe)."""
    deadline = time.monotonic() + timeout_s
    while not any(text in line for line in logged):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_out_of_descriptors_the_store_waits_without_spinning_says_so_once_and_serves_once_they_are_free():
    """The driver's process out of file descriptors: a connection the store cannot accept waits in the
    backlog. The store pauses its listener instead of waking at once to fail again (which spun a core and
    logged a warning per attempt), says so once, and accepts the waiting connections when descriptors are
    free again: a torch client is then served."""
    proc, port, logged = short_of_descriptors(_SERVE)
    try:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]  # more than it can accept
        assert logged_soon(logged, "rendezvous store: cannot accept connections"), logged
        cpu_before, wall_before = _cpu_s(proc.pid), time.monotonic()
        time.sleep(2.0)
        busy = (_cpu_s(proc.pid) - cpu_before) / (time.monotonic() - wall_before)
        assert busy < 0.5, f"the store used {busy:.0%} of a core while it could not accept"
        shortage = [line for line in logged if "cannot accept connections" in line]
        assert len(shortage) == 1 and "Too many open files" in shortage[0], logged
        for s in held[:8]:  # the store's side of these closes: descriptors are free again
            s.close()
        c = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=20))
        c.set("after", b"the shortage")
        assert c.get("after") == b"the shortage"
        assert logged_soon(logged, "rendezvous store: accepting connections again"), logged
        for s in held[8:]:
            s.close()
    finally:
        proc.stdin.close()
        proc.wait(10)
