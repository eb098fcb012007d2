"""The driver deletes a finished round's rendezvous keys (``StoreServer.forget``): the store's bound holds a
job's current rounds, not every round it ever formed.

The server runs in a child process, as in the driver, and torch's own TCPStore client talks to it.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from cloud_elastic.control import round_namespace

pytestmark = pytest.mark.timeout(60)

SECRET = "s" * 64

_SERVE = """
import socket, sys
from cloud_elastic.driver.net.store_server import StoreServer
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(64)
server = StoreServer(sock, max_bytes=int(sys.argv[1])).start()
print(server.port, flush=True)
for line in sys.stdin:  # "forget NAMESPACE", one a line, until the test closes stdin
    server.forget(line.split()[1])
    print("asked", flush=True)
server.close()
"""


class Served:
    def __init__(self, max_bytes: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(max_bytes)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def forget(self, namespace: str) -> None:
        self.proc.stdin.write(f"forget {namespace}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "asked"

    def client(self) -> dist.TCPStore:
        return dist.TCPStore("127.0.0.1", self.port, None, False, timeout=timedelta(seconds=10))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def served():
    servers: list[Served] = []
    yield lambda max_bytes=256 << 20: servers.append(Served(max_bytes)) or servers[-1]
    for s in servers:
        s.close()


def _write_round(store: dist.Store, round_: int, values: int, size: int) -> None:
    # As a round's groups do: torch's PrefixStore under the round's namespace (a second group adds a suffix).
    for suffix in ("", "-cross"):
        ns = dist.PrefixStore(round_namespace(SECRET, "job", round_) + suffix, store)
        for i in range(values):
            ns.set(f"rank{i}", b"x" * size)


def test_forgetting_a_round_deletes_its_keys_and_no_other(served):
    srv = served()
    store = srv.client()
    _write_round(store, 1, 3, 10)
    _write_round(store, 2, 3, 10)
    assert store.num_keys() == 12
    srv.forget(round_namespace(SECRET, "job", 1))
    assert store.num_keys() == 6  # the forget is done before the next command is read
    r1 = dist.PrefixStore(round_namespace(SECRET, "job", 1), store)
    r2 = dist.PrefixStore(round_namespace(SECRET, "job", 2) + "-cross", store)
    assert not r1.check(["rank0"]) and r2.get("rank2") == b"x" * 10


def test_a_job_whose_rounds_are_forgotten_never_reaches_the_stores_bound(served):
    """Each round here holds about half the store's bound: without forgetting, the third round's values are
    refused (the client is disconnected, and its call fails)."""
    srv = served(max_bytes=1 << 20)
    store = srv.client()
    for round_ in range(1, 9):
        _write_round(store, round_, 4, 56 << 10)  # 8 values of 56 KiB: 448 KiB a round
        if round_ > 1:
            srv.forget(round_namespace(SECRET, "job", round_ - 1))  # the driver keeps the last two
        assert store.num_keys() == 8


def test_without_forgetting_the_bound_refuses_the_third_round(served):
    """The bound is real (the test above would fail without forget)."""
    srv = served(max_bytes=1 << 20)
    store = srv.client()
    with pytest.raises(dist.DistNetworkError):
        for round_ in range(1, 4):
            _write_round(store, round_, 4, 56 << 10)
            store.num_keys()  # a set has no answer: a refused one shows at the next call that reads one
