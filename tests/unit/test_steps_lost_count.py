"""``steps_lost`` counts the optimizer steps a rollback undid (docs/events.md): a step whose gradient allreduce
failed was never trained, so it is not one of them (review s54: survivors undid 9, 1 and 5 steps; the events
and metrics said 10, 2 and 6). Standalone mode (rank 0 of 1); the failed collective is the only thing faked.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()


class CollectiveFailed(RuntimeError):
    pass


def _step(model, opt, seed: int) -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()


@pytest.mark.parametrize("good", [0, 1, 3])  # 0: the failing step is the update right after the commit
def test_a_step_whose_allreduce_failed_is_not_counted_as_lost(monkeypatch, good: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    state = hvd.elastic.TorchState(model, opt, step=0)
    ctx = get_context()
    _step(model, opt, 0)
    state.commit()
    for i in range(good):
        _step(model, opt, 1 + i)
    steps = ctx.progress.steps

    def fail(work, what, *args, **kwargs):
        raise CollectiveFailed(what)

    monkeypatch.setattr(ctx, "wait", fail)
    with pytest.raises(CollectiveFailed):
        _step(model, opt, 99)
    monkeypatch.undo()
    state.restore()
    ctx.ledger.note_rollback()  # as the run loop does: the driver hears rolled_back as the rollback's steps_lost
    assert ctx.ledger.rolled_back == good
    assert ctx.progress.steps == steps  # nor is it a step of the heartbeat's count
