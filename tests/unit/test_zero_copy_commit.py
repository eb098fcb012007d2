"""Zero-copy commits (worker/optim/zerocopy.py): SGD's update after a commit runs out of place.

What a user relies on: training gives bitwise the same numbers as
``torch.optim.SGD``, and ``restore()`` returns exactly to the last commit,
whichever path (zero-copy or copying) the step took. Standalone mode (rank 0
of 1) runs the same commit and update code as a distributed worker.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.settings import WorkerSettings

# These tests are about the kept (snapshot) commit and its out-of-place updates; in-place commits: test_in_place_commit.py.
pytestmark = [pytest.mark.timeout(60), pytest.mark.commit_mode("snapshot")]

SGD_CONFIGS = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "nesterov-weight-decay": dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "dampening-maximize-tensor-lr": dict(lr=torch.tensor(0.05), momentum=0.5, dampening=0.1, maximize=True),
}


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _backward(model: torch.nn.Module, seed: int) -> None:
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()


def _step(model, opt, seed: int) -> None:
    opt.zero_grad()
    _backward(model, seed)
    opt.step()


def _values(model, opt) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params = [p.detach().clone() for p in model.parameters()]
    bufs = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters() if "momentum_buffer" in opt.state[p]]
    return params, bufs


def _stepped_and_committed(model: torch.nn.Module):
    """SGD with momentum under DistributedOptimizer, one step taken and committed: (optimizer, state)."""
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    state = hvd.elastic.TorchState(model, opt)
    _step(model, opt, 1)
    state.commit()
    return opt, state


def _assert_equal(a, b) -> None:
    assert len(a[0]) == len(b[0]) and len(a[1]) == len(b[1])
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        assert torch.equal(x, y)


@pytest.mark.parametrize("commit_every", [1, 3], ids=["commit-every-step", "commit-every-3"])
@pytest.mark.parametrize("config", list(SGD_CONFIGS), ids=list(SGD_CONFIGS))
def test_training_is_bitwise_identical_to_torch_sgd(config, commit_every):
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), **copy.deepcopy(SGD_CONFIGS[config])))
    ref_opt = torch.optim.SGD(reference.parameters(), **copy.deepcopy(SGD_CONFIGS[config]))
    state = hvd.elastic.TorchState(model, opt, step=0)
    for seed in range(7):
        _step(model, opt, seed)
        _step(reference, ref_opt, seed)
        state.step += 1
        if state.step % commit_every == 0:
            state.commit()
    _assert_equal(_values(model, opt), _values(reference, ref_opt))


def test_committing_every_step_alternates_two_storages_instead_of_copying(monkeypatch):
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    state = hvd.elastic.TorchState(model, opt)
    weight = model[0].weight
    seen = set()
    for seed in range(6):
        _step(model, opt, seed)
        state.commit()
        seen.add(weight.data_ptr())
    assert len(seen) == 2

    # CLOUD_ELASTIC_ZERO_COPY_COMMIT=0 at init: an optimizer wrapped then copies instead.
    ctx = get_context()
    monkeypatch.setattr(ctx, "settings", WorkerSettings.from_environ({"CLOUD_ELASTIC_ZERO_COPY_COMMIT": "0"}))
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    state = hvd.elastic.TorchState(model, opt)
    weight = model[0].weight
    before = weight.data_ptr()
    for seed in range(3):
        _step(model, opt, seed)
        state.commit()
    assert weight.data_ptr() == before


class _MySGD(torch.optim.SGD):
    pass


@pytest.mark.parametrize(
    "make", [lambda ps: _MySGD(ps, lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True)], ids=["subclass", "foreach"]
)
def test_what_zero_copy_does_not_cover_takes_the_copying_path(make):
    model = _model()
    opt = hvd.DistributedOptimizer(make(model.parameters()))
    state = hvd.elastic.TorchState(model, opt)
    before = model[0].weight.data_ptr()
    for seed in range(3):
        _step(model, opt, seed)
        state.commit()
    assert model[0].weight.data_ptr() == before


@pytest.mark.parametrize("steps_after_commit", [1, 2, 3])
def test_restore_after_zero_copy_updates_returns_exactly_to_the_commit(steps_after_commit):
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    state = hvd.elastic.TorchState(model, opt, step=0)
    for seed in range(3):
        _step(model, opt, seed)
        state.commit()
    committed = _values(model, opt)
    for seed in range(10, 10 + steps_after_commit):
        _step(model, opt, seed)
    assert not torch.equal(model[0].weight, committed[0][0])
    state.restore()
    _assert_equal(_values(model, opt), committed)
    # Training goes on correctly from the restored state, through more zero-copy commits.
    reference = _model()
    reference.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict may alias same-device tensors
    for seed in range(20, 24):
        _step(model, opt, seed)
        state.commit()
        _step(reference, ref_opt, seed)
    _assert_equal(_values(model, opt), _values(reference, ref_opt))


def test_tied_parameters_restore_exactly():
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.out = torch.nn.Linear(6, 16), torch.nn.Linear(16, 1)
            self.shared = torch.nn.Linear(16, 16)
            self.again = self.shared  # the same Parameters under a second name in state_dict()

        def forward(self, x):
            return self.out(torch.relu(self.again(self.shared(self.first(x)))))

    torch.manual_seed(0)
    model = Tied()
    opt, state = _stepped_and_committed(model)
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    _step(model, opt, 2)
    state.restore()
    for key, value in model.state_dict().items():
        assert torch.equal(value, committed[key]), key
    assert model.again.weight is model.shared.weight


def test_parameters_that_are_views_of_one_buffer_stay_views_and_restore_exactly():
    flat = torch.zeros(16 * 6 + 16)
    layer = torch.nn.Linear(6, 16)
    with torch.no_grad():
        flat[: 16 * 6].copy_(layer.weight.reshape(-1))
        flat[16 * 6 :].copy_(layer.bias)
    layer.weight = torch.nn.Parameter(flat[: 16 * 6].view(16, 6))
    layer.bias = torch.nn.Parameter(flat[16 * 6 :])
    model = torch.nn.Sequential(layer, torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt, state = _stepped_and_committed(model)
    committed = _values(model, opt)
    _step(model, opt, 2)
    assert layer.weight.data_ptr() == flat.data_ptr()  # still a view into the user's buffer
    state.restore()
    _assert_equal(_values(model, opt), committed)


def test_a_layer_left_out_of_backward_is_still_committed():
    model = _model()
    opt, state = _stepped_and_committed(model)
    committed = _values(model, opt)
    opt.zero_grad()
    model[0].requires_grad_(False)
    _backward(model, 2)
    model[0].requires_grad_(True)
    opt.step()
    state.restore()
    _assert_equal(_values(model, opt), committed)


def test_adam_restores_exactly_to_the_commit():
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01))
    state = hvd.elastic.TorchState(model, opt)
    _step(model, opt, 1)
    state.commit()
    params = [p.detach().clone() for p in model.parameters()]
    moments = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    _step(model, opt, 2)
    _step(model, opt, 3)
    state.restore()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    assert all(torch.equal(opt.state[p]["exp_avg"], m) for p, m in zip(model.parameters(), moments))


def test_only_the_update_right_after_a_commit_runs_out_of_place_and_training_matches_torch_adamw(monkeypatch):
    # The other updates have no commit copies to trade away: torch's own step runs them, in place
    # (the out-of-place path costs more per tensor; docs/benchmarks.md, "Commit cost per optimizer").
    own_steps: list[int] = []
    hooked = torch.optim.AdamW.step
    raw = hooked.__wrapped__ if getattr(hooked, "hooked", False) else hooked

    def counted(self, *args, **kwargs):
        own_steps.append(1)
        return raw(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", counted)
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01))
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.01)
    state = hvd.elastic.TorchState(model, opt)
    ran_torch_step = []
    for seed in range(1, 8):
        before = len(own_steps)
        _step(model, opt, seed)
        ran_torch_step.append(len(own_steps) > before)
        _step(reference, ref_opt, seed)
        if seed % 3 == 0:
            state.commit()
    # 1: creates the optimizer state (torch's step); 4 and 7 follow a commit (out of place); the rest: torch's.
    assert ran_torch_step == [True, True, True, False, True, True, False]
    params = [p.detach().clone() for p in model.parameters()]
    assert all(torch.equal(p, q) for p, q in zip(params, reference.parameters()))
    assert all(torch.equal(opt.state[p]["exp_avg_sq"], ref_opt.state[q]["exp_avg_sq"])
               for p, q in zip(model.parameters(), reference.parameters()))


def test_step_hooks_run_once_per_step():
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    calls: list[str] = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    _step(model, opt, 1)
    assert calls == ["pre", "post"]


def _wide_model() -> torch.nn.Module:
    # Under DistributedOptimizer(..., bucket_cap_mb=1) the 512x512 weight (1 MiB) fills a bucket alone and is
    # allreduced in place; the others are packed into buckets.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 1))


def test_large_gradients_reduced_in_place_train_and_restore_bitwise_like_torch_sgd():
    model, reference = _wide_model(), _wide_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01),
                                   bucket_cap_mb=1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    state = hvd.elastic.TorchState(model, opt)
    for seed in range(5):
        _step(model, opt, seed)
        _step(reference, ref_opt, seed)
        state.commit()
    _assert_equal(_values(model, opt), _values(reference, ref_opt))
    committed = _values(model, opt)
    _step(model, opt, 99)
    state.restore()
    _assert_equal(_values(model, opt), committed)


def test_a_large_parameter_without_gradient_gets_zeros_like_the_packed_ones():
    model = _wide_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_cap_mb=1)
    opt.zero_grad()
    model[2].requires_grad_(False)  # the 1 MiB weight and its bias get no gradient this step
    _backward(model, 1)
    model[2].requires_grad_(True)
    opt.synchronize()
    assert torch.equal(model[2].weight.grad, torch.zeros(512, 512))
    assert torch.equal(model[2].bias.grad, torch.zeros(512))
    assert model[0].weight.grad.abs().sum() > 0


def test_a_step_that_fails_between_buckets_still_restores_exactly_to_the_commit(monkeypatch):
    from cloud_elastic.worker.context import get_context
    from cloud_elastic.worker.exceptions import CollectiveError

    model = _wide_model()
    opt, state = _stepped_and_committed(model)
    committed = _values(model, opt)
    ctx = get_context()
    real_wait, calls = ctx.wait, []

    def wait_then_lose_a_peer(work, what, **how):
        calls.append(what)
        if len(calls) == 2:  # the first bucket's parameters are already updated by now
            raise CollectiveError("gradient allreduce failed: Connection closed by peer")
        real_wait(work, what, **how)

    monkeypatch.setattr(ctx, "wait", wait_then_lose_a_peer)
    opt.zero_grad()
    _backward(model, 2)
    with pytest.raises(CollectiveError):
        opt.step()
    monkeypatch.setattr(ctx, "wait", real_wait)
    assert not _values(model, opt)[0][-1].equal(committed[0][-1])  # the last layer (first bucket) had moved
    state.restore()
    _assert_equal(_values(model, opt), committed)


def test_a_parameter_outside_the_buckets_with_a_gradient_is_stepped_like_torch_sgd():
    def frozen_first_layer():
        model = _model()
        model[0].bias.requires_grad_(False)  # not bucketed: it had no requires_grad when wrapped
        return model

    model, reference = frozen_first_layer(), frozen_first_layer()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt)
    for seed in range(3):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            _backward(m, seed)
            m[0].bias.grad = torch.full_like(m[0].bias, 0.5)  # set by hand, as some training code does
            o.step()
        state.commit()
    _assert_equal(_values(model, opt), _values(reference, ref_opt))
