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


def test_sparse_adam_is_refused_in_one_line_since_gradients_come_back_dense():
    # Handing SparseAdam its gradients back sparse (5b465d3) made SGD's momentum sparse (a newcomer's heal then
    # failed and the job lost its state) and Adam refuse the step: gradients stay dense, and SparseAdam is refused.
    from cloud_elastic.worker.unsupported import UnsupportedError

    hvd.init()
    table = torch.nn.Embedding(10, 2, sparse=True)
    with pytest.raises(UnsupportedError, match="SparseAdam takes sparse gradients only"):
        hvd.DistributedOptimizer(torch.optim.SparseAdam(table.parameters()))


@pytest.mark.parametrize("make", [lambda p: torch.optim.Adam(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)],
                         ids=["adam", "sgd-momentum"])
def test_dense_optimizers_over_a_sparse_embedding_keep_dense_state_a_heal_can_send(make):
    hvd.init()
    model = _model(1000)
    opt = hvd.DistributedOptimizer(make(model.parameters()))
    _train(model, opt)  # Adam refused a sparse gradient handed back: "Adam does not support sparse gradients"
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert state and not any(v.is_sparse for v in state)  # a sparse momentum buffer broke the newcomer's heal
