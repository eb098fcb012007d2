"""The final sharded checkpoint (``ShardedCheckpoints.finish``) after steps, or other changes, past the last commit.

Found in review: a loop that commits every 4 steps and trains 10 got checkpoints of steps 4 and 8 only: the final
write was skipped because the last commit (step 8) was stored, and a resume entered at step 8, where the replica
path writes step 10. Later, weights or a learning rate changed after the last stored commit with no step, and a
resume that trained nothing rewrote the checkpoint it loaded (pruning an older one).

One standalone worker, a host of one (``tests/unit/test_sharded_checkpoint.py``).
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx, _state, _train, _values

pytestmark = pytest.mark.timeout(90)


def test_steps_after_the_last_stored_commit_are_in_the_final_checkpoint_and_a_resume_enters_there(tmp_path):
    state, ctx = _state(), _ctx()
    durable = _checkpoints(tmp_path, ctx, interval_s=0.0)
    _train(state, 8, commit=False)
    state.commit()
    ctx.ledger.commit_seq, ctx.ledger.steps_since_commit = 2, 0  # committed every 4 steps
    durable.after_commit(state)
    assert durable.stop_writing(timeout=30)
    _train(state, 2, commit=False)  # steps 9 and 10: the loop ends before its next commit
    ctx.ledger.steps_since_commit = 2
    assert durable.finish(state) is None
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [8, 10]  # before the fix: [8]
    trained = _values(state)

    other = _state(seed=7)
    assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 10
    assert other.step == 10 and all(a.equal(b) for a, b in zip(_values(other), trained))


def _stored_at_commit_4(tmp_path):
    """A worker whose checkpoint of its last commit (4, step 4) is stored."""
    state, ctx = _state(), _ctx()
    durable = _checkpoints(tmp_path, ctx, interval_s=0.0)
    _train(state, 4)
    ctx.ledger.commit_seq, ctx.ledger.steps_since_commit = 4, 0
    durable.after_commit(state)
    assert durable.stop_writing(timeout=30)
    return state, ctx, durable


def test_no_final_write_when_the_final_state_is_the_stored_commit(tmp_path):
    state, ctx, durable = _stored_at_commit_4(tmp_path)
    assert durable.finish(state) is None
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [4]


def test_a_plain_value_changed_after_the_last_stored_commit_is_in_the_final_checkpoint(tmp_path):
    # Found in review: a script ending with `state.epoch += 1` after its last commit (no step since) resumed at
    # epoch 0 from the sharded checkpoint, at epoch 1 from a replica's: the final write was skipped.
    state, ctx, durable = _stored_at_commit_4(tmp_path)
    state.note = "epoch over"  # after the last commit: no optimizer step
    assert durable.finish(state) is None
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [4, 4]  # before the fix: [4]
    other = _state(seed=7)
    assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 4 and other.note == "epoch over"


@pytest.mark.parametrize("change", ["weights through .data", "a learning rate set by hand"])
def test_a_sharded_value_changed_after_the_last_stored_commit_is_in_the_final_checkpoint(tmp_path, change):
    # Found in review: weights rewritten after the last commit (an EMA swap, the best weights loaded back,
    # `q.mul_(0.5)`) or an lr set directly were lost: no step since, state.pt unchanged, so no final write, and a
    # rerun resumed from the last commit's values. `.data` bumps no version counter: only the values tell.
    state, ctx, durable = _stored_at_commit_4(tmp_path)
    if change.startswith("weights"):
        before = _values(state)
        for p in state.model.parameters():
            p.data.to_local().mul_(0.5)
        assert not torch.equal(_values(state)[0], before[0])
    else:
        state.optimizer.param_groups[0]["lr"] = 0.5
    assert durable.finish(state) is None
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [4, 4]  # before the fix: [4]
    other = _state(seed=7)
    assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 4
    assert all(a.equal(b) for a, b in zip(_values(other), _values(state)))
    assert other.optimizer.param_groups[0]["lr"] == state.optimizer.param_groups[0]["lr"]


def test_a_resume_that_trains_nothing_rewrites_nothing_until_a_value_changes(tmp_path):
    # Found in review: after a load nothing counted as stored, so a resume that trained no step rewrote the
    # checkpoint it loaded at its end, and with --checkpoint-keep 2 that pruned the older, distinct one.
    state, ctx = _state(), _ctx()
    durable = _checkpoints(tmp_path, ctx, interval_s=0.0)  # keeps 2
    for seq in (2, 4):
        _train(state, 2)
        ctx.ledger.commit_seq = seq
        durable.after_commit(state)
        assert durable.stop_writing(timeout=30)
    folders = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-"))
    assert len(folders) == 2

    other, octx = _state(seed=7), _ctx()
    octx.ledger.hold_commit = lambda seq: setattr(octx.ledger, "commit_seq", seq)  # as the ledger does
    resumed = _checkpoints(tmp_path, octx)
    assert resumed.load_latest(other).step == 4 and octx.ledger.commit_seq == 4
    assert resumed.finish(other) is None
    assert [e for e, _ in octx.reports] == ["loaded"]  # before the fix: ["loaded", "saved"], step 2's pruned
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-")) == folders
    # Compared with the state as loaded: a weight changed since is written.
    next(other.model.parameters()).data.to_local().add_(1.0)
    assert resumed.finish(other) is None
    assert [(e, f["step"]) for e, f in octx.reports] == [("loaded", 4), ("saved", 4)]


def test_the_digest_that_proves_the_final_state_stored_tells_every_change_bit_for_bit():
    from cloud_elastic.worker.durable.stored import Stored, digest

    bn = torch.nn.BatchNorm1d(3)
    before = digest({"model": bn.state_dict()})
    bn(torch.randn(4, 3))  # a forward in train mode moves its running statistics: no parameter, no step
    assert digest({"model": bn.state_dict()}) != before
    assert digest({"x": torch.tensor([0.0])}) != digest({"x": torch.tensor([-0.0])})
    assert digest({"lr": 0.0}) != digest({"lr": -0.0}) and digest({"lr": 1}) != digest({"lr": 1.0})
    assert digest({"x": torch.tensor([float("nan")])}) == digest({"x": torch.tensor([float("nan")])})
    assert digest({"x": torch.zeros(2)}) != digest({"x": torch.zeros(2, dtype=torch.float64)})
    assert digest({"x": torch.zeros(2)}) != digest({"x": torch.zeros(1, 2)})
    assert digest({"x": torch.zeros(2)}) != digest({"y": torch.zeros(2)})
    assert digest({"a": object()}) is None and not Stored(4, None).holds(object(), 4, True)  # unknown: written


def test_the_digest_passes_at_the_end_and_at_a_load_count_as_progress_tensor_by_tensor(tmp_path):
    # Found in review: the passes that prove the final state stored (at the end, after each write, at a load) marked
    # no progress; over tens of GB a worker they take tens of seconds, under --progress-timeout (120 s by default).
    from cloud_elastic.worker.link.progress import Progress

    state, ctx, durable = _stored_at_commit_4(tmp_path)
    tensors = len(list(state.model.parameters()))
    ctx.progress = Progress()
    assert durable.finish(state) is None
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [4]  # nothing written: only the proof ran
    assert ctx.progress.count >= tensors  # before the fix: 0

    other, octx = _state(seed=7), _ctx()
    octx.progress = Progress()
    assert _checkpoints(tmp_path, octx).load_latest(other).step == 4
    assert octx.progress.count >= tensors  # before the fix: 0
