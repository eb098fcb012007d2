"""A follower's rows count for nothing in a reducescatter, as in an allreduce (``commit.follow``).

Found by review (h6, 2026-12-01): during a follow window ``allreduce(ones, op=Sum)`` gave 2 on a round of 3 (the
newcomer left out), while ``reducescatter(10 * ones, op=Sum)`` gave 30 and an Average divided by 3: the newcomer's
rows, computed from weights it had partly received, went into every worker's result.

Two real processes in a Gloo group (``gloo_pair``); rank 1 follows in the round's open window.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.unit.gloo_pair import run_pair

pytestmark = pytest.mark.timeout(120)


def _member(rank: int) -> dict:
    import torch
    import torch.distributed as dist

    from cloud_elastic.worker.comm import collectives, partitioned, shapes

    pg = dist.distributed_c10d._get_default_group()
    window = SimpleNamespace(round=1, followers=[1], active=1)  # what followers.current reads of follow.Window
    ctx = SimpleNamespace(info=SimpleNamespace(rank=rank, size=2, cross_rank=0, cross_size=1, round=1),
                          device=torch.device("cpu"), pg=pg, group=lambda what: pg, wait=lambda work, what, **how: work.wait(),
                          following=window)
    collectives.get_context = shapes.get_context = partitioned.get_context = lambda: ctx
    mine = torch.full((4,), 10.0 * (rank + 1))  # 10 on the member, 20 on the follower
    out = {}
    for op in ("sum", "average", "min", "max", "product"):
        out[f"reducescatter {op}"] = partitioned.reducescatter(mine, op=op).tolist()
        out[f"allreduce {op}"] = collectives.allreduce(mine, op=op).tolist()
    out["grouped"] = [t.tolist() for t in partitioned.reducescatter_each([mine, mine.int()], op="sum")]
    out["input kept"] = mine.tolist()
    return out


def test_a_followers_rows_change_no_reducescatter_as_they_change_no_allreduce() -> None:
    results = run_pair(_member)
    for op in ("sum", "average", "min", "max", "product"):
        # The member's own values alone, on both workers' rows (rank 0 gets rows 0-1, rank 1 rows 2-3).
        assert results[0][f"allreduce {op}"] == [10.0] * 4, op
        assert results[0][f"reducescatter {op}"] == [10.0] * 2, op
        assert results[1][f"reducescatter {op}"] == [10.0] * 2, op
    assert results[0]["grouped"] == [[10.0] * 2, [10] * 2]
    assert results[1]["input kept"] == [20.0] * 4  # the follower's own tensor is not overwritten
