"""The worker's state objects and optimizer in standalone mode (one process, rank 0 of 1).

Standalone mode is what a training script gets when run with plain ``python``;
it uses the same code paths for commit, restore and the deferred snapshot copies.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()
    assert (hvd.rank(), hvd.size()) == (0, 1)


def _model_and_optimizer(distributed: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, (hvd.DistributedOptimizer(opt) if distributed else opt)


def _step(model, opt, seed: int) -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()


def _snapshot(model, opt):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()},
    )


def _assert_same(a, b) -> None:
    for key in a[0]:
        assert torch.equal(a[0][key], b[0][key]), key
    assert a[1].keys() == b[1].keys()
    for key in a[1]:
        for name in a[1][key]:
            assert torch.equal(a[1][key][name], b[1][key][name]), (key, name)


# Steps past the commit, then a restore: kept commits (a loop whose windows hold steps or collectives
# keeps them; auto mode learns that in its first window, see test_in_place_commit.py).
@pytest.mark.commit_mode("snapshot")
@pytest.mark.parametrize("distributed", [False, True], ids=["plain-optimizer", "distributed-optimizer"])
def test_restore_returns_exactly_to_the_last_commit(distributed):
    model, opt = _model_and_optimizer(distributed)
    state = hvd.elastic.TorchState(model, opt, epoch=3)
    _step(model, opt, 1)
    state.commit()
    committed = _snapshot(model, opt)
    # Train on past the commit (the deferred copies must run before these updates), then fail.
    for seed in (2, 3, 4):
        _step(model, opt, seed)
    state.epoch = 9
    assert not torch.equal(model.state_dict()["0.weight"], committed[0]["0.weight"])
    state.restore()
    _assert_same(_snapshot(model, opt), committed)
    assert state.epoch == 3


def test_restore_right_after_commit_with_copies_still_queued():
    model, opt = _model_and_optimizer(True)
    state = hvd.elastic.TorchState(model, opt)
    _step(model, opt, 1)
    state.commit()  # copies of parameters and momentum are now queued, not done
    committed = _snapshot(model, opt)
    x = torch.randn(16, 4)
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()  # a failure mid-step, before the update
    state.restore()
    _assert_same(_snapshot(model, opt), committed)


def test_buffers_changed_by_the_next_forward_are_not_captured_late():
    model, opt = _model_and_optimizer(True)
    state = hvd.elastic.TorchState(model, opt)
    _step(model, opt, 1)
    state.commit()
    running_mean = model[1].running_mean.clone()
    _step(model, opt, 2)  # forward updates BatchNorm statistics before the queued copies run
    state.restore()
    assert torch.equal(model[1].running_mean, running_mean)


def test_distributed_optimizer_matches_the_wrapped_optimizer_on_one_worker():
    plain_model, plain_opt = _model_and_optimizer(False)
    dist_model, dist_opt = _model_and_optimizer(True)
    assert isinstance(dist_opt, torch.optim.SGD)
    for seed in range(5):
        _step(plain_model, plain_opt, seed)
        _step(dist_model, dist_opt, seed)
    for (name, a), b in zip(plain_model.state_dict().items(), dist_model.state_dict().values()):
        assert torch.allclose(a, b), name


def test_lr_scheduler_accepts_the_distributed_optimizer_and_restore_keeps_the_committed_lr():
    model, opt = _model_and_optimizer(True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model, opt)
    _step(model, opt, 1)
    state.commit()
    sched.step()
    _step(model, opt, 2)
    state.restore()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


def test_object_state_restores_mutable_values():
    state = hvd.elastic.ObjectState(history=[1, 2])
    state.commit()
    state.history.append(3)
    state.restore()
    assert state.history == [1, 2]


def test_collectives_on_one_worker():
    t = torch.arange(4.0)
    assert torch.equal(hvd.allreduce(t), t)
    assert torch.equal(hvd.allgather(t), t)
    assert torch.equal(hvd.broadcast(t, 0), t)
    assert hvd.broadcast_object({"a": 1}) == {"a": 1}


class _Opaque:
    """A user object only pickle can carry."""


def test_sync_carries_plain_attributes_and_optimizer_state_without_pickle():
    model, opt = _model_and_optimizer(distributed=True)
    _step(model, opt, 1)
    state = hvd.elastic.TorchState(model, opt, epoch=2, seen={1, 2}, history=[0.5, 0.25])
    before = _snapshot(model, opt)
    state.sync()
    assert (state.epoch, state.seen, state.history) == (2, {1, 2}, [0.5, 0.25])
    after = _snapshot(model, opt)
    assert all(torch.equal(a, b) for a, b in zip(before[0].values(), after[0].values()))


def test_an_attribute_only_pickle_can_carry_is_refused_up_front_with_a_remedy():
    with pytest.raises(hvd.StateSyncError, match=r"^state\.extra holds a .*_Opaque.*add_safe_globals"):
        hvd.elastic.ObjectState(epoch=0, extra=_Opaque())
    torch.serialization.add_safe_globals([_Opaque])  # the user vouches for the class
    try:
        state = hvd.elastic.ObjectState(epoch=0, extra=_Opaque())
        state.commit()
        state.sync()
        assert isinstance(state.extra, _Opaque)
    finally:
        torch.serialization.clear_safe_globals()
