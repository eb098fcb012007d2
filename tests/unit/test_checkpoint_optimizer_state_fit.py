"""An optimizer's saved per-parameter state compared with the parameters it is loaded for (review s63 rvX F3).

torch's ``Optimizer.load_state_dict`` checks neither the shapes nor the dtypes of the saved state: a checkpoint whose
SGD momentum buffers had one element loaded, and every worker's first step then failed (``output with shape [1]
doesn't match the broadcast shape``) at every resume; and it casts each state tensor to its parameter's dtype, so a
bool state shared by four references came out as four float32 copies (a 64 MiB file took 2 GiB). Both are now
refused before anything is loaded, as another optimizer's state is (a clear stop), and every torch optimizer still
resumes its own state. Real files in a temporary directory; real optimizers that have stepped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cloud_elastic.checkpoint import CheckpointMismatch, CheckpointStore, load_state_payload, state_payload
from cloud_elastic.worker.commit.state import TorchState

pytestmark = pytest.mark.timeout(60)


def _trained(make: type, **kwargs) -> TorchState:
    """A model and its optimizer of class ``make`` after two steps (every state set up), as a TorchState."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = make(model.parameters(), **kwargs)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(torch.randn(5, 4)).pow(2).sum()
        loss.backward()
        return loss

    for _ in range(2):
        closure()
        optimizer.step(closure)
    return TorchState(model, optimizer, step=2)


def _resumed(tmp_path: Path, payload: dict, make: type, **kwargs) -> TorchState:
    """A fresh state of the same model and optimizer class, after loading ``payload`` from a real checkpoint."""
    store = CheckpointStore(str(tmp_path / "ckpt"))
    store.save(2, payload)
    fresh = _trained(make, **kwargs)
    load_state_payload(fresh, store.latest().payload)
    return fresh


_TORCH = [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}), (torch.optim.Adam, {"amsgrad": True}),
          (torch.optim.AdamW, {}), (torch.optim.NAdam, {}), (torch.optim.RAdam, {}), (torch.optim.Adamax, {}),
          (torch.optim.Adagrad, {}), (torch.optim.Adadelta, {}), (torch.optim.ASGD, {}),
          (torch.optim.RMSprop, {"momentum": 0.9, "centered": True}), (torch.optim.Rprop, {}),
          (torch.optim.Adafactor, {}), (torch.optim.LBFGS, {"history_size": 3})]


@pytest.mark.parametrize(("make", "kwargs"), _TORCH, ids=[m.__name__ for m, _ in _TORCH])
def test_every_torch_optimizer_resumes_its_own_state(tmp_path: Path, make: type, kwargs: dict) -> None:
    """Adafactor's row and column factors and LBFGS's history (flat vectors under its first parameter) are not of
    the parameters' shapes: each is compared with the shape its own optimizer gives it."""
    state = _trained(make, **kwargs)
    saved = state.optimizer.state_dict()
    fresh = _resumed(tmp_path, state_payload(state), make, **kwargs)
    loaded = fresh.optimizer.state_dict()
    assert loaded["state"].keys() == saved["state"].keys()
    for index, values in saved["state"].items():
        for key, value in values.items():
            assert torch.equal(torch.as_tensor(loaded["state"][index][key]), torch.as_tensor(value)) \
                if not isinstance(value, list) else len(loaded["state"][index][key]) == len(value), (index, key)


def _refused(tmp_path: Path, state: TorchState, payload: dict, make: type, **kwargs) -> str:
    """The CheckpointMismatch of loading ``payload`` into a fresh state, which is left as it was."""
    store = CheckpointStore(str(tmp_path / "ckpt"))
    store.save(3, payload)
    fresh = _trained(make, **kwargs)
    before = {k: v.clone() for k, v in fresh.model.state_dict().items()}
    buffers = {i: {k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)}
               for i, s in fresh.optimizer.state_dict()["state"].items()}
    with pytest.raises(CheckpointMismatch) as refused:
        load_state_payload(fresh, store.latest().payload)
    assert all(torch.equal(before[k], v) for k, v in fresh.model.state_dict().items())
    after = fresh.optimizer.state_dict()["state"]
    assert all(torch.equal(after[i][k], v) for i, s in buffers.items() for k, v in s.items())
    return str(refused.value)


def test_momentum_buffers_of_another_shape_are_refused_before_anything_is_loaded(tmp_path: Path) -> None:
    """Before: loaded, then ``RuntimeError: output with shape [1] doesn't match the broadcast shape [3, 4]`` at the
    first step, on every worker at every resume (rvX's job failed after three tries)."""
    state = _trained(torch.optim.SGD, lr=0.1, momentum=0.9)
    payload = state_payload(state)
    payload["optimizer"]["state"] = {i: {**s, "momentum_buffer": torch.zeros(1)}
                                     for i, s in payload["optimizer"]["state"].items()}
    message = _refused(tmp_path, state, payload, torch.optim.SGD, lr=0.1, momentum=0.9)
    assert "optimizer: the saved 'momentum_buffer' of parameter 0 of group 0 is a tensor of shape [1], its " \
           "parameter's shape is [3, 4]" in message, message


def test_a_step_of_many_numbers_is_refused(tmp_path: Path) -> None:
    """Adam takes ``.item()`` of its step: before, a step of 12 numbers loaded and the first step failed."""
    state = _trained(torch.optim.Adam)
    payload = state_payload(state)
    payload["optimizer"]["state"][1]["step"] = torch.ones(12)
    message = _refused(tmp_path, state, payload, torch.optim.Adam)
    assert "the saved 'step' of parameter 1 of group 0 holds 12 numbers, not one" in message, message


def _swap_factors(state: dict) -> None:
    state["row_var"], state["col_var"] = state["col_var"], state["row_var"]


def _short_history(state: dict) -> None:
    state["old_dirs"] = [torch.zeros(3) for _ in state["old_dirs"]]


def _uneven_history(state: dict) -> None:
    state["ro"] = state["ro"][:1]


_FORGED_OF_THEIR_OWN = {  # before, each loaded; then the first step failed on every worker at every resume
    "Adafactor factors swapped": (torch.optim.Adafactor, {}, _swap_factors,  # "output with shape [1, 4] doesn't..."
                                  "the saved 'row_var' of parameter 0 of group 0 is a tensor of shape [1, 4], not "
                                  "[3, 1] (its parameter's shape is [3, 4])"),
    "LBFGS history of another length": (torch.optim.LBFGS, {"history_size": 3}, _short_history,  # "size of tensor a"
                                        "the saved 'old_dirs' of parameter 0 of group 0 is a tensor of shape [3], not "
                                        "[23] (its group's parameters hold 23 elements)"),
    "LBFGS history of unequal lists": (torch.optim.LBFGS, {"history_size": 3}, _uneven_history,  # IndexError
                                       "the saved history of parameter 0 of group 0 holds lists of unequal lengths"),
}


@pytest.mark.parametrize("forged", list(_FORGED_OF_THEIR_OWN), ids=list(_FORGED_OF_THEIR_OWN))
def test_state_of_adafactor_and_lbfgs_in_other_shapes_is_refused(tmp_path: Path, forged: str) -> None:
    make, kwargs, forge, why = _FORGED_OF_THEIR_OWN[forged]
    state = _trained(make, **kwargs)
    payload = state_payload(state)
    forge(payload["optimizer"]["state"][0])
    message = _refused(tmp_path, state, payload, make, **kwargs)
    assert f"optimizer: {why}" in message and "\n" not in message, message


class _Counting(torch.optim.Optimizer):
    """A user's optimizer of its own (not one of torch's): its state's shapes are its own business."""

    def __init__(self, params) -> None:
        super().__init__(params, {"lr": 0.1})

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["seen"] = torch.zeros(7)  # not the parameter's shape, and fine
                p.data.add_(p.grad, alpha=-group["lr"])


def test_a_state_that_its_cast_to_the_parameters_dtype_would_blow_up_is_refused(tmp_path: Path) -> None:
    """Before: torch's load cast every reference to the bool tensor to float32 on its own (4 x 4 bytes an element
    from 1 byte in the file), past the copy bound the load's check had applied to the file (rvX: 64 MiB -> 2 GiB).
    Here 6 MiB of bools referenced 4 times would be cast to 96 MiB, over 8 times the parameters plus 64 MiB."""
    state = _trained(_Counting)
    fresh = _resumed(tmp_path / "own", state_payload(state), _Counting)  # its own state, of another shape, loads
    assert fresh.optimizer.state_dict()["state"][0]["seen"].shape == (7,)
    payload = state_payload(state)
    bools = torch.zeros(6 << 20, dtype=torch.bool)
    payload["optimizer"]["state"][0]["seen"] = [bools] * 4
    message = _refused(tmp_path, state, payload, _Counting)
    assert "optimizer: its saved state would take more than 67,109," in message and \
           "once cast to its parameters' dtypes (at parameter 0 of group 0), 8 times their size" in message, message
