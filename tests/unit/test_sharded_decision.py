"""Local rank 0's checkpoint decision reaches its host-mates in the state sync's safe form, never as a pickle.

Two real processes in a Gloo group (``tests/unit/gloo_pair.py``; ``worker.durable.sharded._from_local_rank_0``):
a decision arrives as sent, and bytes forged on the group (a pickle that would run code) are refused without
running anything.
"""

from __future__ import annotations

import functools
import os
import pickle

import pytest

from tests.unit.gloo_pair import run_pair

pytestmark = pytest.mark.timeout(120)


class _Runs:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # would create the marker file if unpickled


def _member(rank: int, forged: bool, marker: str) -> dict:
    import torch
    import torch.distributed as dist

    from cloud_elastic.errors import CheckpointError
    from cloud_elastic.worker.durable.sharded import _from_local_rank_0

    if rank == 0 and forged:  # a stranger's bytes, shaped like the real exchange
        data = pickle.dumps([_Runs(marker), None, None])
        dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), src=0)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0)
        return {"got": "sent"}
    sent = [[{"name": "ckpt-1", "step": 7, "extra": {"epoch": 2}, "shards": {"a": 3}}], None, None]
    try:
        return {"got": _from_local_rank_0(sent if rank == 0 else None, rank == 0, torch.device("cpu"))}
    except CheckpointError as exc:
        return {"got": f"refused: {exc}"}


def _run(forged: bool, marker: str) -> dict:
    return {rank: value["got"] for rank, value in run_pair(functools.partial(_member, forged=forged,
                                                                             marker=marker)).items()}


def test_the_decision_arrives_as_local_rank_0_sent_it(tmp_path):
    got = _run(False, str(tmp_path / "ran"))
    assert got[1] == got[0] == [[{"name": "ckpt-1", "step": 7, "extra": {"epoch": 2}, "shards": {"a": 3}}],
                                None, None]


def test_a_pickle_forged_on_the_hosts_group_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    got = _run(True, str(marker))
    assert got[1].startswith("refused: the host's checkpoint decision"), got
    assert not marker.exists() and not os.path.exists(marker)
