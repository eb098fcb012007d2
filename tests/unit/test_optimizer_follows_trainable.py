"""Parameters that start or stop training after ``DistributedOptimizer`` was made are averaged as they train.

What a user relies on: a backbone unfrozen mid-training (``requires_grad = True``), or
parameters added with ``add_param_group``, train on the gradients summed over every
worker, like the others, so the replicas stay identical; a parameter frozen again is
left alone (no zero gradient for momentum to move it by). A stand-in process group
plays a second worker with the same gradients: the sum is twice this worker's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context

pytestmark = pytest.mark.timeout(60)


class _TwoWorkers:
    """A process group whose allreduce sums this worker's tensors with an identical peer's; counts the calls."""

    def __init__(self, pg) -> None:
        self._pg = pg
        self.calls = 0

    def allreduce(self, tensors, *args, **kwargs):
        self.calls += 1
        for t in tensors:
            t.mul_(2)
        return self._pg.allreduce(tensors, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._pg, name)


@pytest.fixture
def two_workers():
    hvd.init()
    ctx = get_context()
    real = ctx.pg
    ctx.pg = wrapper = _TwoWorkers(real)
    yield wrapper
    ctx.pg = real


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _loss(model, seed: int) -> torch.Tensor:
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
    return F.mse_loss(model(x), x.sum(1, keepdim=True))


def _reference_step(model, opt, seed: int) -> None:
    """The step every worker should take: the summed gradient of two identical workers."""
    opt.zero_grad()
    _loss(model, seed).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(2)
    opt.step()


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


def _set_backbone(model, trains: bool) -> None:
    for p in model[0].parameters():
        p.requires_grad = trains


@pytest.mark.parametrize("when", ["before zero_grad", "after zero_grad"])
def test_a_backbone_unfrozen_mid_training_trains_on_the_summed_gradients(two_workers, when):
    model, reference = _model(), _model()
    _set_backbone(model, False)
    _set_backbone(reference, False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), op=hvd.Sum)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for seed in range(6):
        if seed == 2:
            _set_backbone(reference, True)
            if when == "before zero_grad":
                _set_backbone(model, True)
        opt.zero_grad()
        if seed == 2 and when == "after zero_grad":
            _set_backbone(model, True)  # its backward has no bucket for them yet
        _loss(model, seed).backward()
        opt.step()
        _reference_step(reference, ref_opt, seed)
    _assert_same(model, reference)
    # Once the layout followed, a step costs what it costs an optimizer made over the unfrozen model.
    calls = two_workers.calls
    opt.zero_grad()
    _loss(model, 9).backward()
    opt.step()
    per_step = two_workers.calls - calls
    fresh = hvd.DistributedOptimizer(torch.optim.SGD(_model().parameters(), lr=0.05))
    assert per_step == len(fresh._ce_buckets)


def test_parameters_added_with_add_param_group_train_on_the_summed_gradients(two_workers):
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model[2].parameters(), lr=0.05, momentum=0.9), op=hvd.Sum)
    ref_opt = torch.optim.SGD(reference[2].parameters(), lr=0.05, momentum=0.9)
    for seed in range(5):
        if seed == 2:
            # momentum not given: it comes from the wrapped optimizer's defaults, as torch's own add_param_group
            opt.add_param_group({"params": list(model[0].parameters()), "lr": 0.01})
            ref_opt.add_param_group({"params": list(reference[0].parameters()), "lr": 0.01, "momentum": 0.9})
        opt.zero_grad()
        _loss(model, seed).backward()
        opt.step()
        _reference_step(reference, ref_opt, seed)
    _assert_same(model, reference)


def test_a_parameter_frozen_again_is_left_where_it_is(two_workers):
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), op=hvd.Sum)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for seed in range(5):
        if seed == 2:
            _set_backbone(model, False)
            _set_backbone(reference, False)
            frozen = model[0].weight.detach().clone()
        opt.zero_grad()
        _loss(model, seed).backward()
        opt.step()
        _reference_step(reference, ref_opt, seed)
    assert torch.equal(model[0].weight, frozen)  # momentum would have moved it on a zero gradient
    _assert_same(model, reference)


def test_a_commit_kept_in_place_leaves_out_a_backbone_unfrozen_later(two_workers):
    # The model's commit binding follows the optimizer's rebuilt set: an unfrozen parameter is the optimizer's
    # to keep (in place, no copy at each commit), as if it had trained from the start.
    model = _model()
    _set_backbone(model, False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    state = hvd.elastic.TorchState(model, opt)
    updated = lambda: state._handlers["model"]._updated()[0]  # noqa: E731
    assert not {id(p) for p in model[0].parameters()} & updated()
    _set_backbone(model, True)
    opt.zero_grad()
    _loss(model, 1).backward()
    opt.step()
    state.commit()
    assert {id(p) for p in model.parameters()} == updated()


def test_unfreezing_a_backbone_is_not_taken_for_a_change_outside_the_optimizer(two_workers, caplog):
    # Found by review: after the rebuild the commit compared the longer parameter list's versions with the
    # shorter one recorded at the commit, called it an outside change, and switched to copying commits; a
    # failure in that step then ended the job ("cannot restore the last commit exactly").
    model = _model()
    _set_backbone(model, False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    state = hvd.elastic.TorchState(model, opt)
    for seed in range(4):
        if seed == 2:
            _set_backbone(model, True)
        opt.zero_grad()
        _loss(model, seed).backward()
        opt.step()
        state.commit()
    committed = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    _loss(model, 9).backward()  # a failure in this step's collectives: roll back
    state.restore()
    assert "outside the optimizer" not in caplog.text
    assert get_context().ledger.holds_commit
    for p, c in zip(model.parameters(), committed):
        assert torch.equal(p, c)


def test_a_newcomer_takes_rank_0s_requires_grad_and_lays_out_its_buckets_as_its_peers(two_workers):
    # Found by the session's review: a newcomer built its model with the backbone frozen, joined after the
    # others had unfrozen it, and sent a bucket layout that did not match theirs (Gloo aborted every round
    # it joined). The sync's small parts now carry rank 0's requires_grad, and the optimizer follows them.
    from cloud_elastic.worker.comm.statecodec import StateSyncError

    model = _model()
    _set_backbone(model, False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    state = hvd.elastic.TorchState(model, opt)
    small = state._small_state(get_context(), True)  # what rank 0 sends: its own flags
    assert small["trainable"] == [[False, False, True, True]]
    state._take_trainable([[True, True, True, True]])  # what the newcomer receives
    assert all(p.requires_grad for p in model.parameters())
    peer = _model()
    peer_opt = hvd.DistributedOptimizer(torch.optim.SGD(peer.parameters(), lr=0.05, momentum=0.9))
    layout = lambda o: [[tuple(p.shape) for p in b.params] for b in o._ce_buckets]  # noqa: E731
    assert layout(opt) == layout(peer_opt)  # the same buckets as a peer that trained the backbone all along
    with pytest.raises(StateSyncError, match="requires_grad flags are malformed"):
        state._take_trainable([[True, "yes", True, True]])
