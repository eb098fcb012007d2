"""The chaos test's checks catch what they claim to: each fed a small history with one violation."""

from __future__ import annotations

import pytest

from tests.chaos import history
from tests.integration.harness import Event


def ev(kind: str, **data) -> Event:
    data.setdefault("t", 0.0)
    return Event(kind, dict(data, kind=kind))


A, B = "127.0.0.1[0]#1", "127.0.0.2[0]#2"
FORMED = [{"event": "round_formed", "round": 1, "size": 2, "ranks": {"127.0.0.1": [0], "127.0.0.2": [1]}},
          {"event": "round_formed", "round": 2, "size": 1, "ranks": {"127.0.0.1": [0]}}]


def good() -> list[Event]:
    # Two samples per step over two workers, 4 samples: epoch 0 = steps 1-2 (round 1);
    # B is killed during step 3, A rolls back to step 2 and does epoch 1 alone in round 2.
    return [
        ev("enter", worker=A, round=1, step=0), ev("enter", worker=B, round=1, step=0),
        ev("batch", worker=A, round=1, step=1, epoch=0, indices=[3, 1]),
        ev("batch", worker=B, round=1, step=1, epoch=0, indices=[3, 1]),
        ev("commit", worker=A, round=1, rank=0, size=2, step=1, t=1.0),
        ev("commit", worker=B, round=1, rank=1, size=2, step=1, t=1.0),
        ev("batch", worker=A, round=1, step=2, epoch=0, indices=[0, 2]),
        ev("commit", worker=A, round=1, rank=0, size=2, step=2, t=2.0),
        ev("commit", worker=B, round=1, rank=1, size=2, step=2, t=2.0),
        ev("batch", worker=A, round=1, step=3, epoch=1, indices=[2, 3]),  # rolled back
        ev("enter", worker=A, round=2, step=2),
        ev("batch", worker=A, round=2, step=3, epoch=1, indices=[0, 1]),
        ev("commit", worker=A, round=2, rank=0, size=1, step=3, t=4.0),
        ev("batch", worker=A, round=2, step=4, epoch=1, indices=[2, 3]),
        ev("commit", worker=A, round=2, rank=0, size=1, step=4, t=5.0),
        ev("done", worker=A, step=4, size=1, checksum="x"),
    ]


def test_a_good_history_passes():
    events = good()
    history.check_no_commit_lost(events)
    history.check_one_group_at_a_time(events, FORMED)
    assert history.check_exactly_once(events, 4) == (4, 2)
    assert history.check_same_parameters(events, 4) == 1


def test_continuing_below_a_commit_is_caught():
    events = good()
    events[10] = ev("enter", worker=A, round=2, step=1)
    with pytest.raises(AssertionError, match="continues from step 1 but had committed step 2"):
        history.check_no_commit_lost(events)


def test_an_older_round_that_keeps_training_is_caught():
    events = good() + [ev("commit", worker=B, round=1, rank=1, size=2, step=3, t=4.5),
                       ev("commit", worker=B, round=1, rank=1, size=2, step=4, t=5.5)]
    with pytest.raises(AssertionError, match="round 1 kept training after a later round started"):
        history.check_one_group_at_a_time(events, FORMED)


def test_two_workers_with_one_rank_are_caught():
    events = good() + [ev("commit", worker=B, round=2, rank=0, size=1, step=3, t=4.0)]
    with pytest.raises(AssertionError, match="rank 0 is not on 127.0.0.2"):
        history.check_one_group_at_a_time(events, FORMED)


def test_a_sample_seen_twice_or_missing_is_caught():
    events = good()
    events[11] = ev("batch", worker=A, round=2, step=3, epoch=1, indices=[0, 2])
    with pytest.raises(AssertionError, match=r"epoch 1: missing samples \[1\], processed twice \[2\]"):
        history.check_exactly_once(events, 4)


def test_workers_disagreeing_on_a_batch_are_caught():
    events = good()
    events[3] = ev("batch", worker=B, round=1, step=1, epoch=0, indices=[3, 0])
    with pytest.raises(AssertionError, match="workers disagree on the samples"):
        history.check_exactly_once(events, 4)


def test_different_parameters_are_caught():
    events = good() + [ev("done", worker=B, step=4, size=1, checksum="y")]
    with pytest.raises(AssertionError, match="parameters differ"):
        history.check_same_parameters(events, 4)


ALL_KINDS = ["kill9", "sigstop", "spot_notice", "host_removed", "host_added", "discovery_empty", "driver_restart"]


def test_a_run_that_applied_every_kind_passes_a_discovery_error_or_empty_answer_alike():
    history.check_every_kind_applied(ALL_KINDS, seed=1)
    history.check_every_kind_applied([k if k != "discovery_empty" else "discovery_error" for k in ALL_KINDS], seed=1)


@pytest.mark.parametrize("missing", ALL_KINDS)
def test_a_kind_never_applied_fails_naming_the_kind_and_the_seed(missing):
    # What a run records when the faults of a kind it drew were all replaced (by a discovery error, say).
    filler = "host_added" if missing == "discovery_empty" else "discovery_error"
    applied = [k for k in ALL_KINDS if k != missing] + [filler]
    key = "discovery" if missing == "discovery_empty" else missing
    with pytest.raises(AssertionError, match=rf"^chaos seed 17: no [^\n]+ \({key}\) was applied in 7 faults") as caught:
        history.check_every_kind_applied(applied, seed=17)
    assert "\n" not in str(caught.value)


def test_a_round_entered_again_together_where_a_follow_window_ends_passes_and_apart_is_caught():
    # Round 1's members enter again at step 2, in the same round (FollowerActivated): not a disagreement.
    events = good()
    events[10:10] = [ev("enter", worker=A, round=1, step=2), ev("enter", worker=B, round=1, step=2)]
    history.check_no_commit_lost(events)
    assert history.check_exactly_once(events, 4) == (4, 2)  # round 1 still goes on from its first entry, step 0
    events[11] = ev("enter", worker=B, round=1, step=3)
    with pytest.raises(AssertionError, match=r"round 1 \(entry 2\): members continue from different steps \[2, 3\]"):
        history.check_no_commit_lost(events)
