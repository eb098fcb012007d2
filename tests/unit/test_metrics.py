"""Prometheus metrics derived from a job's events, scraped over real HTTP."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest

from cloud_elastic.metrics import MetricsServer, StepRate

from .recorded_events import TIMELINE

pytestmark = pytest.mark.timeout(20)


def _scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_scraped_metrics_follow_the_recorded_job() -> None:
    now = [100.0]
    server = MetricsServer("5f3a9c1e", 0, bind="127.0.0.1", clock=lambda: now[0])
    server.start()
    try:
        for _, kind, fields in TIMELINE[:-1]:  # everything but job_finished
            server.emit(kind, **fields)
        server.observe_discovery(0.2)
        server.observe_discovery(1.5, error="retryable")
        for steps, commit in ((80, 8), (90, 9), (100, 10)):
            server.observe_progress(steps, commit, "a[0]#1")
            now[0] += 2.0
        metrics = _scrape(server.port)
    finally:
        server.close()
    assert metrics['cloud_elastic_job_info{job="5f3a9c1e"}'] == 1
    assert metrics["cloud_elastic_world_size"] == 2
    assert metrics["cloud_elastic_round"] == 4
    assert metrics["cloud_elastic_resets_total"] == 3
    assert metrics["cloud_elastic_rollbacks_total"] == 1
    assert metrics["cloud_elastic_steps_lost_total"] == 7
    assert metrics['cloud_elastic_notices_total{source="aws"}'] == 1
    assert metrics["cloud_elastic_worker_failures_total"] == 1
    assert metrics["cloud_elastic_workers_left_total"] == 1
    assert metrics["cloud_elastic_checkpoint_failures_total"] == 1
    assert metrics["cloud_elastic_last_commit"] == 10
    assert metrics["cloud_elastic_steps_per_second"] == 5.0  # 20 steps in 4 s
    assert metrics["cloud_elastic_discovery_latency_seconds_count"] == 2
    assert metrics["cloud_elastic_discovery_latency_seconds_sum"] == 1.7
    assert metrics['cloud_elastic_discovery_errors_total{kind="retryable"}'] == 1
    assert metrics["cloud_elastic_cost_dollars_total"] == 0.0125  # the recorded cost event's running total
    assert metrics["cloud_elastic_cost_dollars_per_hour"] == 1.8
    assert metrics["cloud_elastic_spares"] == 1  # the recorded spares event: one spare waiting


def test_closed_server_stops_answering_and_two_servers_do_not_share_metrics() -> None:
    first, second = MetricsServer("a", 0, bind="127.0.0.1"), MetricsServer("b", 0, bind="127.0.0.1")
    first.start()
    second.start()
    first.emit("rollback", commit_step=3, steps_lost=2)
    assert _scrape(second.port)["cloud_elastic_rollbacks_total"] == 0
    port = first.port
    first.close()
    second.close()
    with pytest.raises(OSError):
        _scrape(port)


def test_step_rate_restarts_after_a_rollback_and_slides() -> None:
    rate = StepRate(window_s=10)
    rate.add(0, 0)
    assert rate.rate == 0.0
    rate.add(2, 10)
    assert rate.rate == 5.0
    rate.add(3, 4)  # a count that fell is not a rise
    assert rate.rate == 0.0
    for t in range(4, 40):
        rate.add(t, 4 + (t - 3) * 2)
    assert rate.rate == 2.0


def test_missing_prometheus_client_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from cloud_elastic.metrics import MetricsServer\n"
        "from cloud_elastic.errors import ConfigError\n"
        "try:\n    MetricsServer('j', 0)\nexcept ConfigError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20).stdout
    assert out.strip() == "--metrics-port needs the prometheus-client package: pip install 'cloud-elastic[metrics]'"


def test_a_booting_host_is_no_worker_failure_and_checkpoints_not_written_are_counted() -> None:
    server = MetricsServer("j", 0)
    failed = {"host": "a", "slot": 0, "exit_code": None, "blacklisted_s": 10.0}
    for _ in range(3):
        server.emit("worker_failed", **failed, booting=True)
    server.emit("worker_failed", **failed)
    for n in (1, 2):
        server.emit("checkpoint_failed", reason="could not write checkpoint /c/x: denied", failed_in_a_row=n,
                    since_s=2.0 * n)
    value = server.registry.get_sample_value
    assert value("cloud_elastic_worker_failures_total") == 1
    assert value("cloud_elastic_host_unreachable_total") == 3
    assert value("cloud_elastic_checkpoint_failures_total") == 2


def test_the_cost_carried_from_a_previous_driver_is_there_before_any_event() -> None:
    server = MetricsServer("j", 0)
    server.carry_cost(4.5)
    assert server.registry.get_sample_value("cloud_elastic_cost_dollars_total") == 4.5
    server.emit("cost", dollars=4.75, dollars_per_hour=1.0, slot_hours=3.0)  # the running total, carried included
    assert server.registry.get_sample_value("cloud_elastic_cost_dollars_total") == 4.75
