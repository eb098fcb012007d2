"""Mismatches a checkpoint's load let through or told as something else (review s57 rvB):

* a SHARDED model with a layer removed resumed from the old model's checkpoint and "succeeded" (DCP reads only what
  its target names: the checkpoint's extra items were never looked at); a replicated one was refused;
* an ``ElasticSampler`` of another dataset ended "training state lost" (its ValueError was not in the payload's list
  of torch's mismatch texts), where it had said "does not fit this training state (sampler: ...)";
* another optimizer (AdamW, then SGD) loaded AdamW's param groups into SGD, whose first step then failed with
  ``KeyError: 'momentum'`` on every worker, three times, and the host was blacklisted.

Each now ends the job in the one ``mismatch`` line, the checkpoint left as it was. An optimizer is refused for the
keys its step reads that the saved param groups lack, not for its class's name (review s57 rvE F1, F2: a subclass
of AdamW was refused, an SGD named AdamW passed): ``test_optimizer_fit``. A checkpoint written before the optimizer's
class was recorded loads as before. One standalone process, as ``test_sharded_resume``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic.checkpoint import CheckpointMismatch, load_state_payload, state_payload
from cloud_elastic.checkpoint.api import StateDictMismatch
from cloud_elastic.checkpoint.payload import OPTIMIZER_CLASS
from cloud_elastic.worker import elastic
from cloud_elastic.worker.sampler import ElasticSampler
from tests.unit.test_durable_failures import _State
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx
from tests.unit.test_sharded_resume import _everything, _same, _state, _written

pytestmark = pytest.mark.timeout(90)


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


class _NoAux(torch.nn.Module):
    """``test_sharded_resume._Net`` with its auxiliary head removed."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk(x)


class LoggingAdamW(torch.optim.AdamW):
    """A user's AdamW that counts its steps: the same param groups and state."""


class AdamW(torch.optim.SGD):
    """Another optimizer that happens to be called AdamW (momentum SGD)."""

    def __init__(self, params, lr: float = 0.01, weight_decay: float = 0.0) -> None:  # DistributedOptimizer: params
        super().__init__(params, lr=lr, momentum=0.9, weight_decay=weight_decay)


def _sharded(model: torch.nn.Module, optimizer: str = "AdamW"):
    hvd.init()
    hvd.shard(model, modules=[m for m in model.modules() if isinstance(m, torch.nn.Linear)])
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if optimizer == "SGD" \
        else {"AdamW": torch.optim.AdamW, "LoggingAdamW": LoggingAdamW, "Adam": torch.optim.Adam,
              "SameName": AdamW}[optimizer](model.parameters(), lr=0.01, weight_decay=0.1)
    return hvd.elastic.TorchState(model, hvd.DistributedOptimizer(inner), step=0)


def _ends_saying(tmp_path, capsys, resumed, first: str, remedy: str = "resume with the same model") -> None:
    """Loading ``resumed`` from ``tmp_path``'s checkpoint ends the worker with the one mismatch line naming
    ``first``; nothing in the directory changed."""
    url = str(tmp_path / "ckpt")
    before = _files(tmp_path / "ckpt")
    ctx = _ctx()
    with pytest.raises(SystemExit) as exited:
        elastic._load_checkpoint(ctx, _checkpoints(tmp_path, ctx), resumed)
    line = (f"the checkpoint in {url} (commit #2) does not fit this training state ({first}): {remedy}, or use a "
            "fresh --checkpoint-dir (training from the start)")
    assert exited.value.code == 1
    assert capsys.readouterr().err.splitlines() == [f"cloud-elastic: {line}"]
    assert ctx.reports == [("failed", {"failure": "mismatch", "reason": line})]
    assert _files(tmp_path / "ckpt") == before
    assert resumed.step == 0


def test_a_sharded_model_with_a_layer_removed_is_refused_naming_the_checkpoints_extra_item(tmp_path, capsys):
    _written(tmp_path)  # a trunk and an auxiliary head (no gradient: no optimizer state for it)
    _ends_saying(tmp_path, capsys, _sharded(_NoAux()), "Unexpected key in checkpoint: model.aux.bias (and 1 more)")


def test_a_sharded_model_without_a_layer_that_had_optimizer_state_is_refused_too(tmp_path, capsys):
    _written(tmp_path)
    model = _NoAux()
    model.trunk = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU())  # its last Linear, trained, gone
    model.aux = torch.nn.Linear(16, 3)
    _ends_saying(tmp_path, capsys, _sharded(model), "Unexpected key in checkpoint: model.trunk.2.bias (and 7 more)")


_OPTIMIZER = "resume with the optimizer that wrote it"


def test_a_sharded_optimizer_whose_groups_lack_its_keys_is_refused_naming_the_keys_and_both(tmp_path, capsys):
    from tests.unit.test_sharded_resume import _Net

    _written(tmp_path)
    line = "optimizer: saved by AdamW, whose param groups lack 'momentum', 'dampening' that SGD needs"
    _ends_saying(tmp_path, capsys, _sharded(_Net(), "SGD"), line, _OPTIMIZER)


def test_another_sharded_optimizer_of_the_same_name_is_refused_too(tmp_path, capsys):
    from tests.unit.test_sharded_resume import _Net

    _written(tmp_path)
    _ends_saying(tmp_path, capsys, _sharded(_Net(), "SameName"),
                 "optimizer: saved by AdamW, whose param groups lack 'momentum', 'dampening' that this AdamW "
                 f"({__name__}.AdamW) needs", _OPTIMIZER)


@pytest.mark.parametrize("optimizer", ["LoggingAdamW", "Adam"])
def test_a_sharded_optimizer_of_another_class_with_the_same_keys_resumes(tmp_path, optimizer):
    from tests.unit.test_sharded_resume import _Net

    written = _written(tmp_path)
    resumed = _sharded(_Net(), optimizer)
    assert _checkpoints(tmp_path, _ctx()).load_latest(resumed).step == 2
    assert _same(_everything(resumed), _everything(written))
    resumed.model(torch.randn(3, 6)).sum().backward()
    resumed.optimizer.step()  # the first step after the resume reads every key it needs


def test_a_sharded_checkpoint_from_before_optimizer_classes_still_loads(tmp_path, capsys):
    written = _written(tmp_path)
    [manifest] = (tmp_path / "ckpt").glob("ckpt-*/manifest.json")
    body = json.loads(manifest.read_text())
    assert body["extra"].pop("optimizer_classes") == {"optimizer": "AdamW"}
    manifest.write_text(json.dumps(body))
    resumed = _state(seed=7)
    assert _checkpoints(tmp_path, _ctx()).load_latest(resumed).step == 2
    assert _same(_everything(resumed), _everything(written))

    from tests.unit.test_sharded_resume import _Net  # and another optimizer is refused all the same, unnamed

    _ends_saying(tmp_path, capsys, _sharded(_Net(), "SGD"),
                 "optimizer: its saved param groups lack 'momentum', 'dampening' that SGD needs", _OPTIMIZER)


def test_a_replicated_optimizer_whose_groups_lack_its_keys_is_refused_before_anything_is_loaded():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    adamw = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(2, 4)).sum().backward()
    adamw.step()
    payload = state_payload(_State(model=model, optimizer=adamw))
    assert payload["optimizer"][OPTIMIZER_CLASS] == "AdamW"
    plain = torch.optim.AdamW(model.parameters(), lr=0.5)
    plain.load_state_dict(payload["optimizer"])  # the entry still loads with plain torch
    assert plain.param_groups[0]["lr"] == 0.01

    other = torch.nn.Linear(4, 1)
    weight = other.weight.detach().clone()
    state = _State(model=other, optimizer=torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9))
    with pytest.raises(CheckpointMismatch) as mismatch:
        load_state_payload(state, payload)
    assert mismatch.value.first == "optimizer: saved by AdamW, whose param groups lack 'momentum', 'dampening' that " \
                                   "SGD needs"
    assert torch.equal(other.weight, weight) and "momentum" in state.optimizer.param_groups[0]

    del payload["optimizer"][OPTIMIZER_CLASS]  # written before the class was recorded: loads as it did
    same = _State(model=torch.nn.Linear(4, 1), optimizer=None)
    same.optimizer = torch.optim.AdamW(same.model.parameters(), lr=0.5)
    load_state_payload(same, payload)
    assert same.optimizer.param_groups[0]["lr"] == 0.01 and torch.equal(same.model.weight, model.weight)


def test_a_sampler_of_another_dataset_is_a_mismatch_not_a_failed_load(monkeypatch):
    from types import SimpleNamespace

    import cloud_elastic.worker.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "get_context",
                        lambda: SimpleNamespace(info=SimpleNamespace(size=1, rank=0), standalone=True))
    saved = ElasticSampler(list(range(100)), seed=3)
    saved.reset()
    payload = state_payload(_State(sampler=saved, step=4))
    live = ElasticSampler(list(range(120)), seed=3)
    live.reset()
    state = _State(sampler=live, step=0)
    with pytest.raises(CheckpointMismatch) as mismatch:
        load_state_payload(state, payload)
    assert mismatch.value.first == ("sampler: ElasticSampler state is for (size, seed, shuffle) = (100, 3, True), "
                                    "this sampler has (120, 3, True)")
    assert state.step == 0
    with pytest.raises(ValueError):  # still a ValueError to a caller of the sampler's own load_state_dict
        live.load_state_dict(saved.state_dict())
    assert issubclass(StateDictMismatch, ValueError) and live.epoch == 0
