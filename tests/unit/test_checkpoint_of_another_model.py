"""A ``--checkpoint-dir`` reused with a changed model says so, and keeps the checkpoint: a newcomer's second run
(``Linear(8, 1)`` where ``Linear(4, 1)`` had trained) ended with "training state lost: cannot resume from the
checkpoint: ... size mismatch ...", while both checkpoints were intact on disk.

Now the job's line names the directory, the commit, and the first mismatch, and says what to do; the failed resume
changes no file of the directory and leaves the state at its last commit (never half loaded).
Rank 0's schedule on a fake worker context (its reports recorded); a real directory store.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from cloud_elastic.checkpoint import load_state_payload, state_payload
from cloud_elastic.protocol_reports import CheckpointReport
from cloud_elastic.worker import elastic
from tests.unit.test_durable_failures import _ctx, _record, _schedule, _State

pytestmark = pytest.mark.timeout(60)


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _trained(url: str) -> None:
    """Two checkpoints of a ``Linear(4, 1)``, as the first run left them."""
    torch.manual_seed(0)
    state = _State(model=torch.nn.Linear(4, 1), step=0)
    ctx = _ctx()
    schedule = _schedule(url, ctx)
    for step in (1, 2):
        state.step, ctx.ledger.commit_seq = step, step
        schedule._last = None  # due at every commit
        schedule.after_commit(state)
        assert schedule.stop_writing(30)


def test_a_checkpoint_of_another_model_ends_the_job_saying_so_and_keeps_the_checkpoint(tmp_path, capsys) -> None:
    url = str(tmp_path / "ckpt")
    _record(url)
    _trained(url)
    before = _files(tmp_path / "ckpt")
    assert sum(name.endswith("state.pt") for name in before) == 2

    changed = _State(model=torch.nn.Linear(8, 1), step=0)
    weights = changed.model.weight.detach().clone()
    ctx = _ctx()
    with pytest.raises(SystemExit) as exited:
        elastic._load_checkpoint(ctx, _schedule(url, ctx), changed)
    line = (f"the checkpoint in {url} (commit #2) does not fit this training state (model: size mismatch for "
            "weight: copying a param with shape torch.Size([1, 4]) from checkpoint, the shape in current model is "
            "torch.Size([1, 8])): resume with the same model, or use a fresh --checkpoint-dir (training from the start)")
    assert exited.value.code == 1
    assert capsys.readouterr().err.splitlines() == [f"cloud-elastic: {line}"]
    assert ctx.reports == [("failed", {"failure": "mismatch", "reason": line})]  # ...and the driver ends with it:
    assert CheckpointReport.from_wire({"event": "failed", **ctx.reports[0][1]}).ending() == line
    assert "training state lost" not in line
    assert _files(tmp_path / "ckpt") == before, "the failed resume changed the checkpoint directory"
    assert torch.equal(changed.model.weight, weights) and changed.step == 0


def test_the_first_mismatch_is_named_bounded_with_how_many_more() -> None:
    from cloud_elastic.checkpoint import CheckpointMismatch

    wide = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(300)])
    payload = state_payload(_State(model=wide))
    narrow = _State(model=torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(300)]))
    with pytest.raises(CheckpointMismatch) as mismatch:
        load_state_payload(narrow, payload)
    assert mismatch.value.first.startswith("model: size mismatch for 0.weight: copying a param with shape "
                                           "torch.Size([64, 64]) from checkpoint")
    assert mismatch.value.first.endswith(" (and 599 more)") and len(mismatch.value.first) < 300

    with pytest.raises(CheckpointMismatch, match=r"\(attributes missing: step; unexpected: model\)"):
        load_state_payload(_State(step=0), payload)


def test_a_newest_checkpoint_that_does_not_fit_while_the_one_before_does_is_passed_over(tmp_path, caplog) -> None:
    """The newest state.pt replaced by another model's, its digest fixed (as whoever writes the storage can, or a
    second job writing another model into the directory): the job resumes from the checkpoint before it, which fits,
    and says which it passed over and why. Before: it stopped ("resume with the same model, or use a fresh
    --checkpoint-dir"), and a fresh directory would have started the training over."""
    import logging

    from tests.unit.test_checkpoint_loaded_views import _rewrite

    url = str(tmp_path / "ckpt")
    _record(url)
    _trained(url)
    older, newest = sorted(p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-"))
    _rewrite(newest, {"model": torch.nn.Linear(8, 1).state_dict(), "step": 2})
    at_1 = torch.load(older / "state.pt", weights_only=True)["model"]
    resumed, ctx = _State(model=torch.nn.Linear(4, 1), step=0), _ctx()
    with caplog.at_level(logging.WARNING, logger="cloud_elastic"):
        elastic._load_checkpoint(ctx, _schedule(url, ctx), resumed)
    assert resumed.step == 1 and torch.equal(resumed.model.weight, at_1["weight"])
    assert [(event, fields["step"]) for event, fields in ctx.reports] == [("loaded", 1)]
    [warned] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"the checkpoint in {url} (commit #2) does not fit this training state (model: size mismatch for weight" \
           in warned and "but the one of step 1 before it does: resuming from it" in warned, warned


def test_a_checkpoint_of_another_states_attributes_points_to_one_function_with_phases(tmp_path, capsys) -> None:
    """Review h25: pre-training then fine-tuning, two hvd.elastic.run functions; every worker killed while fine-tuning,
    --checkpoint-keep having pruned the pre-training checkpoints: the restart's first function found the fine-tuning
    checkpoint and the line's only way out was a fresh directory, which trains from the start."""
    url = str(tmp_path / "ckpt")
    _record(url)
    _trained(url)  # a state with `model` and `step`
    pretraining = _State(backbone=torch.nn.Linear(4, 1), epoch=0)
    ctx = _ctx()
    with pytest.raises(SystemExit):
        elastic._load_checkpoint(ctx, _schedule(url, ctx), pretraining)
    line = capsys.readouterr().err
    assert "(attributes missing: backbone, epoch; unexpected: model, step): resume with the same model (a script " \
           "running several hvd.elastic.run functions in turn resumes each from the newest checkpoint, the later " \
           "one's: write the phases as one function that branches on the state, docs/porting.md), or use a fresh " \
           "--checkpoint-dir (training from the start)" in line, line
