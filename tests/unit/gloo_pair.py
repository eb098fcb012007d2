"""Two real processes in a Gloo group on loopback: what a unit test of the collectives runs them in.

``run_pair(member)`` runs ``member(rank)`` in two processes, each in the default group of both
(the caller's stand-in for the round's), and returns what each returned (a dict of plain values) by rank.
``member`` must be a module-level function.

The members are forked from a fork server that has imported torch once per pytest process (what
``multiprocessing``'s "forkserver" start method is for): spawned, each member imported torch itself, 1.7 s of
CPU here and 17-44 s of set-up per file in a loaded CI run, where this module serves five files. A fork of the
server is still a fresh process (the server has run nothing of torch's but its import: no thread, no group),
and each pair forms its own Gloo group over its own store as before.
"""

from __future__ import annotations

import multiprocessing
import queue
from typing import Any, Callable


def run_pair(member: Callable[[int], dict]) -> dict:
    """``{rank: results}`` of both members; fails (bounded by the queue's timeout) if either crashed.

    Rank 0's store listens on a port the kernel picks and rank 1 is told it: a port picked free here and bound in
    the child could be taken meanwhile by another test's process (CI of stop 56: both waited 90 s for nothing).
    """
    ctx = _context()
    out, port = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_serve, args=(member, rank, port, out)) for rank in (0, 1)]
    for p in procs:
        p.start()
    got: dict = {}
    try:
        while len(got) < len(procs):  # a crash ends the wait: its peer may wait in torch for a long time
            rank, value = out.get(timeout=5 if any("crashed" in v for v in got.values()) else 90)
            got[rank] = value
    except queue.Empty:
        silent = sorted({0, 1} - set(got))
        assert any("crashed" in v for v in got.values()), f"no answer within 90 s from ranks {silent}"
    finally:
        for p in procs:
            p.join(30 if len(got) == len(procs) else 0.1)
            if p.is_alive():
                p.kill()
    assert all("crashed" not in v for v in got.values()), got
    return got


def _context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    # Read when the server starts (its first use in this process); later calls leave the running server alone.
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return ctx


def _serve(member: Callable[[int], dict], rank: int, port: Any, out: Any) -> None:
    try:
        import torch.distributed as dist

        if rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
            port.put(store.port)
        else:
            store = dist.TCPStore("127.0.0.1", port.get(timeout=60), 2, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    except BaseException as exc:  # the parent reports it instead of waiting
        out.put((rank, {"crashed": f"set-up: {exc!r}"}))
        if rank == 0:
            port.put(0)  # rank 1 must not wait for a port that never comes
        return
    try:
        out.put((rank, member(rank)))
    except BaseException as exc:  # the parent reports it instead of waiting
        out.put((rank, {"crashed": repr(exc)}))
    finally:
        dist.destroy_process_group()
