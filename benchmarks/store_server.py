"""The driver's rendezvous store (``driver/net/store_server.py``) against torch's own ``TCPStore`` server.

The driver serves torch's store protocol in Python so that it does not import torch. This
measures what that costs and saves, both servers side by side in each round (interleaved, so a
load change on the shared machine hits both alike):

* start-up: CPU time of a process that starts the server and exits (the driver's cost per job);
* throughput: set + get pairs per second (64-byte values) from torch's client in 1 and in 8
  client processes at once, each doing ``--pairs`` pairs; the server in a process of its own.

No target: the server only has to keep up with what workers ask of it. Gloo's rendezvous asks
O(N) keys per worker per round, NCCL's O(1) (the unique id).

Run: ``.venv/bin/python benchmarks/store_server.py [--rounds 5] [--quick]`` (a minute); it prints a
table and writes it into docs/benchmarks.md (``docsection``: section ``store-server``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

import docsection
from common import REPO, stamp

SERVERS = {
    "cloud-elastic (Python)": """
import socket, sys
from cloud_elastic.driver.net.store_server import StoreServer
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(512)
server = StoreServer(sock).start()
print(server.port, flush=True)
sys.stdin.read()
""",
    "torch's TCPStore": """
import sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
print(store.port, flush=True)
sys.stdin.read()
""",
}

CLIENT = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
c = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timeout=timedelta(seconds=120))
pairs, me, value = int(sys.argv[2]), sys.argv[3], b"x" * 64
started = time.perf_counter()
for i in range(pairs):
    c.set(f"{me}/{i}", value)
    c.get(f"{me}/{i}")
print(2 * pairs / (time.perf_counter() - started))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def start_cpu_s(code: str) -> float:
    """CPU seconds of a process that starts the server, then exits (stdin at end of file)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def throughput(code: str, clients: int, pairs: int) -> float:
    """Operations per second, all clients together."""
    server = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        procs = [subprocess.Popen([sys.executable, "-c", CLIENT, port, str(pairs), str(k)], env=_env(),
                                  stdout=subprocess.PIPE, text=True) for k in range(clients)]
        rates = []
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"a store client exited with {proc.returncode}")
            rates.append(float(out))
        return sum(rates)
    finally:
        server.stdin.close()
        server.wait(30)


def measure(rounds: int, pairs: int) -> dict:
    res: dict = {name: {"start": [], 1: [], 8: []} for name in SERVERS}
    for _ in range(rounds):
        for name, code in SERVERS.items():
            res[name]["start"].append(start_cpu_s(code))
            for clients in (1, 8):
                res[name][clients].append(throughput(code, clients, pairs))
    return res


def table(res: dict, rounds: int, pairs: int, command: str) -> str:
    py, torch_ = (res[name] for name in SERVERS)

    def med(values: list[float]) -> float:
        return statistics.median(values)

    rows = [
        f"{stamp(command)} Medians of {rounds} interleaved round(s); {pairs:,} set + get pairs per client.",
        "",
        "| | " + " | ".join(SERVERS) + " | ratio |",
        "|---|---|---|---|",
        f"| CPU to start the server (a process that starts it and exits) | {med(py['start']):.2f} s | "
        f"{med(torch_['start']):.2f} s | {med(py['start']) / med(torch_['start']):.2f} |",
    ]
    for clients in (1, 8):
        rows.append(f"| set + get, {clients} client process{'es' if clients > 1 else ''} (operations/s, all together) | "
                    f"{med(py[clients]):,.0f} | {med(torch_[clients]):,.0f} | "
                    f"{med(py[clients]) / med(torch_[clients]):.2f} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; 1 with --quick)")
    p.add_argument("--pairs", type=int, default=None, help="set + get pairs per client (default 5000; 500 with --quick)")
    docsection.add_arguments(p)
    args = p.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    pairs = args.pairs or (500 if args.quick else 5000)
    command = f"benchmarks/store_server.py --rounds {rounds} --pairs {pairs}"
    text = table(measure(rounds, pairs), rounds, pairs, command)
    docsection.publish(args, "store-server", "Rendezvous store", text, [])


if __name__ == "__main__":
    main()
