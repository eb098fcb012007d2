"""Zero-copy commits beyond SGD: Adam, AdamW, Adagrad and RMSprop update out of place after a commit.

What a user relies on: training under DistributedOptimizer with a commit every
step gives bitwise the same numbers as the optimizer's own ``step()``; no
copy of parameters or optimizer state is made (storages alternate); and
``restore()`` returns exactly to the last commit. Settings the out-of-place
update does not reproduce (foreach, fused) take the copying path and are
exact too. Standalone mode (rank 0 of 1) runs the same commit and update code
as a distributed worker.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd

# These tests are about the kept (snapshot) commit and its out-of-place updates; in-place commits: test_in_place_commit.py.
pytestmark = [pytest.mark.timeout(90), pytest.mark.commit_mode("snapshot")]

ZERO_COPY = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adam-amsgrad-l2-maximize": lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True, weight_decay=0.05, maximize=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "adamw-amsgrad-betas": lambda ps: torch.optim.AdamW(ps, lr=0.02, betas=(0.8, 0.95), eps=1e-6, amsgrad=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05),
    "adagrad-decay": lambda ps: torch.optim.Adagrad(ps, lr=0.05, lr_decay=0.1, weight_decay=0.01, initial_accumulator_value=0.1),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01),
    "rmsprop-centered-momentum": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.9, centered=True, weight_decay=0.01),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
}
COPYING = {
    "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=True),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, fused=True),
    "adam-tensor-lr": lambda ps: torch.optim.Adam(ps, lr=torch.tensor(0.01)),
    "adamax": lambda ps: torch.optim.Adamax(ps, lr=0.01),
}


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _step(model, opt, seed: int) -> None:
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()


def _values(model, opt) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        out += [v.clone() for _, v in sorted(opt.state[p].items()) if isinstance(v, torch.Tensor)]
    return out


def _assert_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.parametrize("commit_every", [1, 3], ids=["commit-every-step", "commit-every-3"])
@pytest.mark.parametrize("name", sorted(ZERO_COPY) + sorted(COPYING))
def test_training_is_bitwise_identical_to_the_optimizers_own_step(name, commit_every):
    make = {**ZERO_COPY, **COPYING}[name]
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(make(model.parameters()))
    ref_opt = make(reference.parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    for seed in range(8):
        _step(model, opt, seed)
        _step(reference, ref_opt, seed)
        state.step += 1
        if state.step % commit_every == 0:
            state.commit()
    _assert_equal(_values(model, opt), _values(reference, ref_opt))


@pytest.mark.parametrize("name", sorted(ZERO_COPY))
def test_committing_every_step_alternates_two_storages_instead_of_copying(name):
    model = _model()
    opt = hvd.DistributedOptimizer(ZERO_COPY[name](model.parameters()))
    state = hvd.elastic.TorchState(model, opt)
    weight = model[0].weight
    seen, moment = set(), set()
    for seed in range(6):
        _step(model, opt, seed)
        state.commit()
        seen.add(weight.data_ptr())
        key = next(k for k, v in opt.state[weight].items() if k != "step" and isinstance(v, torch.Tensor))
        moment.add(opt.state[weight][key].data_ptr())
    assert len(seen) == 2 and len(moment) == 2


@pytest.mark.parametrize("name", sorted(COPYING))
def test_settings_it_does_not_reproduce_take_the_copying_path(name):
    model = _model()
    opt = hvd.DistributedOptimizer(COPYING[name](model.parameters()))
    state = hvd.elastic.TorchState(model, opt)
    before = model[0].weight.data_ptr()
    for seed in range(3):
        _step(model, opt, seed)
        state.commit()
    assert model[0].weight.data_ptr() == before


@pytest.mark.parametrize("steps_after_commit", [1, 2])
@pytest.mark.parametrize("name", sorted(ZERO_COPY) + sorted(COPYING))
def test_restore_returns_exactly_to_the_commit_and_training_goes_on_identically(name, steps_after_commit):
    make = {**ZERO_COPY, **COPYING}[name]
    model = _model()
    opt = hvd.DistributedOptimizer(make(model.parameters()))
    state = hvd.elastic.TorchState(model, opt, step=0)
    for seed in range(3):
        _step(model, opt, seed)
        state.commit()
    committed = _values(model, opt)
    for seed in range(10, 10 + steps_after_commit):
        _step(model, opt, seed)
    assert not torch.equal(model[0].weight, committed[0])
    state.restore()
    _assert_equal(_values(model, opt), committed)
    reference = _model()
    reference.load_state_dict(model.state_dict())
    ref_opt = make(reference.parameters())
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    for seed in range(20, 24):
        _step(model, opt, seed)
        state.commit()
        _step(reference, ref_opt, seed)
    _assert_equal(_values(model, opt), _values(reference, ref_opt))


def test_a_step_that_fails_between_buckets_restores_adamw_exactly(monkeypatch):
    from cloud_elastic.worker.context import get_context
    from cloud_elastic.worker.exceptions import CollectiveError

    torch.manual_seed(0)  # two buckets: the last layers up to the 512x512 weight, then the first layer
    model = torch.nn.Sequential(torch.nn.Linear(6, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 1))
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01))
    state = hvd.elastic.TorchState(model, opt)
    for seed in range(2):
        _step(model, opt, seed)
        state.commit()
    committed = _values(model, opt)
    ctx = get_context()
    real_wait, calls = ctx.wait, []

    def wait_then_lose_a_peer(work, what, **how):
        calls.append(what)
        if len(calls) == 2:  # the first bucket's parameters are already updated by now
            raise CollectiveError("gradient allreduce failed: Connection closed by peer")
        real_wait(work, what, **how)

    monkeypatch.setattr(ctx, "wait", wait_then_lose_a_peer)
    with pytest.raises(CollectiveError):
        _step(model, opt, 5)
    monkeypatch.setattr(ctx, "wait", real_wait)
    assert not torch.equal(model[4].weight, committed[4])  # the last layer (first bucket) had moved
    state.restore()
    _assert_equal(_values(model, opt), committed)


def test_a_parameter_group_added_after_wrapping_is_stepped_like_torch():
    # The per-bucket (group, parameter) pairs are cached; a new group must be seen.
    model, reference = _model(), _model()
    extra, ref_extra = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01))
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.01)
    state = hvd.elastic.TorchState(model, opt)
    for seed in range(4):
        if seed == 2:
            opt.add_param_group({"params": [extra], "lr": 0.5})
            ref_opt.add_param_group({"params": [ref_extra], "lr": 0.5})
        for m, o, e in ((model, opt, extra), (reference, ref_opt, ref_extra)):
            x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
            o.zero_grad()
            F.mse_loss(m(x), x.sum(1, keepdim=True)).backward()
            e.grad = torch.full_like(e, 0.25)  # set by hand: not in any bucket
            o.step()
        state.commit()
    _assert_equal(_values(model, opt), _values(reference, ref_opt))
    assert torch.equal(extra, ref_extra)
