"""driver/job/health.py in the job: stragglers drained without a rollback, hand drains, failed self-tests."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.health import faster_without
from cloud_elastic.driver.job.elastic_job import WorkerState
from tests.unit.test_job import CLEAN, Sim, assert_round, started

pytestmark = pytest.mark.timeout(30)

S = WorkerState


def beat(sim: Sim, seconds: float, compute: dict[str, float]) -> None:
    """Time passes; every worker heartbeats every 0.5 s with its compute time per step (by slot)."""
    end = sim.now + seconds
    while sim.now < end:
        sim.now = min(end, sim.now + 0.5)
        for slot, figure in compute.items():
            w = sim.job.workers.get(sim.id(slot))
            if w is not None and w.alive:
                sim.job.heartbeat(w.worker_id, sim.now, compute_s=figure)
        sim.job.tick(sim.now)
        sim._collect()


def test_the_rule_compares_work_per_second_with_and_without_the_slowest():
    assert faster_without(0.4, [0.1, 0.1])  # 2 at 0.1 s beat 3 at 0.4 s
    assert not faster_without(0.12, [0.1, 0.1])  # 3 at 0.12 s beat 2 at 0.1 s
    assert not faster_without(0.5, [])


def test_a_worker_twice_as_slow_for_the_window_drains_at_its_next_commit_and_its_slot_is_blacklisted():
    sim = started(3, {"a": 3}, min_np=1, straggler_factor=1.5, straggler_window_s=10)
    slow = {"a[0]": 0.1, "a[1]": 0.1, "a[2]": 0.3}
    beat(sim, 9, slow)
    assert sim.job.workers[sim.id("a[2]")].state is S.RUNNING  # not yet for the whole window
    beat(sim, 3, slow)
    straggler = sim.job.workers[sim.id("a[2]")]
    assert straggler.state is S.DRAINING and straggler.why.startswith("straggler: 0.300 s of compute per step")
    event = [f for kind, f in sim.events if kind == "straggler"]
    assert len(event) == 1 and event[0]["compute_s"] == 0.3 and event[0]["median_s"] == 0.1
    assert sim.blocked("a[2]")
    assert sim.poll("a[0]").update_gen == 1 and sim.job.abort_round == 0  # a graceful change: no rollback
    replies = sim.join("a[0]", "a[1]", reason="update")
    assert_round(replies, 2, needs_sync=False)
    sim.join("a[2]", reason="update")
    sim.exit("a[2]", CLEAN)
    left = [f for kind, f in sim.events if kind == "worker_left"]
    assert left[-1]["reason"].startswith("straggler:")


def test_a_slow_spell_shorter_than_the_window_drains_nobody():
    sim = started(3, {"a": 3}, min_np=1, straggler_factor=1.5, straggler_window_s=10)
    for _ in range(4):
        beat(sim, 6, {"a[0]": 0.1, "a[1]": 0.1, "a[2]": 0.3})
        beat(sim, 1, {"a[0]": 0.1, "a[1]": 0.1, "a[2]": 0.1})
    assert not [kind for kind, _ in sim.events if kind == "straggler"]


def test_a_straggler_is_kept_when_it_would_take_the_job_below_min_np(caplog):
    sim = started(3, {"a": 3}, min_np=3, straggler_factor=1.5, straggler_window_s=5)
    beat(sim, 20, {"a[0]": 0.1, "a[1]": 0.1, "a[2]": 0.3})
    assert sim.job.workers[sim.id("a[2]")].state is S.RUNNING
    assert caplog.text.count("below --min-np 3") == 1  # said once, not every second


def test_a_straggler_is_kept_when_the_job_would_not_be_faster_without_it():
    # Two workers, the slow one 1.6x: 2 at 0.16 s do more than 1 at 0.1 s.
    sim = started(2, {"a": 2}, min_np=1, straggler_factor=1.2, straggler_window_s=5)
    beat(sim, 20, {"a[0]": 0.1, "a[1]": 0.16})
    assert sim.job.workers[sim.id("a[1]")].state is S.RUNNING


def test_the_straggler_watch_is_off_at_factor_zero():
    sim = started(3, {"a": 3}, min_np=1, straggler_factor=0, straggler_window_s=1)
    beat(sim, 20, {"a[0]": 0.1, "a[1]": 0.1, "a[2]": 5.0})
    assert sim.job.workers[sim.id("a[2]")].state is S.RUNNING


def test_an_operator_drains_one_slot_or_a_whole_host():
    sim = started(3, {"a": 2, "b": 1}, min_np=1)
    sim.job.fixed.entered(sim.id("a[0]"))  # an elastic script (a fixed-size one: test_operator_drain_fixed_size.py)
    done, message = sim.job.drain("a", 1, sim.now)
    assert done and "leaves at its next commit" in message
    assert sim.job.workers[sim.id("a[1]")].state is S.DRAINING and sim.blocked("a[1]")
    # Nothing failed there: status says 0 failures, and the slot's next real failure is its first.
    [(slot, _, failures)] = sim.job.hosts.blacklist.blocked_slots(sim.now)
    assert (slot.host, slot.index, failures) == ("a", 1, 0)
    assert sim.job.drain("c", None, sim.now) == (False, "no host c in this job")
    assert sim.job.drain("a", 7, sim.now) == (False, "no worker on a[7]")
    done, message = sim.job.drain("b", None, sim.now)
    sim._collect()
    assert done and message == ("host b drains: its 1 worker(s) leave at their next commit; no new worker is placed "
                                "there until it leaves discovery")
    assert sim.job.workers[sim.id("b[0]")].state is S.DRAINING
    assert [f["source"] for kind, f in sim.events if kind == "notice"] == ["operator"]


def test_a_newcomer_whose_device_self_test_failed_is_refused_with_its_reason():
    sim = started(2, {"a": 2}, max_np=3, min_np=1)
    sim.discover({"a": 2, "b": 1})
    sim.job.registered(sim.id("b[0]"), sim.now)
    sim.job.unhealthy(sim.id("b[0]"), "the device self-test on cuda:0 failed: a matrix product was wrong", sim.now)
    sim._collect()
    sick = sim.job.workers[sim.id("b[0]")]
    assert sick.state is S.LOST and sim.blocked("b[0]")
    failed = [f for kind, f in sim.events if kind == "worker_failed"][-1]
    assert "self-test" in failed["reason"]
    assert sim.job.abort_round == 0  # it never joined a round: nobody rolls back


def test_one_of_two_workers_ten_times_slower_is_a_straggler():
    # Found by review: against a median that counted the slow worker itself, one of two could never be 2x it.
    sim = started(2, {"a": 2}, min_np=1, straggler_factor=2, straggler_window_s=5)
    beat(sim, 8, {"a[0]": 0.1, "a[1]": 1.0})
    assert sim.job.workers[sim.id("a[1]")].state is S.DRAINING
    assert sim.job.workers[sim.id("a[0]")].state is S.RUNNING
    (event,) = [f for kind, f in sim.events if kind == "straggler"]
    assert (event["compute_s"], event["median_s"]) == (1.0, 0.1)


def test_a_slow_host_among_two_is_drained_whole_under_whole_hosts():
    sim = started(4, {"a": 2, "b": 2}, min_np=2, straggler_factor=2, straggler_window_s=5, whole_host_slots=2)
    beat(sim, 8, {"a[0]": 0.1, "a[1]": 0.1, "b[0]": 1.0, "b[1]": 1.0})
    states = {slot: sim.job.workers[sim.id(slot)].state for slot in ("a[0]", "a[1]", "b[0]", "b[1]")}
    assert states == {"a[0]": S.RUNNING, "a[1]": S.RUNNING, "b[0]": S.DRAINING, "b[1]": S.DRAINING}, states


def test_each_workers_reference_is_the_median_of_the_others():
    import random
    import statistics

    from cloud_elastic.driver.job.health import _medians_of_others

    rng = random.Random(7)
    for n in range(1, 12):
        figures = {f"w{i}": rng.choice([0.1, 0.2, 0.3, rng.random()]) for i in range(n)}
        hosts = {wid: f"h{i % 3}" for i, wid in enumerate(figures)}
        for host_of in (None, hosts):
            got = _medians_of_others(figures, host_of)
            for wid in figures:
                rest = [s for k, s in figures.items() if (host_of[k] != host_of[wid] if host_of else k != wid)]
                assert got[wid] == (statistics.median(rest) if rest else None), (n, wid, host_of)
