"""The driver state machine on the failure paths real fleets hit: flaky discovery, a stalled
driver, lost training state, notices and drain deadlines. Scripted timelines on a fake clock."""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder, Phase, Release
from cloud_elastic.driver.job.workers import IllegalTransition, WorkerState
from cloud_elastic.providers.api import DiscoveredHosts, Drain
from tests.unit.test_job import CLEAN, KILLED, T0, Sim, assert_round, failed, started

pytestmark = pytest.mark.timeout(10)


# ------------------------------------------------- a host missing from discovery
def test_an_empty_discovery_answer_evicts_nobody_within_the_grace() -> None:
    """Issue 10 #2: a script that printed nothing for 1.5 s used to evict every worker for good."""
    sim = started(3, {"a": 1, "b": 1, "c": 1}, missing_grace=10)
    sim.discover({})
    sim.advance(1.5)
    sim.discover({"a": 1, "b": 1, "c": 1})
    sim.advance(20)
    assert sim.stops == [] and sim.poll("a[0]").update_gen == 0
    assert all(w.state is WorkerState.RUNNING for w in sim.job.workers.values())
    assert len(sim.launched) == 3  # nobody was replaced


def test_a_host_missing_past_the_grace_leaves_gracefully() -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1, missing_grace=10)
    sim.discover({"a": 1, "c": 1})
    sim.advance(9)
    assert sim.poll("a[0]").update_gen == 0
    sim.advance(2)
    assert sim.poll("a[0]").update_gen == 1  # b's worker leaves at its next commit, no rollback
    assert sim.poll("a[0]").abort_round == 0
    assert_round(sim.join("a[0]", "c[0]", reason="update"), 2, needs_sync=False)
    assert isinstance(sim.join("b[0]", reason="update")["b[0]"], ExitOrder)


def test_nothing_is_launched_on_a_missing_host() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, max_np=3, missing_grace=10)
    sim.discover({"a": 1})
    sim.discover({"a": 1, "c": 1})
    assert sim.slots_launched() == ["a[0]", "b[0]", "c[0]"]
    sim.exit("b[0]", KILLED)  # a real death is still a death, found at once
    sim.advance(30)
    assert sim.slots_launched().count("b[0]") == 1


def _kept_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "missing from discovery for over" in r.getMessage()]


def test_an_empty_discovery_answer_past_the_grace_keeps_the_last_holders_of_the_state(caplog) -> None:
    """A throttled `aws ... | jq` printing nothing for 16 s removed the only host: 'training state lost'."""
    caplog.set_level(logging.WARNING, logger="cloud_elastic")
    sim = started(2, {"a": 2}, missing_grace=10)
    sim.commit("a[0]", "a[1]")
    sim.discover({})
    sim.advance(16)
    assert sim.outcome is None and sim.stops == [] and sim.poll("a[0]").update_gen == 0
    (line,) = _kept_lines(caplog)
    assert "host a has been missing" in line and "last live holders of the newest commit" in line
    assert "fewer than --min-np 2" in line
    sim.discover({"a": 2})
    sim.advance(20)
    assert sim.outcome is None and sim.stops == [] and sim.poll("a[0]").update_gen == 0
    assert not any(kind == "hosts_changed" and f["removed"] for kind, f in sim.events)


def test_a_missing_host_is_kept_rather_than_go_below_min_np() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=2, missing_grace=10)  # nothing committed yet
    sim.discover({"a": 1})
    sim.advance(11)
    assert sim.poll("a[0]").update_gen == 0 and sim.job.workers[sim.id("b[0]")].state is WorkerState.RUNNING


def test_a_missing_host_holding_the_state_is_kept_though_a_newcomer_would_make_min_np(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_elastic")
    sim = started(1, {"b": 1}, min_np=1, max_np=2, missing_grace=10)
    sim.commit("b[0]")
    sim.discover({"b": 1, "a": 1})
    sim.join("a[0]")  # waits at rendezvous: it holds no state yet
    sim.discover({"a": 1})
    sim.advance(11)
    assert sim.job.workers[sim.id("b[0]")].state is WorkerState.RUNNING
    (line,) = _kept_lines(caplog)
    assert "host b" in line and "last live holders" in line and "--min-np" not in line


def test_missing_hosts_go_while_enough_holders_stay_and_a_kept_one_goes_once_its_workers_fail() -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1, missing_grace=10)
    sim.commit("a[0]", "b[0]", "c[0]")
    sim.discover({})
    sim.advance(11)
    removed = [h["host"] for kind, f in sim.events if kind == "hosts_changed" for h in f["removed"]]
    assert sorted(removed) == ["b", "c"]  # the newest hosts go; the oldest keeps the state and --min-np
    state = {slot: sim.job.workers[sim.id(slot)].state for slot in ("a[0]", "b[0]", "c[0]")}
    assert state == {"a[0]": WorkerState.RUNNING, "b[0]": WorkerState.DRAINING, "c[0]": WorkerState.DRAINING}
    sim.exit("a[0]", KILLED)  # a dead host's workers are found by their exits (or silence)
    sim.advance(0.5)
    removed = [h["host"] for kind, f in sim.events if kind == "hosts_changed" for h in f["removed"]]
    assert sorted(removed) == ["a", "b", "c"]


def test_a_draining_state_acts_at_once_despite_the_grace() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, missing_grace=10)
    sim.discover({"a": 1}, {"b": Drain(reason="Terminating:Wait")})
    assert sim.poll("a[0]").update_gen == 1


# ------------------------------------------------------------ a stalled driver
def test_a_driver_stall_longer_than_the_heartbeat_timeout_kills_nobody() -> None:
    """Issue 10 #3: a driver SIGSTOPped for 6 s declared every worker dead."""
    sim = started(2, {"a": 2}, heartbeat_timeout_s=5)
    sim.stall(6)
    # The loop's first tick after the stall comes before the heartbeats queued meanwhile are read:
    # on the wall clock every worker has been silent for 6 s at that tick.
    sim.job.tick(sim.now)
    sim._collect()
    sim.advance(0.5)
    assert sim.stops == [] and sim.outcome is None
    assert sim.poll("a[0]").abort_round == 0


def test_a_silent_worker_is_still_given_up_after_a_driver_stall() -> None:
    sim = started(2, {"a": 2}, min_np=1, heartbeat_timeout_s=5)
    sim.silent.add(sim.id("a[1]"))
    sim.advance(3)
    sim.stall(30)
    sim.advance(1.5)
    assert sim.stops == []  # 4.5 s of running time: not yet
    sim.advance(1.5)
    assert [s.worker_id for s in sim.stops] == [sim.id("a[1]")]
    assert sim.poll("a[0]").abort_round == 1


# ------------------------------------------------ the committed state is never lost
def test_losing_every_state_holder_fails_the_job_instead_of_starting_over() -> None:
    """Issue 11: newcomers alone used to form the next round, and rank 0 broadcast initial weights."""
    sim = started(2, {"a": 2}, min_np=1, cooldown=(0, 1))  # 0 1: a failed slot is retried at once
    sim.commit("a[0]", "a[1]", count=150)
    sim.exit("a[0]", KILLED)
    sim.exit("a[1]", KILLED)
    failed(sim, "training state lost", "--checkpoint-dir")
    assert not any(isinstance(sim.reply(s), Assignment) for s in ("a[0]", "a[1]"))


def test_a_newcomer_that_never_committed_does_not_become_rank_0_alone() -> None:
    """The holder dies while a newcomer's first sync is under way: the newcomer holds no trained state."""
    sim = started(1, {"a": 1}, max_np=2, cooldown=(0, 0))
    sim.commit("a[0]", count=10)
    sim.discover({"a": 1, "b": 1})
    sim.join("b[0]")
    assert_round(sim.join("a[0]", reason="update") | {"b[0]": sim.reply("b[0]")}, 2, needs_sync=True)
    sim.exit("a[0]", KILLED)  # during the sync, before b's first commit
    sim.join("b[0]", reason="failure")
    failed(sim, "training state lost")


def test_holders_take_rank_0_before_a_survivor_that_never_committed() -> None:
    sim = started(1, {"a": 1}, min_np=1, max_np=3, cooldown=(0, 0))
    sim.commit("a[0]", count=5)
    sim.discover({"a": 1, "b": 1})
    sim.join("b[0]")
    sim.join("a[0]", reason="update")
    assert sim.layout() == ["a[0]", "b[0]"]
    sim.commit("a[0]", "b[0]", count=6)
    sim.discover({"a": 1, "b": 1, "c": 1})
    sim.join("c[0]")
    sim.join("a[0]", "b[0]", reason="update")
    assert sim.layout() == ["a[0]", "b[0]", "c[0]"]
    sim.exit("a[0]", KILLED)  # c never committed; b did: b must be rank 0
    replies = sim.join("b[0]", "c[0]", reason="failure")
    assert_round(replies, 4, needs_sync=True)
    assert sim.layout() == ["b[0]", "c[0]"]


def test_before_the_first_commit_a_newcomer_may_start_over() -> None:
    sim = started(1, {"a": 1}, min_np=1, max_np=2, cooldown=(0, 0))
    sim.discover({"a": 1, "b": 1})
    sim.join("b[0]")
    sim.join("a[0]", reason="update")
    sim.exit("a[0]", KILLED)  # nobody has committed yet: nothing to lose
    assert_round(sim.join("b[0]", reason="failure"), 3, needs_sync=True)
    assert sim.outcome is None


def test_losing_every_worker_with_checkpoints_waits_for_capacity_until_the_elastic_timeout() -> None:
    sim = started(2, {"a": 2}, min_np=2, checkpointing=True, elastic_timeout_s=60, cooldown=(1000, 1000))
    sim.commit("a[0]", "a[1]", count=3)
    sim.exit("a[0]", KILLED)
    sim.exit("a[1]", KILLED)
    sim.advance(59)
    assert sim.outcome is None
    sim.advance(2)
    failed(sim, "fewer than --min-np 2")


def test_with_checkpoints_a_whole_group_loss_resumes_from_the_checkpoint() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=2, checkpointing=True, cooldown=(10, 300))
    sim.commit("a[0]", "b[0]", count=40)
    sim.exit("a[0]", KILLED)
    sim.exit("b[0]", KILLED)
    sim.discover({"c": 1, "d": 1})  # the old hosts are gone, new capacity arrives
    assert sim.outcome is None
    replies = sim.join("c[0]", "d[0]")
    assert all(isinstance(r, Assignment) and r.from_checkpoint and r.needs_sync for r in replies.values())
    assert sim.job.phase is Phase.RUNNING


# ------------------------------------------------------- notices and deadlines
def test_a_notice_drains_the_host_with_zero_rollback_and_releases_it(caplog) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    sim.job.notice("b", Drain(deadline=T0 + 120, reason="spot interruption"), sim.now, source="aws-imds")
    sim._collect()
    poll = sim.poll("a[0]")
    assert (poll.update_gen, poll.abort_round) == (1, 0)
    assert_round(sim.join("a[0]", "c[0]", reason="update"), 2, needs_sync=False)
    assert isinstance(sim.join("b[0]", reason="update")["b[0]"], ExitOrder)
    assert sim.released == []
    sim.exit("b[0]", CLEAN)
    assert sim.released == [Release("b", None)]
    drained = [r.getMessage() for r in caplog.records if "drained" in r.getMessage()]
    assert drained == ["job t: host b drained (spot interruption, notice from aws-imds), 120.0s before its deadline: "
                       "its workers left at a commit; 0 steps lost"]
    assert sim.job.hosts.blacklist.failures(sim.job.workers[sim.id("b[0]")].slot) == 0
    sim.advance(5)
    assert sim.released == [Release("b", None)]  # once
    assert sim.outcome is None


def test_a_notice_whose_deadline_comes_first_removes_the_workers_by_force(caplog) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    sim.job.notice("b", Drain(deadline=T0 + 30, reason="preempted"), sim.now, source="gcp-metadata")
    sim._collect()
    sim.advance(24)  # no commit happens: a step longer than the notice
    assert sim.stops == []
    sim.advance(1.5)
    assert [(s.worker_id, s.immediate) for s in sim.stops] == [(sim.id("b[0]"), True)]
    assert sim.poll("a[0]").abort_round == 1  # the survivor rolls back to its last commit
    sim.exit("b[0]", KILLED)
    sim.job.rendezvous(sim.id("a[0]"), 1, "failure", sim.now, rolled_back=3)  # it undid 3 steps
    sim._collect()
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    assert sim.outcome is None
    assert [f["steps_lost"] for k, f in sim.events if k == "rollback"] == [3]
    drained = [r.getMessage() for r in caplog.records if "drained" in r.getMessage()]
    assert drained == ["job t: host b drained (preempted, notice from gcp-metadata), 5.0s before its deadline: "
                       "removed by force before its deadline; the survivors rolled back 3 step(s) to their last commit"]


def test_the_log_says_how_many_steps_a_rollback_lost_and_to_which_commit(caplog) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    sim.commit("a[0]", "b[0]", count=5)
    sim.exit("b[0]", KILLED)
    sim.job.rendezvous(sim.id("a[0]"), 1, "failure", sim.now, 5, rolled_back=2, commit_seq=5)  # it undid 2 steps
    sim._collect()
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    lines = [r.getMessage() for r in caplog.records if "rolled back" in r.getMessage()]
    assert lines == ["job t: round 1's survivors rolled back 2 step(s), to their commit #5"]


def test_a_drained_host_the_group_keeps_takes_a_worker_again_once_its_notice_lapses(caplog) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(2, {"a": 1, "b": 1}, min_np=1, cooldown=(300, 300))
    sim.job.notice("b", Drain(deadline=T0 + 30, reason="spot interruption"), sim.now, source="aws-imds")
    sim._collect()
    assert_round(sim.join("a[0]", reason="update"), 2, needs_sync=False)
    sim.join("b[0]", reason="update")
    sim.exit("b[0]", CLEAN)
    sim.advance(149)
    sim.discover({"a": 1, "b": 1})  # the group still has it, 119 s after its deadline
    assert sim.slots_launched() == ["a[0]", "b[0]"]
    sim.advance(1)
    sim.discover({"a": 1, "b": 1})  # 120 s after: AWS did not take it after all
    assert sim.slots_launched() == ["a[0]", "b[0]", "b[0]"]  # not blacklisted: it did nothing wrong
    assert any("the notice for host b lapsed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("source", ["provider", "watcher"])
def test_drain_on_rebalance_drains_the_host_of_every_soft_notice(source: str) -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    sim.job.hosts.drain_soft = True  # --drain-on-rebalance
    if source == "provider":  # e.g. AWS queue mode's rebalance recommendation
        sim.job.discovered(DiscoveredHosts(ready={"a": 1, "b": 1, "c": 1}, soft={"b": "rebalance recommendation"}),
                           sim.now)
    else:
        sim.job.notice("b", Drain(reason="rebalance recommendation"), sim.now, source="aws-imds", soft=True)
    sim._collect()
    poll = sim.poll("a[0]")
    assert (poll.update_gen, poll.abort_round) == (1, 0)
    assert_round(sim.join("a[0]", "c[0]", reason="update"), 2, needs_sync=False)
    assert isinstance(sim.join("b[0]", reason="update")["b[0]"], ExitOrder)


def test_a_soft_notice_keeps_new_workers_off_the_host_only() -> None:
    sim = started(1, {"a": 1}, max_np=3)
    sim.job.notice("b", Drain(reason="rebalance recommendation"), sim.now, source="aws-imds", soft=True)
    sim.discover({"a": 1, "b": 1, "c": 1})
    assert sim.slots_launched() == ["a[0]", "c[0]"]
    assert sim.poll("a[0]").update_gen == 0


def test_a_notice_for_an_unknown_host_changes_nothing() -> None:
    sim = started(2, {"a": 2})
    sim.job.notice("zz", Drain(reason="spot interruption"), sim.now, source="aws-sqs")
    assert sim.poll("a[0]").update_gen == 0


# ------------------------------------------------------------ the state machine
def test_a_transition_the_machine_does_not_have_is_refused() -> None:
    sim = started(1, {"a": 1})
    w = sim.job.workers[sim.id("a[0]")]
    with pytest.raises(IllegalTransition):
        w.to(WorkerState.STARTING)


def test_all_workers_failing_after_commits_says_the_state_went_with_them() -> None:
    sim = started(2, {"a": 2}, min_np=1, cooldown=(300, 300))
    sim.commit("a[0]", "a[1]", count=2)
    sim.exit("a[0]")
    sim.exit("a[1]")
    failed(sim, "all workers failed; last: ", "exited with code 1", "training state was lost with them")


def test_a_slot_whose_lost_worker_is_still_running_gets_no_replacement() -> None:
    """The slot is a GPU: a silent worker's process may still hold it until it is gone."""
    sim = started(2, {"a": 2}, min_np=1, heartbeat_timeout_s=5, cooldown=(0, 1))  # 0 1: retried at once
    sim.silent.add(sim.id("a[1]"))
    sim.advance(6)
    assert sim.job.workers[sim.id("a[1]")].state is WorkerState.LOST
    sim.advance(2)
    assert sim.slots_launched() == ["a[0]", "a[1]"]
    sim.exit("a[1]", KILLED)
    sim.advance(0.5)
    assert sim.slots_launched() == ["a[0]", "a[1]", "a[1]"]


def test_a_providers_soft_notice_keeps_new_workers_off_the_host() -> None:
    sim = started(1, {"a": 1}, max_np=3)
    sim.job.discovered(DiscoveredHosts(ready={"a": 1, "b": 1, "c": 1}, soft={"b": "rebalance recommendation"}),
                       sim.now)
    sim._collect()
    assert sim.slots_launched() == ["a[0]", "c[0]"]


@pytest.mark.parametrize("from_provider", [False, True])
def test_status_says_a_host_with_a_soft_notice_is_noticed_not_ready(from_provider: bool) -> None:
    """Review h24: a spare on a host with a soft notice showed under a "ready" host row while it counted as not
    ready; the host keeps its workers and takes no new one."""
    from cloud_elastic.config import JobConfig
    from cloud_elastic.driver.job.status_reply import status_reply
    sim = started(2, {"a": 1, "b": 1}, max_np=2)
    if from_provider:
        sim.job.discovered(DiscoveredHosts(ready={"a": 1, "b": 1}, soft={"b": "rebalance recommendation"}), sim.now)
    else:
        sim.job.notice("b", Drain(reason="rebalance recommendation"), sim.now, source="aws-imds", soft=True)
    sim._collect()
    reply = status_reply(sim.job, JobConfig(command=("python", "t.py"), num_proc=2, min_np=1, max_np=2),
                         provider="static", now=sim.now, wall_now=sim.now, uptime_s=1)
    states = {row.host: (row.state, [w.state for w in row.workers]) for row in reply.hosts}
    assert states == {"a": ("ready", ["training"]), "b": ("noticed", ["training"])}


def test_a_notice_for_rank_0s_host_hands_rank_0_to_the_oldest_survivor() -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    sim.commit("a[0]", "b[0]", "c[0]", count=7)
    sim.job.notice("a", Drain(deadline=T0 + 120, reason="spot interruption"), sim.now, source="aws-imds")
    sim._collect()
    assert_round(sim.join("b[0]", "c[0]", reason="update"), 2, needs_sync=False)
    assert sim.layout() == ["b[0]", "c[0]"]
    assert isinstance(sim.join("a[0]", reason="update")["a[0]"], ExitOrder)
    sim.exit("a[0]", CLEAN)
    assert sim.outcome is None and sim.released == [Release("a", None)]


@pytest.mark.parametrize("path", ["tick", "discovery"])
def test_a_host_removed_after_the_grace_says_so_in_its_event(path: str) -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, missing_grace=10)
    sim.discover({"a": 1})
    if path == "tick":
        sim.advance(11)
    else:
        sim.now += 11  # the next discovery answer comes after the grace, before any tick
        sim.discover({"a": 1})
    removed = [f["removed"] for kind, f in sim.events if kind == "hosts_changed" and f["removed"]]
    assert removed == [[{"host": "b", "reason": "missing from discovery for 10s (--host-missing-grace)"}]]
