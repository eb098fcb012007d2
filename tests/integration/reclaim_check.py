"""A survivor that loses its peer N times; prints its thread and descriptor counts after each loss.

Run by tests/integration/test_group_reclaim.py. The survivor is a real
:class:`WorkerContext` forming a real Gloo group per round (signed store,
HMAC namespace), as a worker does; only the driver is left out: the round
number is counted here, and the driver's "abort round" (which a heartbeat
delivers when a peer stops answering) is set directly. The peer of each
round is a child forked from a peer server that imported torch once, so a
round costs a fork instead of a Python start-up. Peers are lost alternately
by SIGKILL (Gloo sees the closed connection at once) and SIGSTOP (only the
abort releases the survivor).

Output: one ``{"round", "loss", "threads", "fds", "reclaimed", "leaked"}``
JSON line per round.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from cloud_elastic.worker.context import RoundInfo, WorkerContext
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.settings import WorkerSettings

SECRET = "s" * 64


def settings(port: int, worker: str) -> WorkerSettings:
    return WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address=f"127.0.0.1:{port}", job_id="reclaim",
        worker_id=worker, secret=SECRET, backend="gloo", collective_timeout_s=300.0, malloc_tuning=False,
    )


def info(rank: int, round_: int) -> RoundInfo:
    return RoundInfo(rank, 2, 0, 1, rank, 2, round=round_, needs_sync=False, update_gen=0)


def peer_server(port: int) -> None:
    """Read round numbers on stdin; for each, fork a child that joins that round as rank 1."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    for line in sys.stdin:
        round_ = int(line)
        if os.fork() == 0:
            ctx = WorkerContext(settings(port, f"peer-{round_}"))
            ctx._store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=30))
            ctx._form_group(info(1, round_))
            ctx.wait(ctx.pg.allreduce([torch.ones(4)]), "first allreduce")
            print(os.getpid(), flush=True)
            time.sleep(600)
            os._exit(0)


def counts() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def survivor(rounds: int) -> None:
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    ctx = WorkerContext(settings(store.port, "survivor"))
    ctx._store = store
    peers = subprocess.Popen([sys.executable, __file__, "--peer-server", str(store.port)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert peers.stdin is not None and peers.stdout is not None
    for round_ in range(1, rounds + 1):
        peers.stdin.write(f"{round_}\n")
        peers.stdin.flush()
        ctx._form_group(info(0, round_))  # retires the previous, abandoned group
        ctx.wait(ctx.pg.allreduce([torch.ones(4)]), "first allreduce")
        pid = int(peers.stdout.readline())
        loss = "kill" if round_ % 2 else "stop"
        os.kill(pid, signal.SIGKILL if loss == "kill" else signal.SIGSTOP)
        # What the driver does once the peer misses its heartbeats (bounded either way).
        timer = threading.Timer(0.2, lambda r=round_: setattr(ctx, "_seen_abort", r))
        timer.start()
        try:
            ctx.wait(ctx.pg.allreduce([torch.ones(4)]), "allreduce with a lost peer")
            raise SystemExit(f"round {round_}: the allreduce with a lost peer succeeded")
        except CollectiveError:
            pass
        timer.cancel()  # a killed peer fails the allreduce by itself
        timer.join()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # killed above and already reaped
            pass
        ctx._last_reason = "failure"
        # Reclaiming runs off the worker's thread; wait for it before counting (bounded).
        deadline = time.monotonic() + 30
        while ctx.reclaimed_groups + ctx.leaked_groups < round_ - 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        # The reaper's own short-lived threads count their work done just before they end.
        while any(t.name.startswith("cloud-elastic-reap") for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.02)
        threads, fds = counts()
        print(json.dumps({"round": round_, "loss": loss, "threads": threads, "fds": fds,
                          "reclaimed": ctx.reclaimed_groups, "leaked": ctx.leaked_groups}), flush=True)
    peers.stdin.close()
    peers.wait(30)


if __name__ == "__main__":
    if sys.argv[1] == "--peer-server":
        peer_server(int(sys.argv[2]))
    else:
        survivor(int(sys.argv[1]))
