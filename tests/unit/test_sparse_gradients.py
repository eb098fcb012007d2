"""``DistributedOptimizer`` with sparse gradients (``nn.Embedding(sparse=True)``): reduced dense, as Horovod's
``sparse_as_dense=True`` reduces them, in a packed bucket as in a bucket of its own.

A small table's gradient is packed into a bucket; reading its data pointer (it has no storage) crashed
``backward()`` with "Cannot access data pointer of Tensor that doesn't have storage", and the fp16 wire
cast with "copy_() between dense and sparse Tensors is not implemented".
"""

from __future__ import annotations

import pytest
import torch

import cloud_elastic.torch as hvd

pytestmark = pytest.mark.timeout(60)


def _model(rows: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(rows, 2, sparse=True), torch.nn.Linear(2, 1))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 2) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.tensor([0, 1, 1])).sum().backward()
        opt.step()


@pytest.mark.parametrize("rows", [1000, 1_100_000], ids=["packed", "alone"])
@pytest.mark.parametrize("compression", [hvd.Compression.none, hvd.Compression.bf16], ids=["none", "bf16"])
def test_a_sparse_embedding_trains_as_plain_sgd_does(rows, compression):
    hvd.init()  # world size 1: the average is the gradient itself
    model, plain = _model(rows), _model(rows)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), compression=compression)
    _train(model, opt)
    _train(plain, torch.optim.SGD(plain.parameters(), lr=0.5))
    for got, want in zip(model.parameters(), plain.parameters()):
        # 1e-6: plain SGD adds the duplicate lookups of row 1 in another order (a sparse update)
        torch.testing.assert_close(got, want, atol=0.02 if compression is hvd.Compression.bf16 else 1e-6, rtol=0)
    assert not torch.equal(model[0].weight[:2], _model(rows)[0].weight[:2])  # it did train
    torch.testing.assert_close(model[0].weight[2:], _model(rows)[0].weight[2:], atol=0, rtol=0)  # rows never looked up


def _lookups(rank: int) -> torch.Tensor:
    return torch.tensor([[0, 1, 1], [1, 3, 3]][rank])


def _local_sparse_grads(rows: int, rank: int) -> list[torch.Tensor]:
    model = _model(rows)
    model(_lookups(rank)).sum().backward()
    return [p.grad for p in model.parameters()]


def _bucketed_average(rank: int) -> dict:
    """Both gradients reduced through the optimizer's buckets (one packed, one alone), as an average of 2."""
    import torch.distributed as dist

    from cloud_elastic.worker.comm.ops import average_scaling
    from cloud_elastic.worker.optim.buckets import make_buckets

    got = {}
    for rows in (1000, 1_100_000):
        model = _model(rows)
        params = list(model.parameters())
        model(_lookups(rank)).sum().backward()
        scaling = average_scaling("average", 2, False)
        for bucket in make_buckets(params, 25 * 1024 * 1024):
            dist.all_reduce(bucket.launch_tensor(0.0, scaling))
            bucket.finish(scaling)
        grad = params[0].grad
        got[rows] = (grad.is_sparse, grad.coalesce().indices().tolist(), grad.coalesce().values().tolist(),
                     params[1].grad.tolist())
    return got


@pytest.fixture(scope="module")
def averaged() -> dict:
    from tests.unit.gloo_pair import run_pair

    return run_pair(_bucketed_average)


@pytest.mark.parametrize("rows", [1000, 1_100_000], ids=["packed", "alone"])
def test_a_sparse_gradient_comes_back_sparse_with_horovods_sparse_average(averaged, rows):
    # Horovod's sparse allreduce: every rank's (index, value / size) pairs together, duplicates summed.
    local = [_local_sparse_grads(rows, rank) for rank in (0, 1)]
    horovod = torch.sparse_coo_tensor(torch.cat([g[0]._indices() for g in local], 1),
                                      torch.cat([g[0]._values() for g in local]) / 2, local[0][0].shape).coalesce()
    for rank in (0, 1):
        sparse, indices, values, dense = averaged[rank][rows]
        assert sparse and indices == horovod.indices().tolist() == [[0, 1, 3]]
        torch.testing.assert_close(torch.tensor(values), horovod.values(), atol=1e-6, rtol=0)
        torch.testing.assert_close(torch.tensor(dense), (local[0][1] + local[1][1]) / 2, atol=1e-6, rtol=0)


@pytest.mark.parametrize("rows", [1000, 1_100_000], ids=["packed", "alone"])
def test_sparse_adam_trains_as_it_does_alone(rows):
    hvd.init()  # world size 1: the average is the gradient itself
    model, plain = _model(rows), _model(rows)

    def sparse_adam(m: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SparseAdam(list(m[0].parameters()), lr=0.1)

    # SparseAdam refuses a dense gradient ('SparseAdam does not support dense gradients'): the table's comes back sparse.
    _train(model, hvd.DistributedOptimizer(sparse_adam(model)))
    _train(plain, sparse_adam(plain))
    torch.testing.assert_close(model[0].weight, plain[0].weight, atol=1e-6, rtol=0)
    assert not torch.equal(model[0].weight[:2], _model(rows)[0].weight[:2])  # it did train
