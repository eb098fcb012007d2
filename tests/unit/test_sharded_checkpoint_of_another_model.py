"""A ``--checkpoint-dir`` reused with a changed SHARDED model (``hvd.shard``) says so, as a replicated one does
(review s56 rv6 d5_shard.sh: width 64, then width 32, ended "failed: training state lost: cannot resume from the
checkpoint: the shards of ... do not fit this state: Size mismatch ..."); and a load that fails for another
reason (out of memory, I/O) is never told as another model, with its advice to use a fresh --checkpoint-dir.

One standalone process (one host of one worker), as ``test_sharded_resume``.
"""

from __future__ import annotations

import pytest
import torch

from cloud_elastic.checkpoint import CheckpointMismatch, load_state_payload, state_payload
from cloud_elastic.errors import CheckpointError
from cloud_elastic.protocol_reports import CheckpointReport
from cloud_elastic.worker import elastic
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx
from tests.unit.test_sharded_resume import _same, _state, _written

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("changed, first", [
    (dict(width=8), "Size mismatch between saved torch.Size([16, 6]) and current: torch.Size([8, 6]) for "
                    "model.trunk.0.weight"),
    (dict(extra=True), "Missing key in checkpoint state_dict: model.extra.weight"),
])
def test_a_sharded_checkpoint_of_another_model_ends_the_job_saying_so(tmp_path, capsys, changed, first):
    _written(tmp_path)
    url = str(tmp_path / "ckpt")
    before = sorted((p.name, p.stat().st_size) for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    resumed = _state(**changed)
    initial = {name: p.to_local().clone() for name, p in resumed.model.named_parameters()}
    ctx = _ctx()
    with pytest.raises(SystemExit) as exited:
        elastic._load_checkpoint(ctx, _checkpoints(tmp_path, ctx), resumed)
    line = (f"the checkpoint in {url} (commit #2) does not fit this training state ({first}): resume with the "
            "same model, or use a fresh --checkpoint-dir (training from the start)")
    assert exited.value.code == 1
    assert capsys.readouterr().err.splitlines() == [f"cloud-elastic: {line}"]
    assert ctx.reports == [("failed", {"failure": "mismatch", "reason": line})]
    assert CheckpointReport.from_wire({"event": "failed", **ctx.reports[0][1]}).ending() == line
    assert sorted((p.name, p.stat().st_size) for p in (tmp_path / "ckpt").rglob("*") if p.is_file()) == before
    now = {name: p.to_local() for name, p in resumed.model.named_parameters()}
    assert _same(now, initial) and resumed.step == 0  # back at its last commit


def test_a_sharded_load_that_fails_for_another_reason_is_not_called_another_model(tmp_path, monkeypatch):
    import cloud_elastic.worker.durable.sharded as sharded_checkpoints

    _written(tmp_path)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(sharded_checkpoints, "set_parts", out_of_memory)
    with pytest.raises(CheckpointError) as raised:
        _checkpoints(tmp_path, _ctx()).load_latest(_state())
    assert not isinstance(raised.value, CheckpointMismatch) and getattr(raised.value, "failure", "load") == "load"
    assert "out of memory" in str(raised.value) and "does not fit" not in str(raised.value)
    assert "do not fit" not in str(raised.value)


class _Holder:
    """A state of one model, as load_state_payload sees it (``restore`` counted)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._restored = 0

    def save(self) -> None:
        pass

    def restore(self) -> None:
        self._restored += 1


class _NoMemory(torch.nn.Linear):
    def load_state_dict(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


class _NoDisk(torch.nn.Linear):
    def load_state_dict(self, *args, **kwargs):
        raise OSError(5, "Input/output error")


@pytest.mark.parametrize("model, says", [(_NoMemory(4, 1), "OutOfMemoryError: CUDA out of memory"),
                                         (_NoDisk(4, 1), "Input/output error")])
def test_a_replicated_load_that_fails_for_another_reason_is_not_called_another_model(model, says):
    payload = state_payload(_Holder(torch.nn.Linear(4, 1)))
    state = _Holder(model)
    with pytest.raises(CheckpointError) as raised:
        load_state_payload(state, payload)
    assert not isinstance(raised.value, CheckpointMismatch)
    assert says in str(raised.value) and "does not fit" not in str(raised.value)
    assert state._restored == 1  # back at its last commit


def test_while_copying_errors_are_not_mismatches_but_a_size_mismatch_among_them_is():
    class _CopyFails(torch.nn.Linear):
        def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
            errors.append('While copying the parameter named "weight", whose dimensions in the model are '
                          "torch.Size([1, 4]) and whose dimensions in the checkpoint are torch.Size([1, 4]), an "
                          "exception occurred : ('CUDA out of memory.',).")

    payload = state_payload(_Holder(torch.nn.Linear(4, 1)))
    with pytest.raises(CheckpointError) as raised:
        load_state_payload(_Holder(_CopyFails(4, 1)), payload)
    assert not isinstance(raised.value, CheckpointMismatch) and "CUDA out of memory" in str(raised.value)

    two = torch.nn.Sequential(_CopyFails(4, 1), torch.nn.Linear(8, 1))
    payload = state_payload(_Holder(torch.nn.Sequential(torch.nn.Linear(4, 1), torch.nn.Linear(4, 1))))
    with pytest.raises(CheckpointMismatch) as mismatch:
        load_state_payload(_Holder(two), payload)
    assert mismatch.value.first.startswith("model: size mismatch for 1.weight: ")
    assert mismatch.value.first.endswith(" (and 1 more)")
