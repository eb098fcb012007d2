"""Local rank 0's checkpoint decision reaches its host-mates in the state sync's safe form, never as a pickle.

Two real processes in a Gloo group (``worker.durable.sharded._from_local_rank_0``): a decision arrives as sent,
and bytes forged on the group (a pickle that would run code) are refused without running anything.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket

import pytest

pytestmark = pytest.mark.timeout(120)


class _Runs:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # would create the marker file if unpickled


def _member(rank: int, port: int, forged: bool, marker: str, out) -> None:
    import torch
    import torch.distributed as dist

    from cloud_elastic.errors import CheckpointError
    from cloud_elastic.worker.durable.sharded import _from_local_rank_0

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        if rank == 0 and forged:  # a stranger's bytes, shaped like the real exchange
            data = pickle.dumps([_Runs(marker), None, None])
            dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), src=0)
            dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0)
            out.put((rank, "sent"))
            return
        sent = [[{"name": "ckpt-1", "step": 7, "extra": {"epoch": 2}, "shards": {"a": 3}}], None, None]
        try:
            out.put((rank, _from_local_rank_0(sent if rank == 0 else None, rank == 0, torch.device("cpu"))))
        except CheckpointError as exc:
            out.put((rank, f"refused: {exc}"))
    finally:
        dist.destroy_process_group()


def _run(forged: bool, marker: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(rank, port, forged, marker, out)) for rank in (0, 1)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(30)
    return got


def test_the_decision_arrives_as_local_rank_0_sent_it(tmp_path):
    got = _run(False, str(tmp_path / "ran"))
    assert got[1] == got[0] == [[{"name": "ckpt-1", "step": 7, "extra": {"epoch": 2}, "shards": {"a": 3}}],
                                None, None]


def test_a_pickle_forged_on_the_hosts_group_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    got = _run(True, str(marker))
    assert got[1].startswith("refused: the host's checkpoint decision"), got
    assert not marker.exists() and not os.path.exists(marker)
