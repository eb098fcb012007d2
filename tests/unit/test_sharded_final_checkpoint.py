"""The final sharded checkpoint (``ShardedCheckpoints.finish``) after steps past the last commit.

Found in review: a loop that commits every 4 steps and trains 10 got checkpoints of steps 4 and 8 only: the final
write was skipped because the last commit (step 8) was stored, and a resume entered at step 8, where the replica
path writes step 10.

One standalone worker, a host of one (``tests/unit/test_sharded_checkpoint.py``).
"""

from __future__ import annotations

import pytest

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
