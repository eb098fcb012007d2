"""What Horovod's collectives accept, on two real processes in a Gloo group.

``broadcast_parameters`` takes plain tensors (``model.parameters()``, a list of them) as Horovod does;
``allreduce_``, ``grouped_allreduce_`` and ``broadcast_`` work in place on a parameter (a leaf that requires
grad: periodic model averaging); tensors that differ across workers in dtype or shape give the same one-line
ValueError on every worker (``allgather``, ``broadcast_parameters``), after which the group still works.

The collectives run on a small stand-in for the worker's context (the round's group is the default group):
everything they do between the call and Gloo is theirs.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.unit.gloo_pair import run_pair

pytestmark = pytest.mark.timeout(120)


def _context(rank: int):
    import torch
    import torch.distributed as dist

    pg = dist.distributed_c10d._get_default_group()
    return SimpleNamespace(info=SimpleNamespace(rank=rank, size=2, cross_rank=0, cross_size=1), device=torch.device("cpu"),
                           pg=pg, group=lambda what: pg, wait=lambda work, what, **how: work.wait())


def _outcome(call):
    try:
        value = call()
        return ("ok", value.tolist() if hasattr(value, "tolist") else value)  # plain values cross the queue
    except Exception as exc:  # what the script would see
        return (type(exc).__name__, str(exc))


def _member(rank: int) -> dict:
    import torch

    from cloud_elastic.worker.comm import collectives, shapes

    ctx = _context(rank)
    collectives.get_context = shapes.get_context = lambda: ctx
    hvd = collectives
    got = {}

    def model(seed: int, width: int = 4):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(width, 3), torch.nn.Linear(3, 2))

    m = model(rank)
    got["list"] = _outcome(lambda: hvd.broadcast_parameters(list(m.parameters()), root_rank=0))
    got["list values"] = [p.detach().tolist() for p in m.parameters()]
    m = model(rank)
    got["generator"] = _outcome(lambda: hvd.broadcast_parameters(m.parameters(), root_rank=0))
    got["generator values"] = [p.detach().tolist() for p in m.parameters()]
    got["not tensors"] = _outcome(lambda: hvd.broadcast_parameters([1, 2], root_rank=0))

    m = model(rank)
    got["allreduce_"] = _outcome(lambda: hvd.allreduce_(m[0].bias) is m[0].bias)
    got["grouped_allreduce_"] = _outcome(lambda: len(hvd.grouped_allreduce_([m[0].weight, m[1].weight])))
    got["broadcast_"] = _outcome(lambda: hvd.broadcast_(m[1].bias, root_rank=1) is m[1].bias)
    got["in place values"] = [p.detach().tolist() for p in m.parameters()]
    got["requires grad"] = all(p.requires_grad for p in m.parameters())

    m = model(rank, width=4 + rank)  # a model whose size depends on each worker's data
    before = m[0].weight.detach().clone()
    got["params shape"] = _outcome(lambda: hvd.broadcast_parameters(m.state_dict(), root_rank=0))
    got["params untouched"] = torch.equal(before, m[0].weight)
    doubles = model(rank).to(torch.float64 if rank else torch.float32)
    got["params dtype"] = _outcome(lambda: hvd.broadcast_parameters(doubles.named_parameters(), root_rank=0))
    extra = list(model(rank).parameters())[: 3 + rank]
    got["params count"] = _outcome(lambda: hvd.broadcast_parameters(extra, root_rank=0))

    got["allgather trailing"] = _outcome(lambda: hvd.allgather(torch.zeros(2, 5 + rank)))
    got["allgather dtype"] = _outcome(lambda: hvd.allgather(torch.zeros(2, 3, dtype=torch.int64 if rank else torch.int32)))
    got["allgather ndim"] = _outcome(lambda: hvd.allgather(torch.zeros((2, 3) if rank else (2, 3, 1))))
    got["allgather rows"] = _outcome(lambda: hvd.allgather(torch.full((1 + rank, 2), float(rank))).tolist())
    got["still in step"] = _outcome(lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist())
    return got


@pytest.fixture(scope="module")
def results() -> dict:
    return run_pair(_member)


@pytest.mark.parametrize("form", ["list", "generator"])
def test_broadcast_parameters_takes_plain_tensors_as_horovod_does(results, form):
    assert results[0][form] == results[1][form] == ("ok", None)
    assert results[0][f"{form} values"] == results[1][f"{form} values"]


def test_broadcast_parameters_refuses_what_is_not_tensors_in_one_line(results):
    for rank in (0, 1):
        kind, message = results[rank]["not tensors"]
        assert kind == "TypeError" and "tensors or (name, tensor) pairs, got a int" in message and "\n" not in message


def test_in_place_collectives_work_on_parameters(results):
    for rank in (0, 1):
        assert results[rank]["allreduce_"] == ("ok", True)
        assert results[rank]["grouped_allreduce_"] == ("ok", 2)
        assert results[rank]["broadcast_"] == ("ok", True)
        assert results[rank]["requires grad"]
    # averaged (or broadcast) alike on both workers, not left holding a sum on one
    assert results[0]["in place values"] == results[1]["in place values"]


@pytest.mark.parametrize("case, words", [
    # sorted by name, as a state_dict travels: 0.bias agrees, 0.weight is the first that differs
    ("params shape", ["tensor 1 '0.weight'", "rank 0: float32 (3, 4)", "rank 1: float32 (3, 5)"]),
    ("params dtype", ["tensor 0 '0.weight'", "rank 0: float32 (3, 4)", "rank 1: float64 (3, 4)"]),
    ("params count", ["tensors per rank: 3, 4", "tensor 3: rank 0: none; rank 1: float32 (2,)"]),
])
def test_broadcast_parameters_that_differ_fail_on_every_worker(results, case, words):
    for rank in (0, 1):
        kind, message = results[rank][case]
        assert kind == "ValueError", (rank, results[rank][case])
        assert all(w in message for w in words), message
    assert results[1]["params untouched"]  # nothing travelled: no root's bytes into a tensor of another shape


@pytest.mark.parametrize("case, words", [
    ("allgather trailing", "rank 0: float32 (*, 5); rank 1: float32 (*, 6)"),
    ("allgather dtype", "rank 0: int32 (*, 3); rank 1: int64 (*, 3)"),
    ("allgather ndim", "rank 0: float32 (*, 3, 1); rank 1: float32 (*, 3)"),
])
def test_allgather_of_tensors_that_differ_fails_on_every_worker(results, case, words):
    for rank in (0, 1):
        kind, message = results[rank][case]
        assert kind == "ValueError" and words in message, (rank, results[rank][case])


def test_after_a_mismatch_the_workers_are_still_in_step(results):
    for rank in (0, 1):
        assert results[rank]["allgather rows"] == ("ok", [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
        assert results[rank]["still in step"] == ("ok", [2.0, 2.0, 2.0])
