"""The world size and the step rate between rounds: the metrics say what ``status`` says.

A reviewer's job (``-np 2 --min-np 2``, hosts 127.0.0.1:1 and 127.0.0.2:1) had both workers killed mid-training;
4 s later ``status`` said world size 0 and steps/s 10.30, and ``/metrics`` said ``cloud_elastic_world_size 2.0``
and ``cloud_elastic_steps_per_second 10.3``, for as long as the job waited for workers (up to
``--elastic-timeout``): the gauge was set by ``round_formed`` only, and the rate moved only with rank 0's
heartbeats, which had stopped. Alerts on "world size below N" or "rate 0" never fired.
"""

from __future__ import annotations

import math
import threading
import urllib.request
from types import SimpleNamespace

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.control_plane import ControlPlane
from cloud_elastic.metrics import LIVE_WAIT_S, LiveFigures, MetricsServer, StepRate
from cloud_elastic.status import StatusReply
from tests.unit.test_job import KILLED, Sim, started

pytestmark = pytest.mark.timeout(30)


def _plane(sim: Sim, metrics: MetricsServer) -> ControlPlane:
    cond = JobCondition()
    cond.watch(sim.job)
    return ControlPlane(sim.job, cond, JobConfig(command=("x",), num_proc=2, min_np=2, max_np=2),
                        sinks=SimpleNamespace(sink=SimpleNamespace(emit=lambda *a, **k: None), metrics=metrics),
                        clock=lambda: sim.now, stop=lambda *a: None, record_events=lambda: None)


def _rank0(sim: Sim) -> str:
    return next(w.worker_id for w in sim.job.workers.values() if w.rank == 0 and w.alive)


def _status(plane: ControlPlane) -> StatusReply:
    return StatusReply.from_json(plane.handle("status", {"worker": "cli:status"}))


def _train(sim: Sim, plane: ControlPlane, metrics: MetricsServer, seconds: int) -> None:
    """Rank 0 reports 10.3 optimizer steps a second (with a commit each), and the job's events reach the metrics."""
    rank0 = _rank0(sim)
    for second in range(seconds + 1):
        sim.now += 1.0 if second else 0.0
        steps = round(10.3 * second)
        plane.handle("poll", {"worker": rank0, "round": sim.job.round, "update_gen": 0, "abort_round": 0,
                              "commits": second, "commit_seq": second, "steps": steps})
        for slot in ("a[0]", "b[0]"):
            sim.job.heartbeat(sim.id(slot), sim.now, second, commit_seq=second)
    for kind, fields in sim.events:
        metrics.emit(kind, **fields)
    sim.events.clear()


def test_both_workers_killed_reads_world_size_0_and_rate_0_in_status_and_metrics_alike() -> None:
    sim = started(2, {"a": 1, "b": 1}, checkpointing=True)  # the job waits for --min-np, resuming from a checkpoint
    metrics = MetricsServer("t", 0, clock=lambda: sim.now)  # not started: read from its registry
    plane = _plane(sim, metrics)
    _train(sim, plane, metrics, 10)
    sim.job.checkpoint_saved(5, 5)
    value = metrics.registry.get_sample_value
    before = _status(plane)
    assert (before.world_size, before.steps_per_s) == (2, 10.3)
    assert (value("cloud_elastic_world_size"), value("cloud_elastic_steps_per_second")) == (2, pytest.approx(10.3))
    sim.exit("a[0]", KILLED)
    sim.exit("b[0]", KILLED)
    for kind, fields in sim.events:
        metrics.emit(kind, **fields)
    sim.advance(4)
    assert sim.outcome is None  # still waiting for workers
    after = _status(plane)
    assert (after.world_size, after.steps_per_s) == (0, 0.0), after
    assert value("cloud_elastic_world_size") == 0
    assert value("cloud_elastic_steps_per_second") == 0.0


def test_one_worker_killed_the_survivor_waiting_reads_as_status_does() -> None:
    sim = started(2, {"a": 1, "b": 1}, checkpointing=True)
    metrics = MetricsServer("t", 0, clock=lambda: sim.now)
    plane = _plane(sim, metrics)
    _train(sim, plane, metrics, 5)
    survivor = next(s for s in ("a[0]", "b[0]") if sim.id(s) == _rank0(sim))
    sim.exit("b[0]" if survivor == "a[0]" else "a[0]", KILLED)
    sim.join(survivor)  # it rolls back and waits at rendezvous for a second worker
    sim.advance(1)
    shown = _status(plane)
    assert shown.world_size == 0 and shown.phase == "below --min-np"
    assert metrics.registry.get_sample_value("cloud_elastic_world_size") == shown.world_size


def test_the_step_rate_reads_0_once_its_newest_sample_is_stale() -> None:
    rate = StepRate(window_s=30, stale_s=2.0)
    assert rate.as_of(0.0) is None  # nothing reported yet: unknown, not 0
    rate.add(0.0, 0, "a")
    rate.add(1.0, 10, "a")
    assert rate.as_of(1.0) == rate.as_of(3.0) == 10.0  # four 0.5 s heartbeats may be missed
    assert rate.as_of(3.5) == 0.0
    rate.add(4.0, 40, "a", stale_s=5.0)  # the next poll is held longer (a very large group)
    assert rate.as_of(8.0) == 10.0 and rate.as_of(9.5) == 0.0


def test_the_metric_reads_0_over_http_once_rank_0_stops_reporting() -> None:
    now = [100.0]
    server = MetricsServer("job", 0, clock=lambda: now[0])
    server.start()
    try:
        for t in range(3):
            now[0] = 100.0 + t
            server.observe_progress(10 * t, t, "a[0]#1")
        assert _scraped(server, "cloud_elastic_steps_per_second") == 10.0
        now[0] += 60.0  # the process was killed: no heartbeat since
        assert _scraped(server, "cloud_elastic_steps_per_second") == 0.0
    finally:
        server.close()


def test_a_scrape_while_the_driver_holds_the_jobs_lock_serves_the_last_figures() -> None:
    sim = started(2, {"a": 1, "b": 1}, checkpointing=True)
    metrics = MetricsServer("t", 0, clock=lambda: sim.now)
    plane = _plane(sim, metrics)
    _train(sim, plane, metrics, 3)
    value = metrics.registry.get_sample_value
    assert value("cloud_elastic_world_size") == 2
    held, release = threading.Event(), threading.Event()

    def busy_driver() -> None:
        with plane._cond:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=busy_driver)
    thread.start()
    try:
        held.wait(5)
        assert plane.live() is None
        assert value("cloud_elastic_world_size") == 2  # after LIVE_WAIT_S, not blocked for as long as the driver
    finally:
        release.set()
        thread.join(5)
    assert LIVE_WAIT_S <= 1.0


def test_after_job_finished_both_read_0_whatever_the_job_still_shows() -> None:
    server = MetricsServer("j", 0, clock=lambda: 0.0)
    server.follow(lambda: LiveFigures(3, 7.5))
    value = server.registry.get_sample_value
    assert (value("cloud_elastic_world_size"), value("cloud_elastic_steps_per_second")) == (3, 7.5)
    server.emit("job_finished", outcome="failed", exit_code=1, resets=0, wall_s=1.0)
    assert (value("cloud_elastic_world_size"), value("cloud_elastic_steps_per_second")) == (0, 0.0)


def test_without_anything_followed_the_metrics_read_the_events_and_nan_before_any_step() -> None:
    server = MetricsServer("j", 0, clock=lambda: 0.0)
    assert math.isnan(server.registry.get_sample_value("cloud_elastic_steps_per_second"))
    server.emit("round_formed", round=1, size=2, ranks={"a": [0, 1]}, synced=False)
    assert server.registry.get_sample_value("cloud_elastic_world_size") == 2


def _scraped(server: MetricsServer, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_one_scrape_reads_the_job_once_for_both_gauges() -> None:
    """Review h15: each gauge took the job's lock for its own reading (two instants, two waits on a busy driver)."""
    now, calls = [100.0], []
    metrics = MetricsServer("t", 0, clock=lambda: now[0])

    def live() -> LiveFigures:
        calls.append(now[0])
        return LiveFigures(3, 2.5)

    metrics.follow(live)
    text = metrics._render("text/plain")[0].decode()
    assert "cloud_elastic_world_size 3.0" in text and "cloud_elastic_steps_per_second 2.5" in text
    assert calls == [100.0]
    now[0] += 15.0  # the next scrape reads afresh
    metrics._render("text/plain")
    assert calls == [100.0, 115.0]
