"""``grouped_reducescatter`` checks every tensor's dtype and shape in one allgather, then scatters each.

496d095's check made each tensor of a group pay an allgather of its own before its alltoall: 2N collectives for
N tensors, twice the round trips of the data (measured: 20 calls of 64 small tensors took 3.5 s instead of
1.8-2.7 s on a Gloo pair). A mismatch in any tensor, or another number of tensors, is still a ValueError on
every worker before any rows travel. Two real processes in a Gloo group, as in ``test_collective_dtypes.py``;
each counts the collectives it starts through a wrapper of the round's group.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.unit.gloo_pair import run_pair

pytestmark = pytest.mark.timeout(120)

N = 5


def _member(rank: int, one_more: bool = False) -> dict:
    import torch
    import torch.distributed as dist

    from cloud_elastic.torch import functions
    from cloud_elastic.worker.comm import collectives, partitioned, shapes

    pg = dist.distributed_c10d._get_default_group()
    started: list[str] = []

    class Counted:  # the round's group, counting each collective started on it
        def __getattr__(self, attr):
            def call(*args, **kwargs):
                started.append(attr)
                return getattr(pg, attr)(*args, **kwargs)
            return call

    ctx = SimpleNamespace(info=SimpleNamespace(rank=rank, size=2, cross_rank=0, cross_size=1),
                          device=torch.device("cpu"), pg=pg, group=lambda what: Counted(),
                          wait=lambda work, what, **how: work.wait())
    collectives.get_context = shapes.get_context = partitioned.get_context = lambda: ctx

    def outcome(tensors):
        started.clear()
        try:
            value = ("ok", [t.tolist() for t in functions.grouped_reducescatter(tensors, op="sum")])
        except ValueError as exc:
            value = ("ValueError", str(exc))
        return value, list(started)

    same = [torch.full((4,), float(i + rank)) for i in range(N)]
    other = [t.clone() for t in same]
    if rank == 1:
        other[3] = torch.zeros(2, 2)  # the same bytes, another shape
    if one_more:  # apart: without one check for all, the workers went out of step and Gloo closed the connection
        return {"one more": outcome(same + [torch.ones(2)] * rank), "still in step": outcome(same[:1])}
    return {"same": outcome(same), "one differs": outcome(other), "still in step": outcome(same[:1])}


def _one_more(rank: int) -> dict:
    return _member(rank, one_more=True)


@pytest.fixture(scope="module")
def results():
    return run_pair(_member)


@pytest.fixture(scope="module")
def results_one_more():
    return run_pair(_one_more)


def test_a_group_of_n_tensors_runs_one_shape_check_and_n_scatters(results):
    for rank in (0, 1):
        value, started = results[rank]["same"]
        assert value == ("ok", [[2.0 * i + 1] * 2 for i in range(N)])
        assert started == ["allgather"] + ["alltoall_base"] * N  # N + 1 collectives, not 2N


@pytest.mark.parametrize("case, told", [
    ("one differs", "(tensors per rank: 5, 5); tensor 3: rank 0: float32 (4,); rank 1: float32 (2, 2)"),
    ("one more", "(tensors per rank: 5, 6); tensor 5: rank 0: none; rank 1: float32 (2,)"),
])
def test_a_mismatch_in_any_tensor_is_a_value_error_on_every_worker_before_rows_travel(request, case, told):
    results = request.getfixturevalue("results_one_more" if case == "one more" else "results")
    for rank in (0, 1):
        value, started = results[rank][case]
        assert value == ("ValueError", f"hvd.grouped_reducescatter: the workers' tensors differ {told}. Every worker "
                                       "must pass the same tensors, in the same order")
        assert "alltoall_base" not in started
    assert results[0]["still in step"][0] == results[1]["still in step"][0] == ("ok", [[1.0, 1.0]])
