"""Host 0 of a sharded job (``hvd.shard``) sent away as the last holders of the state: the job stopping (SIGTERM or
Ctrl-C to the driver), or every host draining with no successor.

Found in review: the driver said "the workers stop at their next commit and rank 0 checkpoints it", then "the
last checkpoint is of step 1, the last commit 16 ... 15 committed step(s) will be redone": host 0's workers only
waited for the writes already running on their way out.

One standalone worker, a host of one (``tests/unit/test_sharded_checkpoint.py``): the host's group is torch's
default group of size 1, and ``leaving`` runs as on each worker of host 0.
"""

from __future__ import annotations

import pytest

from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx, _state, _train

pytestmark = pytest.mark.timeout(90)


def _saved(ctx) -> list[tuple[int, int]]:
    return [(f["step"], f["commit_seq"]) for e, f in ctx.reports if e == "saved"]


def _host_0_trained(tmp_path, steps: int = 5):
    """Host 0 at commit ``steps``, its first commit's checkpoint written (the interval is long)."""
    state, ctx = _state(), _ctx()
    ctx.ledger.holds_commit, ctx.ledger.steps_since_commit = True, 0
    durable = _checkpoints(tmp_path, ctx, interval_s=600.0)
    _train(state, 1)
    ctx.ledger.commit_seq = 1
    durable.after_commit(state)
    assert durable.stop_writing(timeout=30)
    _train(state, steps - 1)
    ctx.ledger.commit_seq = steps
    return state, ctx, durable


def test_host_0_stopped_with_no_successor_checkpoints_the_commit_it_leaves_at(tmp_path):
    state, ctx, durable = _host_0_trained(tmp_path)
    ctx.checkpoint_before_leaving = 20.0  # the driver's ExitOrder: the time left before the stop's deadline
    durable.leaving(state)
    assert _saved(ctx) == [(1, 1), (5, 5)]  # before the fix: [(1, 1)], and the stop redid 4 committed steps
    durable.leaving(state)  # that commit is stored already: not written again
    assert _saved(ctx) == [(1, 1), (5, 5)]


def test_a_worker_sent_away_with_a_successor_or_without_one_commit_writes_nothing_on_its_way_out(tmp_path):
    state, ctx, durable = _host_0_trained(tmp_path)
    ctx.checkpoint_before_leaving = None  # another worker takes the state
    durable.leaving(state)
    ctx.checkpoint_before_leaving, ctx.ledger.holds_commit = 20.0, False  # its shards are not one commit
    durable.leaving(state)
    ctx.ledger.holds_commit, ctx.checkpoint_before_leaving = True, 0.0  # no time left before the deadline
    durable.leaving(state)
    assert _saved(ctx) == [(1, 1)]


def test_a_host_that_was_not_host_0_in_its_last_round_writes_when_the_driver_picked_it(tmp_path):
    # Found by review: host 0 lost (or gone first), the survivors told to checkpoint on a stop or a drain wrote
    # nothing, their last round's cross rank being 1: "11 committed step(s) will be redone". The driver picks the
    # writing host by the order they leave in, and tells only that host's workers (ExitOrder.checkpoint_s).
    state, ctx, durable = _host_0_trained(tmp_path)
    ctx.info.cross_rank = 1
    ctx.checkpoint_before_leaving = 20.0
    durable.leaving(state)
    assert _saved(ctx) == [(1, 1), (5, 5)]
