"""How a leaving worker's end is reported when it does not leave at a commit (``driver/job/elastic_job.py``,
``driver/job/leaving.py``).

Found by review of the release lines for draining workers that die (7340bd7): a draining member killed inside its
round was still emitted as ``worker_left`` ("host is draining"), so the events file, the metrics and the timeline
said it left gracefully while the log said it was killed; a draining member that came back to rendezvous from a
failure was released as "its workers left at a commit; 0 steps lost"; and a worker that died on a host removed from
discovery (no notice) got no line at all. Then (review of 0f42435): a slot drained by hand was reported not
blacklisted and the drain's reason dropped; a slot its host stopped listing was told of as its host leaving.
Scripted timelines on a fake clock.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import WorkerState
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import CLEAN, KILLED, T0, assert_round, started

pytestmark = pytest.mark.timeout(30)  # the first test of a run may import torch (conftest), on a loaded machine


def ended(sim, slot: str) -> list[tuple[str, dict]]:
    """The worker_failed / worker_left events of the worker on ``slot``."""
    wid = sim.id(slot)
    return [(kind, f) for kind, f in sim.events if kind in ("worker_failed", "worker_left") and f.get("worker") == wid]


def said(caplog: pytest.LogCaptureFixture, *parts: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if all(p in r.getMessage() for p in parts)]


def test_a_draining_member_killed_in_its_round_is_an_event_of_failure_not_a_graceful_leave() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    sim.commit("a[0]", "b[0]")
    sim.discover({"a": 1}, {"b": Drain(T0 + 120, "spot interruption")})
    sim.exit("b[0]", KILLED)  # the cloud took b before its next commit
    [(kind, fields)] = ended(sim, "b[0]")
    assert kind == "worker_failed", (kind, fields)
    assert (fields["signal"], fields["exit_code"], fields["blacklisted_s"]) == ("SIGKILL", None, None), fields
    assert fields["reason"] == "killed by signal 9 while draining (host b is draining (spot interruption))", fields
    assert not sim.blocked("b[0]")  # the host is going: its slot is not blamed
    sim.job.rendezvous(sim.id("a[0]"), 1, "failure", sim.now, rolled_back=3)
    sim._collect()
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    [rollback] = [f for kind, f in sim.events if kind == "rollback"]
    assert sim.id("b[0]") in rollback["reason"] and rollback["steps_lost"] == 3, rollback


def test_a_draining_member_that_leaves_at_its_commit_is_still_a_graceful_leave() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    sim.discover({"a": 1}, {"b": Drain(T0 + 120, "spot interruption")})
    sim.join("a[0]", "b[0]", reason="update")
    sim.exit("b[0]", CLEAN)
    [(kind, fields)] = ended(sim, "b[0]")
    assert kind == "worker_left" and "spot interruption" in fields["reason"], (kind, fields)


def test_a_draining_member_back_from_a_failure_is_released_with_the_steps_its_peers_rolled_back(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    sim.commit("a[0]", "b[0]", "c[0]")
    sim.discover({"a": 1, "c": 1}, {"b": Drain(T0 + 120, "spot interruption")})
    assert sim.job.workers[sim.id("b[0]")].state is WorkerState.DRAINING
    # b's collective failed before its commit (a broken link, nobody died): it comes back from the failure.
    sim.job.rendezvous(sim.id("b[0]"), 1, "failure", sim.now, rolled_back=4)
    sim._collect()
    assert sim.poll("a[0]").abort_round == 1
    sim.exit("b[0]", CLEAN)  # sent away from rendezvous: it exits
    for slot in ("a[0]", "c[0]"):
        sim.job.rendezvous(sim.id(slot), 1, "failure", sim.now, rolled_back=4)
    sim._collect()
    assert_round({s: sim.reply(s) for s in ("a[0]", "c[0]")}, 2, needs_sync=True)
    drained = said(caplog, "host b drained")
    assert len(drained) == 1 and "0 steps lost" not in drained[0] and "left at a commit" not in drained[0], drained
    assert drained[0].endswith("before leaving at a commit; the survivors rolled back 4 step(s) to their last "
                               "commit"), drained
    assert sim.id("b[0]") in drained[0], drained


def test_a_member_killed_on_a_host_removed_from_discovery_gets_the_line_of_a_draining_one(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    sim.commit("a[0]", "b[0]")
    sim.discover({"a": 1})  # b leaves the group with no notice: its worker leaves at its next commit
    assert sim.job.workers[sim.id("b[0]")].state is WorkerState.DRAINING
    sim.exit("b[0]", KILLED)  # b's machine went before that commit
    [(kind, fields)] = ended(sim, "b[0]")
    assert kind == "worker_failed" and fields["blacklisted_s"] is None, (kind, fields)
    assert sim.job.hosts.blacklist.failures(Slot("b", 0)) == 0
    sim.job.rendezvous(sim.id("a[0]"), 1, "failure", sim.now, rolled_back=2)
    sim._collect()
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    lines = said(caplog, "job t: host b left the group: ")  # as "job t: host b drained (...): " for a notice
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0].endswith(f"worker {sim.id('b[0]')} (rank 1) killed by signal 9 while draining, before leaving "
                             "at a commit; the survivors rolled back 2 step(s) to their last commit"), lines


def test_a_silent_member_on_a_host_removed_from_discovery_gets_that_line_too(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(2, {"a": 1, "b": 1}, min_np=1, heartbeat_timeout_s=5)
    sim.commit("a[0]", "b[0]")
    sim.discover({"a": 1})
    sim.silent.add(sim.id("b[0]"))  # b's machine vanished with its worker, before that commit
    sim.advance(6)
    sim.exit("b[0]", KILLED)  # the driver's stop of the lost worker
    sim.job.rendezvous(sim.id("a[0]"), 1, "failure", sim.now, rolled_back=1)
    sim._collect()
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    lines = said(caplog, "job t: host b left the group: ")
    assert len(lines) == 1 and "stopped answering heartbeats" in lines[0], [r.getMessage() for r in caplog.records]
    assert lines[0].endswith("while draining, before leaving at a commit; the survivors rolled back 1 step(s) to "
                             "their last commit"), lines


def test_a_slot_drained_by_hand_whose_worker_dies_says_its_cooldown_and_the_drain() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    sim.commit("a[0]", "b[0]")
    done, message = sim.job.drain("b", 0, sim.now)  # as a straggler is drained: its slot is blacklisted at once
    assert done and "blacklisted for 11s" in message, message
    sim.advance(2)
    sim.exit("b[0]", KILLED)
    [(kind, fields)] = ended(sim, "b[0]")
    assert kind == "worker_failed" and sim.blocked("b[0]"), (kind, fields)
    assert 8 < fields["blacklisted_s"] < 9.5, fields  # what is left of the cooldown set at the drain
    assert fields["reason"] == "killed by signal 9 while draining (drained by hand (cloud-elastic drain b:0))", fields


def test_a_slot_its_host_no_longer_lists_is_named_when_its_worker_dies_not_its_host(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(3, {"a": 1, "b": 2}, min_np=1)
    sim.commit("a[0]", "b[0]", "b[1]")
    sim.discover({"a": 1, "b": 1})  # b shrinks to one slot: b[1] leaves at its next commit, b[0] trains on
    assert sim.job.workers[sim.id("b[1]")].why == "slot b[1] left the group (host b now lists 1 slot(s))"
    sim.exit("b[1]", KILLED)
    for slot in ("a[0]", "b[0]"):
        sim.job.rendezvous(sim.id(slot), 1, "failure", sim.now, rolled_back=2)
    sim._collect()
    assert_round({s: sim.reply(s) for s in ("a[0]", "b[0]")}, 2, needs_sync=True)
    assert not said(caplog, "host b left the group"), [r.getMessage() for r in caplog.records]
    [line] = said(caplog, "job t: slot b[1] left the group (host b now lists 1 slot(s)): ")
    assert line.endswith(f"worker {sim.id('b[1]')} (rank 2) killed by signal 9 while draining, before leaving at a "
                         "commit; the survivors rolled back 2 step(s) to their last commit"), line
