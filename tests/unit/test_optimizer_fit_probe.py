"""The optimizer check on resume changes nothing and refuses only what torch's own load and step would fail on
(review s58 rvI of 7cc5d2c/f780e43).

F1: its probe ran torch's ``Optimizer.__setstate__``, which patched ``step`` on the user's CLASS when the class had
never been through ``Optimizer.__init__``: a wrapper that only delegates (accelerate's ``AcceleratedOptimizer``
pattern) resumed with the same optimizer and its first step failed, ``AttributeError: 'Wrapped' object has no
attribute '_optimizer_step_pre_hooks'``, on every worker; a ``__setstate__`` that changed one of the optimizer's
containers changed the live optimizer's. F2: an optimizer of the user's that gained an optional hyperparameter (read
with ``group.get``, or filled by torch's load_state_dict pre-hook) was refused, though torch loads and steps it. Now
the probe is a bare instance with copies of the attributes and a ``_patch_step_function`` that does nothing, the
pre-hooks run on it, only the hyperparameters of the torch optimizer the live one is (or subclasses) are required,
and a delegating wrapper or a class with its own ``load_state_dict`` is not checked. Replicated payloads, then
sharded ones through the worker's loader (as ``test_checkpoint_mismatch_kinds``).
"""

from __future__ import annotations

import copy

import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic.checkpoint import load_state_payload, state_payload
from cloud_elastic.checkpoint.optimizer_fit import OptimizerMismatch, check_optimizer, lacking
from tests.unit.test_checkpoint_mismatch_kinds import _OPTIMIZER, _ends_saying, _sharded
from tests.unit.test_durable_failures import _State
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx, _train
from tests.unit.test_sharded_resume import _everything, _Net, _same, _written

pytestmark = pytest.mark.timeout(90)


def _wrapper_classes() -> dict[str, type]:
    """Fresh wrapper classes (a probe that patched one must not hide behind another test's)."""

    class Wrapped(torch.optim.Optimizer):
        """Delegates through read-only properties; never runs ``Optimizer.__init__``."""

        def __init__(self, optimizer: torch.optim.Optimizer) -> None:
            self.optimizer = optimizer

        param_groups = property(lambda self: self.optimizer.param_groups)
        defaults = property(lambda self: self.optimizer.defaults)
        state = property(lambda self: self.optimizer.state)

        def step(self, closure=None):
            return self.optimizer.step(closure)

        def zero_grad(self, set_to_none: bool = True) -> None:
            self.optimizer.zero_grad(set_to_none)

        def state_dict(self):
            return self.optimizer.state_dict()

        def load_state_dict(self, state_dict) -> None:
            self.optimizer.load_state_dict(state_dict)

    class Accelerated(Wrapped):
        """accelerate's ``AcceleratedOptimizer``: properties with setters and a ``__setstate__`` of its own."""

        param_groups = property(lambda self: self.optimizer.param_groups,
                                lambda self, value: setattr(self.optimizer, "param_groups", value))
        defaults = property(lambda self: self.optimizer.defaults,
                            lambda self, value: setattr(self.optimizer, "defaults", value))

        def __setstate__(self, state) -> None:
            self.__dict__.update(state)

    return {"Wrapped": Wrapped, "Accelerated": Accelerated}


def _trained(build) -> _State:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = build(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return _State(model=model, optimizer=optimizer)


def _fresh(build) -> _State:
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    return _State(model=model, optimizer=build(model.parameters()))


def _payload(state: _State) -> dict:
    """``state``'s payload as a checkpoint holds it: its own tensors, not the live ones."""
    return copy.deepcopy(state_payload(state))


def _step(state: _State) -> torch.Tensor:
    """One step of ``state``; the weight it leaves."""
    state.optimizer.zero_grad()
    state.model(torch.ones(2, 4)).sum().backward()
    state.optimizer.step()
    return state.model.weight.detach().clone()


@pytest.mark.parametrize("kind", ["Wrapped", "Accelerated"])
def test_a_delegating_wrapper_resumes_with_the_same_optimizer_and_steps(kind):
    wrapper = _wrapper_classes()[kind]
    steps = [vars(c).get("step") for c in wrapper.__mro__]
    written = _trained(lambda params: wrapper(torch.optim.AdamW(params, lr=0.01)))
    resumed = _fresh(lambda params: wrapper(torch.optim.AdamW(params, lr=0.5)))
    load_state_payload(resumed, _payload(written))
    assert resumed.optimizer.param_groups[0]["lr"] == 0.01
    assert torch.equal(_step(resumed), _step(written))  # the first step after the resume, as if never stopped
    assert [vars(c).get("step") for c in wrapper.__mro__] == steps and not hasattr(wrapper.step, "hooked")


def test_the_probe_never_patches_a_class_that_torch_never_initialised():
    class Lazy(torch.optim.AdamW):
        """An AdamW that takes over another one's attributes instead of running ``Optimizer.__init__``."""

        def __init__(self, inner: torch.optim.Optimizer) -> None:
            vars(self).update(vars(inner))

        def step(self, closure=None):
            return super().step(closure)

    steps = [vars(c).get("step") for c in Lazy.__mro__]
    live = _fresh(lambda params: Lazy(torch.optim.AdamW(params, lr=0.01))).optimizer
    sgd = state_payload(_trained(lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)))["optimizer"]
    with pytest.raises(OptimizerMismatch, match="lack 'betas', 'eps' that Lazy needs"):  # still checked
        check_optimizer("optimizer", live, sgd["param_groups"], "SGD", sgd["state"])
    adamw = state_payload(_trained(lambda params: torch.optim.AdamW(params, lr=0.01)))["optimizer"]
    check_optimizer("optimizer", live, adamw["param_groups"], "AdamW", adamw["state"])
    # (torch's own load_state_dict patches it, as it always did: the check must not do so before the load)
    assert [vars(c).get("step") for c in Lazy.__mro__] == steps and not hasattr(Lazy.step, "hooked")


def test_the_probe_changes_nothing_of_the_live_optimizer():
    class Busy(torch.optim.SGD):
        """Counts its loads in containers of its own, and migrates AdamW's groups in a load_state_dict pre-hook that
        also writes to the optimizer it is given."""

        def __init__(self, params) -> None:
            super().__init__(params, lr=0.1, momentum=0.9)
            self.loads, self.seen = [], {"loads": 0}
            self.register_load_state_dict_pre_hook(self.migrate)

        @staticmethod
        def migrate(optimizer, state_dict):
            optimizer.param_groups[0]["lr"] = optimizer.defaults["lr"] = 99.0
            optimizer.hooked = True
            for group in state_dict["param_groups"]:
                group.setdefault("momentum", 0.9)
                group.setdefault("dampening", 0)

        def __setstate__(self, state) -> None:
            super().__setstate__(state)
            self.loads.append("loaded")
            self.seen["loads"] += 1

    live = _fresh(Busy).optimizer
    saved = state_payload(_trained(lambda params: torch.optim.AdamW(params, lr=0.01)))["optimizer"]
    groups, before = live.param_groups, [dict(g) for g in live.param_groups]
    check_optimizer("optimizer", live, saved["param_groups"], saved["optimizer_class"], saved["state"])
    assert live.param_groups is groups and [dict(g) for g in groups] == before and live.defaults["lr"] == 0.1
    assert live.loads == [] and live.seen == {"loads": 0} and not hasattr(live, "hooked")
    assert "betas" in saved["param_groups"][0] and "momentum" not in saved["param_groups"][0]  # the checkpoint too


class MySGD(torch.optim.Optimizer):
    """A user's optimizer, version 1."""

    def __init__(self, params, lr: float = 0.1) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            clip = group.get("clip")  # version 2's hyperparameter: groups without it still step
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad if clip is None else p.grad.clamp(-clip, clip), alpha=-group["lr"])


class MySGD2(MySGD):
    """Version 2 of the same optimizer: it gained an optional ``clip``."""

    def __init__(self, params, lr: float = 0.1, clip: float | None = None) -> None:
        torch.optim.Optimizer.__init__(self, params, {"lr": lr, "clip": clip})


MySGD2.__name__ = MySGD2.__qualname__ = "MySGD"  # the same class, upgraded


class ClipSGD(torch.optim.SGD):
    """torch's SGD that gained an optional ``clip`` of the user's, clipping before SGD's own step."""

    def __init__(self, params, lr: float = 0.1, clip: float | None = None) -> None:
        super().__init__(params, lr=lr, momentum=0.9)
        self.defaults["clip"] = clip
        for group in self.param_groups:
            group.setdefault("clip", clip)

    def step(self, closure=None):
        for group in self.param_groups:
            if group.get("clip") is not None:
                torch.nn.utils.clip_grad_value_(group["params"], group["clip"])
        return super().step(closure)


@pytest.mark.parametrize(("old", "new"), [(MySGD, MySGD2),
                                          (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), ClipSGD)])
def test_an_optimizer_that_gained_an_optional_hyperparameter_resumes(old, new):
    written, resumed = _trained(old), _fresh(new)
    payload = _payload(written)
    assert "clip" not in payload["optimizer"]["param_groups"][0]
    load_state_payload(resumed, payload)
    assert torch.equal(resumed.model.weight, written.model.weight)
    assert torch.equal(_step(resumed), _step(written))


def _migrating_sgd(params) -> torch.optim.SGD:
    """An SGD resuming AdamW's checkpoint on purpose, its groups migrated by torch's documented pre-hook."""
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)

    def migrate(_optimizer, state_dict):
        groups = [{**g, "momentum": 0.9, "dampening": 0} for g in state_dict["param_groups"]]
        return {**state_dict, "param_groups": groups}

    optimizer.register_load_state_dict_pre_hook(migrate)
    return optimizer


class MigratingSGD(torch.optim.SGD):
    """The same migration in a ``load_state_dict`` of its own."""

    def __init__(self, params) -> None:
        super().__init__(params, lr=0.1, momentum=0.9)

    def load_state_dict(self, state_dict) -> None:
        for group in state_dict["param_groups"]:
            group.setdefault("momentum", 0.9)
            group.setdefault("dampening", 0)
        super().load_state_dict(state_dict)


@pytest.mark.parametrize("live", [_migrating_sgd, MigratingSGD])
def test_a_migration_torch_runs_at_the_load_is_honoured(live):
    written = _trained(lambda params: torch.optim.AdamW(params, lr=0.01))
    plain = _fresh(live)
    plain.model.load_state_dict(written.model.state_dict())
    plain.optimizer.load_state_dict({k: v for k, v in _payload(written)["optimizer"].items() if k != "optimizer_class"})
    expected = _step(plain)  # plain torch loads and steps it
    resumed = _fresh(live)
    load_state_payload(resumed, _payload(written))
    assert torch.equal(_step(resumed), expected)


def test_a_pre_hook_that_does_not_fill_the_keys_is_refused_all_the_same():
    live = torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1, momentum=0.9)
    live.register_load_state_dict_pre_hook(lambda optimizer, state_dict: None)
    saved = state_payload(_trained(lambda params: torch.optim.AdamW(params)))["optimizer"]["param_groups"]
    assert lacking(live, saved) == ["momentum", "dampening"]
    failing = torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1, momentum=0.9)
    failing.register_load_state_dict_pre_hook(lambda optimizer, state_dict: state_dict["state"][0]["nothing"])
    assert lacking(failing, saved) == []  # a hook that fails on the probe: not checked, torch loads as it did


def test_a_sharded_optimizer_migrated_by_a_pre_hook_resumes(tmp_path):
    written = _written(tmp_path)
    resumed = _sharded(_Net(), "SGD")
    resumed.optimizer.register_load_state_dict_pre_hook(
        lambda optimizer, state_dict: [g.update(momentum=0.9, dampening=0) for g in state_dict["param_groups"]] and None)
    assert _checkpoints(tmp_path, _ctx()).load_latest(resumed).step == 2
    assert torch.equal(_everything(resumed)["trunk.0.weight"], _everything(written)["trunk.0.weight"])
    resumed.model(torch.randn(3, 6)).sum().backward()
    resumed.optimizer.step()


class TaggedAdamW(torch.optim.AdamW):
    """An AdamW whose groups carry a setting of the user's that may be an empty dict (DCP's metadata drops those)."""

    def __init__(self, params, lr: float = 0.01, weight_decay: float = 0.1, options: dict | None = None) -> None:
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        self.defaults["options"] = {} if options is None else options
        for group in self.param_groups:
            group["options"] = dict(self.defaults["options"])


def _tagged(seed: int):
    hvd.init()
    torch.manual_seed(seed)
    model = _Net()
    hvd.shard(model, modules=[model.trunk[0], model.trunk[2], model.aux])
    return hvd.elastic.TorchState(model, hvd.DistributedOptimizer(TaggedAdamW(model.parameters())), step=0)


def test_a_sharded_optimizer_with_an_empty_dict_setting_resumes(tmp_path, capsys):
    written = _tagged(0)
    _train(written, 2)
    ctx = _ctx()
    ctx.ledger.commit_seq = 2
    assert _checkpoints(tmp_path, ctx).finish(written) is None
    resumed = _tagged(7)
    assert _checkpoints(tmp_path, _ctx()).load_latest(resumed).step == 2
    assert _same(_everything(resumed), _everything(written))
    _train(resumed, 1)
    # and torch's own hyperparameters are still required of it: SGD's checkpoint lacks AdamW's
    sgd = tmp_path / "sgd"
    sgd.mkdir()
    written_sgd = _sharded(_Net(), "SGD")
    _train(written_sgd, 2)
    ctx = _ctx()
    ctx.ledger.commit_seq = 2
    assert _checkpoints(sgd, ctx).finish(written_sgd) is None
    _ends_saying(sgd, capsys, _tagged(3), "optimizer: saved by SGD, whose param groups lack 'betas', 'eps' that "
                 "TaggedAdamW needs", _OPTIMIZER)


def _halve_momentum(_optimizer, state_dict) -> None:
    """A migration torch allows: change the saved state in place."""
    for saved in state_dict["state"].values():
        saved["momentum_buffer"].mul_(0.5)


def test_a_pre_hook_that_changes_the_saved_state_in_place_runs_once():
    """rvM F1: the probe ran the pre-hooks on the checkpoint's own tensors and the load ran them again, so the
    momentum was halved twice and training went on from a wrong state, without a word."""
    build = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)  # noqa: E731
    payload = _payload(_trained(build))
    halved = payload["optimizer"]["state"][0]["momentum_buffer"] * 0.5
    resumed = _fresh(build)
    resumed.optimizer.register_load_state_dict_pre_hook(_halve_momentum)
    load_state_payload(resumed, payload)
    assert torch.equal(resumed.optimizer.state_dict()["state"][0]["momentum_buffer"], halved)


def test_a_pre_hook_that_reads_a_saved_value_does_not_hide_another_optimizers_sharded_checkpoint(tmp_path, capsys):
    """rvM F4: DCP's metadata gives the saved groups' keys alone; the probe's groups held None, so a hook computing a
    key from a value failed on it and AdamW's sharded checkpoint was not checked: SGD's KeyError at step 1."""
    _written(tmp_path)
    resumed = _sharded(_Net(), "SGD")
    resumed.optimizer.register_load_state_dict_pre_hook(
        lambda optimizer, state_dict: [g.setdefault("clip", 10 * g["lr"]) for g in state_dict["param_groups"]] and None)
    _ends_saying(tmp_path, capsys, resumed,
                 "optimizer: saved by AdamW, whose param groups lack 'momentum', 'dampening' that SGD needs", _OPTIMIZER)
