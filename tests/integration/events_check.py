"""Reading a job's events file in the integration tests, and which test checks which event kind.

:func:`read_events` validates every line against the schema (``cloud_elastic.events.validate``);
tests pick a kind's events out with :func:`of` or :func:`only` and assert on their fields.

:data:`OWNERS` names, for every kind of the schema, an integration (or emulator) test that runs a real
job and checks that kind: its *facets*. A facet is a kind (``"notice"``) or a kind's field
(``"hosts_changed.draining"``). While a test runs, every facet it picks out is recorded: the
kind when :func:`of`/:func:`only` returned events of it, and ``kind.field`` when one of them
has a value for the field (not null, not empty). ``tests/integration/conftest.py`` turns an
owner that passed without picking out all its facets into a failure, and
``test_events.py`` checks that the table covers the schema and names real tests. So a kind
cannot silently stop being checked: the scenario no longer producing it, or the test no
longer looking at it, fails its owner.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import pytest

from cloud_elastic.events import validate

__all__ = ["OWNERS", "Events", "read_events", "of", "only", "recording", "owner_id", "unchecked"]

REPO = Path(__file__).resolve().parents[2]

_EVENTS = "tests/integration/test_events.py::"

#: Test id -> the facets that test must pick out of its events file.
OWNERS: dict[str, frozenset[str]] = {
    _EVENTS + "test_a_killed_worker_is_recorded_as_failure_rollback_and_smaller_round": frozenset({
        "job_started", "job_started.command", "hosts_changed.added", "worker_started", "worker_ready",
        "worker_failed", "worker_failed.signal", "worker_failed.blacklisted_s", "rollback", "round_formed",
        "round_formed.step", "job_finished",
    }),
    _EVENTS + "test_scale_up_and_scale_in_by_discovery_are_recorded_as_hosts_changed_and_new_rounds": frozenset({
        "hosts_changed.added", "hosts_changed.missing", "hosts_changed.removed", "worker_left", "round_formed",
    }),
    _EVENTS + "test_a_spot_notice_and_a_host_the_provider_reports_draining_are_recorded_as_graceful_leaves": frozenset({
        "notice", "notice.deadline", "hosts_changed.draining", "worker_left",
    }),
    "tests/integration/test_durable.py::test_whole_group_loss_resumes_from_the_checkpoint_with_exactly_once_samples":
        frozenset({"checkpoint_saved", "checkpoint_loaded"}),
    "tests/integration/test_durable.py::"
    "test_checkpoints_that_fail_after_one_was_written_are_events_and_the_job_trains_on":
        frozenset({"checkpoint_failed", "checkpoint_failed.reason", "checkpoint_failed.failed_in_a_row"}),
    "tests/integration/test_endings.py::"
    "test_a_round_stuck_in_a_blocked_worker_is_aborted_after_its_stacks_and_the_job_goes_on":
        frozenset({"round_stalled", "round_stalled.reason", "round_stalled.workers", "stacks", "stacks.rank"}),
    "tests/integration/test_endings.py::test_a_member_that_returns_while_rank_0_trains_leaves_and_rank_0_finishes":
        frozenset({"worker_left", "worker_left.early_return", "worker_left.commit_step", "worker_left.steps"}),
    "tests/integration/test_early_return_backoff.py::"
    "test_a_newcomer_whose_sampler_runs_short_backs_off_with_growing_cooldowns":
        frozenset({"worker_left", "worker_left.early_return", "worker_left.blacklisted_s"}),
    "tests/integration/test_health.py::test_a_slow_worker_is_drained_without_a_rollback_and_replaced_from_discovery":
        frozenset({"straggler", "straggler.rank", "straggler.factor", "straggler.window_s",
                   "straggler.blacklisted_s", "worker_left"}),
    "tests/integration/test_silence.py::test_a_worker_stopped_during_a_collective_is_named_before_its_round_is_aborted":
        frozenset({"collective_stalled", "collective_stalled.missing", "collective_stalled.waiting",
                   "collective_stalled.verdict", "worker_failed"}),
    "tests/integration/test_slow_link.py::"
    "test_a_worker_slow_only_in_its_sends_and_receives_is_drained_as_a_slow_network_and_the_others_are_not":
        frozenset({"slow_link", "slow_link.workers", "slow_link.peers", "slow_link.factor", "slow_link.blacklisted_s",
                   "slow_link.comm_share", "worker_left"}),
    "tests/integration/test_driver_adoption.py::"
    "test_a_driver_restarted_within_the_grace_adopts_its_workers_and_loses_no_step":
        frozenset({"worker_adopted", "worker_adopted.commit_step", "adoption_done"}),
    "tests/integration/test_spares.py::"
    "test_a_killed_worker_is_replaced_by_the_waiting_spare_holding_the_survivors_committed_state":
        frozenset({"spares", "spares.workers", "round_formed.spares_taken", "worker_failed"}),
    "tests/integration/test_planned_round.py::"
    "test_a_host_added_joins_a_round_formed_in_the_background_with_no_step_repeated":
        frozenset({"round_formed", "round_formed.planned"}),
    "tests/emulator/test_multi_source.py::"
    "test_a_job_trains_on_spot_falls_back_below_min_np_and_comes_back_with_zero_rollback":
        frozenset({"capacity", "capacity.source", "capacity.hosts", "cost", "cost.dollars_per_hour"}),
}


class Events(list):
    """The events of one events file, each validated against the schema (only :func:`read_events` makes one)."""


_seen: set[str] | None = None


def read_events(path: Path) -> Events:
    """Every line of the events file, each checked against the schema it claims, in time order."""
    events = Events(json.loads(line) for line in Path(path).read_text().splitlines())
    for e in events:
        assert e["v"] == 1 and isinstance(e["ts"], float) and isinstance(e["job"], str), e
        validate(e["event"], {k: v for k, v in e.items() if k not in ("v", "ts", "event", "job")})
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events), "events out of order"
    return events


def of(events: Events, kind: str) -> list[dict]:
    """The events of ``kind``, recorded as checked by the running test when there are any."""
    if not isinstance(events, Events):
        raise TypeError("of()/only() take what read_events() returned: events checked against the schema")
    found = [e for e in events if e["event"] == kind]
    if found and _seen is not None:
        _seen.add(kind)
        _seen.update(f"{kind}.{name}" for e in found for name, value in e.items() if value not in (None, [], {}))
    return found


def only(events: Events, kind: str) -> dict:
    """The one event of ``kind``."""
    found = of(events, kind)
    assert len(found) == 1, f"expected one {kind}, got {found}"
    return found[0]


@contextlib.contextmanager
def recording() -> Iterator[set[str]]:
    """Record the facets picked out while the block runs (one test's call)."""
    global _seen
    _seen = set()
    try:
        yield _seen
    finally:
        _seen = None


def owner_id(path: Path, name: str) -> str:
    """``tests/...::function`` for a test function (parametrized ones share it)."""
    return f"{Path(path).resolve().relative_to(REPO).as_posix()}::{name}"


def unchecked(owner: str, seen: set[str]) -> list[str]:
    """The facets ``owner`` must check and did not (empty for tests that own none)."""
    return sorted(OWNERS.get(owner, frozenset()) - seen)


_SEEN = pytest.StashKey[set]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Record which event kinds (and fields) the test picks out of its events files."""
    with recording() as seen:
        item.stash[_SEEN] = seen
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """An owner of event kinds (OWNERS) that passed without checking all of them fails."""
    report = yield
    if call.when == "call" and report.passed and hasattr(item, "originalname"):
        owner = owner_id(item.path, item.originalname)
        missing = unchecked(owner, item.stash.get(_SEEN, set()))
        if missing:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} passed without checking the event facets it owns "
                               f"(tests/integration/events_check.py OWNERS): {', '.join(missing)}")
    return report
