"""What dropping a used Gloo process group costs, the way a worker drops its previous round's group.

    flock /tmp/bench.lock python benchmarks/peers/gloo_teardown.py [--ranks 3] [--groups 5]

``--ranks`` processes on loopback (one OpenMP thread each) form a Gloo group and run
one allreduce; then, ``--groups`` times, each forms the next group and drops its
reference to the previous one (``WorkerContext._form_group`` does the same after a
graceful membership change: the old group's destructor runs on the training thread).
Every rank prints how long forming the new group and dropping the old one took.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta


def rank_main(rank: int, size: int, port: int, groups: int) -> None:
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timeout=timedelta(seconds=30))

    def group(i: int):
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timedelta(seconds=30)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        return dist.ProcessGroupGloo(dist.PrefixStore(f"g{i}", store), rank, size, opts)

    t = torch.ones(1000)
    pg = group(0)
    pg.allreduce([t]).wait()
    for i in range(1, groups + 1):
        t0 = time.perf_counter()
        new = group(i)
        t1 = time.perf_counter()
        old, pg = pg, new
        del old  # the last reference: the destructor runs here
        t2 = time.perf_counter()
        pg.allreduce([t]).wait()
        print(f"rank {rank}: new group {1000 * (t1 - t0):.1f} ms, dropping the old one {1000 * (t2 - t1):.1f} ms",
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--groups", type=int, default=5)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.ranks, args.port, args.groups)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--ranks", str(args.ranks), "--groups", str(args.groups),
                               "--rank", str(r), "--port", str(port)], env=env) for r in range(args.ranks)]
    sys.exit(max(proc.wait() for proc in procs))


if __name__ == "__main__":
    main()
