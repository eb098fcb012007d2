"""Replacing a model or an optimizer held by a ``TorchState`` (``state.optimizer = new``).

Horovod's ``set_value`` semantics: the new object's value at the assignment is
its part of the commit; the others keep their last commit. Before, a replaced
optimizer left the commit bound to the old one's step: a kept commit waited for
copies no step made, and a restore gave neither the committed model nor the
committed optimizer state while the worker still said it held the commit.
Standalone mode (rank 0 of 1) runs the same commit code as a distributed worker.
"""

from __future__ import annotations

import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context
from tests.unit.test_in_place_commit import _backward, _step  # the same batches and loss

pytestmark = pytest.mark.timeout(90)

OPTIMIZERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _values(state) -> list[torch.Tensor]:
    out = [t.detach().clone() for t in state.model.state_dict().values()]
    for p in state.model.parameters():
        out += [v.clone() for _, v in sorted(state.optimizer.state[p].items())]
    return out


def _assert_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def _distributed(name: str, model: torch.nn.Module):
    return hvd.DistributedOptimizer(OPTIMIZERS[name](model.parameters()))


def _train(state, seeds: range) -> None:
    for seed in seeds:
        _step(state.model, state.optimizer, seed)
        state.commit()


@pytest.mark.commit_mode("snapshot")
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_replaced_optimizer_restores_the_last_commit_exactly(name):
    model = _model()
    old = _distributed(name, model)
    state = hvd.elastic.TorchState(model, old, step=0)
    _train(state, range(3))
    state.optimizer = _distributed(name, model)  # e.g. a new learning-rate schedule
    _train(state, range(3, 6))
    committed = _values(state)
    _step(state.model, state.optimizer, 9)
    _step(state.model, state.optimizer, 10)  # two steps since the commit; then a peer fails
    state.restore()
    assert get_context().ledger.holds_commit
    _assert_equal(_values(state), committed)


@pytest.mark.commit_mode("snapshot")
def test_a_replaced_model_and_optimizer_restore_the_last_commit_exactly():
    model = _model()
    state = hvd.elastic.TorchState(model, _distributed("adamw", model), step=0)
    _train(state, range(3))
    new = _model()
    new.load_state_dict(state.model.state_dict())
    state.model = new
    state.optimizer = _distributed("adamw", new)
    _train(state, range(3, 5))
    committed = _values(state)
    _step(state.model, state.optimizer, 9)
    state.restore()
    assert get_context().ledger.holds_commit
    _assert_equal(_values(state), committed)


def test_an_optimizer_replaced_in_the_common_loop_restores_exactly_after_a_failure_before_the_update():
    """Commits kept in place (nothing copied): the new optimizer's step is the one that marks them changed."""
    model = _model()
    state = hvd.elastic.TorchState(model, _distributed("adamw", model), step=0)
    _train(state, range(3))
    state.optimizer = _distributed("adamw", model)
    _train(state, range(3, 6))
    assert state._handlers["model"].in_place and state._handlers["optimizer"].in_place
    committed = _values(state)
    _backward(state.model, state.optimizer, 9)  # the gradient allreduce fails: the update never ran
    state.restore()
    assert get_context().ledger.holds_commit
    _assert_equal(_values(state), committed)
    _step(state.model, state.optimizer, 10)  # an update in place, then a failure: said, not hidden
    state.restore()
    assert not get_context().ledger.holds_commit


@pytest.mark.commit_mode("snapshot")
def test_the_replaced_objects_value_at_the_assignment_is_its_commit():
    model = _model()
    state = hvd.elastic.TorchState(model, _distributed("sgd-momentum", model), step=0)
    _train(state, range(3))
    model_committed = [t.clone() for t in model.state_dict().values()]
    _step(model, state.optimizer, 3)  # a step after the last commit, then the optimizer is replaced
    fresh = _distributed("sgd-momentum", model)
    state.optimizer = fresh
    _step(model, fresh, 4)
    state.restore()
    _assert_equal(list(model.state_dict().values()), model_committed)
    assert all(not fresh.state[p] for p in model.parameters())  # fresh, as it was when assigned


def test_replacing_a_model_by_something_else_is_a_clear_error():
    model = _model()
    state = hvd.elastic.TorchState(model, _distributed("adamw", model))
    with pytest.raises(TypeError, match="TorchState.model holds a Sequential; it cannot be replaced by a dict"):
        state.model = {"weight": torch.zeros(1)}
    assert state.model is model
