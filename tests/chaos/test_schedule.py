"""The chaos schedule (drawn from the seed alone; the CI seed exercises the driver restart) and the
workers' event files it reads."""

from __future__ import annotations

from tests.chaos.schedule import ISSUE_KINDS, KINDS, issue_kind, plan, stand_in
from tests.chaos.test_chaos import CI_SEED, DRIVER_GRACE_S, EVENTS, HEARTBEAT_S, MISSING_GRACE_S, TIMING, bound_s
from tests.integration.harness import EventFiles


def _plan(seed: int, count: int = 20):
    return plan(seed, count, TIMING)


def test_a_seed_replays_the_same_schedule():
    assert _plan(12345) == _plan(12345)
    assert _plan(12345) != _plan(12346)


def test_the_ci_seed_restarts_the_driver_at_once_and_after_a_delay():
    restarts = [s for s in _plan(CI_SEED, EVENTS) if s.kind == "driver_restart"]
    assert any(s.duration_s == 0 for s in restarts), restarts
    assert any(s.duration_s > HEARTBEAT_S for s in restarts), restarts


def test_every_kind_is_drawn_and_delayed_restarts_stay_within_the_grace():
    steps = _plan(7, 2000)
    assert {s.kind for s in steps} == {k for k, w in KINDS.items() if w}
    delays = [s.duration_s for s in steps if s.kind == "driver_restart"]
    delayed = [d for d in delays if d]
    assert 0.2 < len(delayed) / len(delays) < 0.45, "about a third of the restarts wait"
    assert all(1.5 * HEARTBEAT_S <= d <= DRIVER_GRACE_S / 3 for d in delayed), (min(delayed), max(delayed))


def test_a_plan_of_20_steps_draws_every_kind_the_issue_lists():
    # Drawn alone, a third of the seeds miss a kind in 20 steps (seed 2 draws no spot notice, seed 9 no
    # host removed and no driver restart): the test, which asserts every kind applied, would fail on them.
    for seed in range(300):
        assert {issue_kind(s.kind) for s in _plan(seed, 20)} == set(ISSUE_KINDS), seed


def test_a_replacement_is_drawn_from_the_replaced_step_alone():
    step = _plan(CI_SEED)[0]
    for kind in KINDS:
        assert stand_in(kind, step, TIMING) == stand_in(kind, step, TIMING)
        assert stand_in(kind, step, TIMING).pause_s == 0 and stand_in(kind, step, TIMING).pick == step.pick
    stops = [stand_in("sigstop", s, TIMING).duration_s for s in _plan(7, 200)]
    assert all(0.2 * HEARTBEAT_S <= d <= 2.0 * HEARTBEAT_S for d in stops), (min(stops), max(stops))
    empty = [stand_in("discovery_empty", s, TIMING).duration_s for s in _plan(7, 200)]
    assert all(d < MISSING_GRACE_S for d in empty), max(empty)


def test_the_ci_run_is_bounded_to_a_few_minutes_and_a_soak_scales():
    assert bound_s(20) == 300
    assert bound_s(200) == 300 + 15 * 180


def test_worker_event_files_are_merged_by_time_and_a_line_in_flight_waits(tmp_path):
    (tmp_path / "1.jsonl").write_text('{"kind": "hello", "worker": "a", "t": 1.0}\n'
                                      '{"kind": "commit", "worker": "a", "t": 3.0}\n')
    (tmp_path / "2.jsonl").write_text('{"kind": "hello", "worker": "b", "t": 2.0}\n'
                                      '{"kind": "commit", "worker": "b", "t": 4')
    files = EventFiles(tmp_path)
    assert [e["t"] for e in files.events] == [1.0, 2.0, 3.0]
    with open(tmp_path / "2.jsonl", "a") as f:
        f.write('.0}\n{"kind": "commit", "worker": "b", "t": 6.0}\n')
    with open(tmp_path / "1.jsonl", "a") as f:  # read later, written earlier: merged into place
        f.write('{"kind": "commit", "worker": "a", "t": 5.0}\n')
    assert [e["t"] for e in files.events] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [e["t"] for e in files.of("commit", worker="a")] == [3.0, 5.0]
    assert {w: e["t"] for w, e in files.latest("commit").items()} == {"a": 5.0, "b": 6.0}
