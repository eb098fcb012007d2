"""Two real processes in a Gloo group on loopback: what a unit test of the collectives runs them in.

``run_pair(member)`` runs ``member(rank)`` in two spawned processes, each in the default group of both
(the caller's stand-in for the round's), and returns what each returned (a dict of plain values) by rank.
``member`` must be a module-level function.
"""

from __future__ import annotations

import multiprocessing
import socket
from typing import Any, Callable


def run_pair(member: Callable[[int], dict]) -> dict:
    """``{rank: results}`` of both members; fails (bounded by the queue's timeout) if either crashed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_serve, args=(member, rank, port, out)) for rank in (0, 1)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(30)
    assert "crashed" not in got[0] and "crashed" not in got[1], got
    return got


def _serve(member: Callable[[int], dict], rank: int, port: int, out: Any) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out.put((rank, member(rank)))
    except BaseException as exc:  # the parent reports it instead of waiting
        out.put((rank, {"crashed": repr(exc)}))
    finally:
        dist.destroy_process_group()
