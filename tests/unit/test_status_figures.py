"""What status and the metrics call steps are optimizer steps, and a commit is called a commit (review s54: a job
committing every 10 steps at ~6.5 steps/s showed 'steps/s 0.62, last commit step 12' at step 120)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.control_plane import ControlPlane
from cloud_elastic.metrics import MetricsServer, StepRate
from cloud_elastic.status import StatusReply, render_status
from tests.unit.test_job import T0, Sim

pytestmark = pytest.mark.timeout(30)


def _plane(sim: Sim, clock: list[float], metrics: MetricsServer) -> ControlPlane:
    cond = JobCondition()
    cond.watch(sim.job)
    return ControlPlane(sim.job, cond, JobConfig(command=("x",), num_proc=2, min_np=1, max_np=2),
                        sinks=SimpleNamespace(sink=SimpleNamespace(emit=lambda *a, **k: None), metrics=metrics),
                        clock=lambda: clock[0], stop=lambda *a: None, record_events=lambda: None)


def _poll(plane: ControlPlane, sim: Sim, worker: str, steps: int, commit: int) -> None:
    plane.handle("poll", {"worker": worker, "round": sim.job.round, "update_gen": 0, "abort_round": 0,
                          "commits": commit, "commit_seq": commit, "steps": steps})


def test_status_shows_rank_0_s_optimizer_steps_per_second_and_names_the_commit_a_commit() -> None:
    sim = Sim(2)
    sim.discover({"a": 1, "b": 1})
    sim.join("a[0]", "b[0]")
    rank0, other = (sim.job.workers[sim.id(s)] for s in ("a[0]", "b[0]"))
    if rank0.rank != 0:
        rank0, other = other, rank0
    clock = [T0]
    metrics = MetricsServer("t", 0, clock=lambda: clock[0])  # not started: read from its registry
    plane = _plane(sim, clock, metrics)
    for second in range(13):  # 6.5 steps a second, a commit every 10 steps
        clock[0] = T0 + second
        steps = int(6.5 * second)
        _poll(plane, sim, rank0.worker_id, steps, steps // 10)
        _poll(plane, sim, other.worker_id, steps, steps // 10)  # not rank 0: feeds neither figure
    reply = StatusReply.from_json(plane.handle("status", {"worker": "cli:status"}))
    assert reply.steps_per_s == pytest.approx(6.5, abs=0.05) and reply.commit_step == 7
    assert "steps/s 6.50, last commit #7, resets 0" in render_status(reply, now=T0)
    scraped = metrics.registry.get_sample_value
    assert scraped("cloud_elastic_steps_per_second") == pytest.approx(6.5, abs=0.05)
    assert scraped("cloud_elastic_last_commit") == 7


def test_the_step_rate_starts_afresh_when_another_process_reports() -> None:
    """A new rank 0 counts its own process's steps: its count is not a continuation of the last one's."""
    rate = StepRate(window_s=30)
    rate.add(0, 100, "a")
    rate.add(2, 120, "a")
    assert rate.rate == 10.0
    rate.add(3, 5000, "b")  # a long-lived worker became rank 0
    assert rate.rate == 0.0
    rate.add(5, 5010, "b")
    assert rate.rate == 5.0
