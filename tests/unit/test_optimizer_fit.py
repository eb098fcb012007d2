"""An optimizer's checkpoint is refused for what its next step reads, not for its class's name (review s57 rvE).

F1: a resume with a subclass of the optimizer that wrote the checkpoint (``LoggingAdamW`` for AdamW), or Adam for
AdamW, was refused 'optimizer: saved by AdamW, this is LoggingAdamW ... resume with the same model', though both load
and step (and did before checkpoints named classes). F2: another optimizer that happens to be called ``AdamW`` (a
momentum SGD) passed the name check and failed at its first step, ``KeyError: 'momentum'``. Now the saved param
groups, filled in as torch's ``load_state_dict`` fills them, must hold each hyperparameter of the torch optimizer the
live one is or subclasses (its ``defaults`` that its groups hold); the recorded class only names the writer, and the
remedy names the optimizer. Replicated payloads here; sharded ones in ``test_checkpoint_mismatch_kinds``; what the
check may not do (change anything, refuse what torch loads and steps) in ``test_optimizer_fit_probe``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cloud_elastic.checkpoint import CheckpointMismatch, load_state_payload, state_payload
from cloud_elastic.checkpoint.api import CheckpointMismatch as ApiMismatch
from cloud_elastic.checkpoint.dcp import saved_groups
from cloud_elastic.checkpoint.optimizer_fit import OPTIMIZER_CLASS, OptimizerMismatch, check_optimizer, lacking
from cloud_elastic.worker.durable.failure import mismatch
from tests.unit.test_durable_failures import _State

pytestmark = pytest.mark.timeout(60)


class LoggingAdamW(torch.optim.AdamW):
    """A user's AdamW that counts its steps: the same param groups and state."""

    def step(self, closure=None):
        self.n = getattr(self, "n", 0) + 1
        return super().step(closure)


class AdamW(torch.optim.SGD):
    """Another optimizer called AdamW (bitsandbytes has one): here a momentum SGD."""

    def __init__(self, params, lr: float = 0.01) -> None:
        super().__init__(params, lr=lr, momentum=0.9)


def _trained(cls, **kwargs) -> _State:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = cls(model.parameters(), lr=0.01, **kwargs)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return _State(model=model, optimizer=optimizer)


def _fresh(cls, **kwargs) -> _State:
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    return _State(model=model, optimizer=cls(model.parameters(), lr=0.5, **kwargs))


def _steps(state: _State) -> None:
    state.model(torch.ones(2, 4)).sum().backward()
    state.optimizer.step()


@pytest.mark.parametrize(("saved", "live"), [(torch.optim.AdamW, LoggingAdamW), (torch.optim.Adam, torch.optim.AdamW),
                                             (LoggingAdamW, torch.optim.AdamW), (torch.optim.AdamW, torch.optim.Adam)])
def test_another_class_with_the_same_keys_loads_and_steps(saved, live):
    written, resumed = _trained(saved), _fresh(live)
    load_state_payload(resumed, state_payload(written))
    assert resumed.optimizer.param_groups[0]["lr"] == 0.01
    assert torch.equal(resumed.model.weight, written.model.weight)
    _steps(resumed)


def test_another_optimizer_of_the_same_name_is_refused_naming_its_module():
    written, resumed = _trained(torch.optim.AdamW), _fresh(AdamW)
    weight = resumed.model.weight.detach().clone()
    with pytest.raises(OptimizerMismatch) as refused:
        load_state_payload(resumed, state_payload(written))
    assert refused.value.first == ("optimizer: saved by AdamW, whose param groups lack 'momentum', 'dampening' that "
                                   f"this AdamW ({__name__}.AdamW) needs")
    assert torch.equal(resumed.model.weight, weight) and resumed.optimizer.param_groups[0]["momentum"] == 0.9
    _steps(resumed)  # untouched: still the optimizer it was


def test_a_checkpoint_without_the_class_is_checked_all_the_same():
    payload = state_payload(_trained(torch.optim.AdamW))
    del payload["optimizer"][OPTIMIZER_CLASS]
    with pytest.raises(CheckpointMismatch) as refused:
        load_state_payload(_fresh(torch.optim.SGD, momentum=0.9), payload)
    assert refused.value.first == "optimizer: its saved param groups lack 'momentum', 'dampening' that SGD needs"
    same = _fresh(torch.optim.AdamW)
    load_state_payload(same, payload)  # and the same optimizer loads as it did
    _steps(same)


@pytest.mark.parametrize(("cls", "added_since"), [
    (torch.optim.AdamW, ["amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
                         "decoupled_weight_decay"]),
    (torch.optim.SGD, ["nesterov", "maximize", "foreach", "differentiable", "fused"])])
def test_groups_of_an_older_torch_that_load_fills_in_are_no_mismatch(cls, added_since):
    kwargs = {"momentum": 0.9} if cls is torch.optim.SGD else {}
    payload = state_payload(_trained(cls, **kwargs))
    for group in payload["optimizer"]["param_groups"]:
        for key in added_since:
            del group[key]
    resumed = _fresh(cls, **kwargs)
    load_state_payload(resumed, payload)
    _steps(resumed)


def test_the_probe_leaves_the_live_optimizer_alone():
    live = _fresh(torch.optim.SGD, momentum=0.9).optimizer
    groups, defaults = live.param_groups, dict(live.defaults)
    saved = state_payload(_trained(torch.optim.AdamW))["optimizer"]["param_groups"]
    assert lacking(live, [list(g) for g in saved]) == ["momentum", "dampening"]
    assert live.param_groups is groups and live.defaults == defaults and "betas" not in groups[0]


def test_a_class_that_cannot_be_probed_is_not_checked():
    class Picky(torch.optim.SGD):
        def __setstate__(self, state):
            super().__setstate__(state)
            self.own_setting.touch()  # an attribute of its own that a probe lacks

    live = _fresh(Picky, momentum=0.9).optimizer
    assert lacking(live, [["lr"]]) == []
    check_optimizer("optimizer", live, [{"lr": 0.1}], "AdamW")  # loads as before checkpoints named optimizers


def test_groups_of_another_form_are_left_to_the_load():
    live = _fresh(torch.optim.SGD).optimizer
    for groups in (None, "groups", [1, 2], {"0": {}}):
        check_optimizer("optimizer", live, groups, "AdamW")
    assert lacking(live, []) == []


def test_the_mismatch_line_says_which_remedy():
    optimizer = mismatch(OptimizerMismatch("optimizer: its saved param groups lack 'momentum' that SGD needs"),
                         "s3://b/ck", 7)
    assert str(optimizer) == ("the checkpoint in s3://b/ck (commit #7) does not fit this training state (optimizer: "
                              "its saved param groups lack 'momentum' that SGD needs): resume with the optimizer that "
                              "wrote it, or use a fresh --checkpoint-dir (training from the start)")
    model = mismatch(ApiMismatch("model: size mismatch for weight"), "s3://b/ck", 7)
    assert str(model).endswith("(model: size mismatch for weight): resume with the same model, or use a fresh "
                               "--checkpoint-dir (training from the start)")
    assert optimizer.failure == model.failure == "mismatch"


def test_saved_groups_are_read_from_dcp_metadata_alone():
    keys = ["optimizer.param_groups.0.lr", "optimizer.param_groups.0.betas", "optimizer.param_groups.0.params",
            "optimizer.param_groups.1.lr", "optimizer.state.trunk.0.weight.exp_avg", "model.trunk.0.weight",
            "optimizer.param_groups.x.lr", "other.param_groups.0.momentum", "optimizer.param_groups.1.nested.deep"]
    metadata = SimpleNamespace(state_dict_metadata=dict.fromkeys(keys))
    assert saved_groups("optimizer", metadata) == [{"lr", "betas", "params"}, {"lr", "nested"}]
    assert saved_groups("other", metadata) == [{"momentum"}]
    assert saved_groups("missing", metadata) == []


def test_a_default_the_optimizers_own_groups_lack_is_not_required():
    class Tagged(torch.optim.AdamW):
        def __init__(self, params, lr: float = 0.01) -> None:
            super().__init__(params, lr=lr)
            self.defaults["tag"] = "added after its groups were built"

    payload = state_payload(_trained(Tagged))
    resumed = _fresh(Tagged)
    load_state_payload(resumed, payload)
    _steps(resumed)


def _embedding(build) -> _State:
    torch.manual_seed(0)
    model = torch.nn.Embedding(5, 3, sparse=build is torch.optim.SparseAdam)
    return _State(model=model, optimizer=build(model.parameters()))


def _embedding_steps(state: _State) -> None:
    state.optimizer.zero_grad()
    state.model(torch.tensor([1, 2])).sum().backward()
    state.optimizer.step()


@pytest.mark.parametrize(("cls", "key"), [(torch.optim.SparseAdam, "maximize"),
                                          (torch.optim.Adagrad, "initial_accumulator_value"), (torch.optim.Rprop, "lr")])
def test_a_hyperparameter_torchs_step_does_not_read_may_be_missing(cls, key):
    """rvM F5: every ``__init__`` keyword counted as read by the step, so a checkpoint that torch loads and steps
    (SparseAdam's groups from a torch before ``maximize``) was refused. Rprop's ``lr`` sets up a parameter's state:
    it is needed where the saved state lacks a parameter, and there torch's step fails without it."""
    written = _embedding(cls)
    _embedding_steps(written)
    payload = state_payload(written)
    for group in payload["optimizer"]["param_groups"]:
        del group[key]
    resumed = _embedding(cls)
    load_state_payload(resumed, payload)
    _embedding_steps(resumed)
    if cls is torch.optim.Rprop:
        groups = payload["optimizer"]["param_groups"]
        assert lacking(_embedding(cls).optimizer, groups, {}) == ["lr"]
        resumed.optimizer.load_state_dict({"state": {}, "param_groups": groups})
        with pytest.raises(KeyError, match="lr"):
            _embedding_steps(resumed)
