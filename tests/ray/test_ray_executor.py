"""ElasticRayExecutor on a real local Ray cluster: real actors, real Gloo groups between them."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from cloud_elastic.errors import JobFailed
from cloud_elastic.ray import ElasticRayExecutor
from tests.ray.conftest import load_example, wait_for

# Generous bounds: a Ray cluster starts on a machine that may be shared.
pytestmark = [pytest.mark.ray, pytest.mark.timeout(360)]


def _executor(min_np: int, max_np: int, **more) -> ElasticRayExecutor:
    settings = ElasticRayExecutor.create_settings(min_np=min_np, max_np=max_np, **more)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    return executor


class _Run:
    """``executor.run`` on a thread, so the test can change the cluster meanwhile."""

    def __init__(self, executor: ElasticRayExecutor, fn, kwargs: dict) -> None:
        self.results = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._go, args=(executor, fn, kwargs), daemon=True)
        self._thread.start()

    def _go(self, executor, fn, kwargs) -> None:
        try:
            self.results = executor.run(fn, kwargs=kwargs)
        except BaseException as exc:  # handed to the test
            self.error = exc

    def ended(self) -> str | None:
        """None while ``executor.run`` runs; once it ended, how (for ``wait_for``)."""
        if self._thread.is_alive():
            return None
        if self.error is not None:
            first = str(self.error).splitlines()[0] if str(self.error) else ""
            return f"executor.run ended with {type(self.error).__name__}: {first}"
        return f"executor.run returned {self.results!r}"

    def join(self, timeout_s: float) -> list:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "executor.run did not return"
        if self.error is not None:
            raise self.error
        return self.results


def _progress(directory: Path) -> list[dict]:
    rows = []
    for path in directory.glob("*"):
        if path.suffix != ".tmp":
            try:
                rows.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass  # being replaced right now
    return rows


def _round_of(directory: Path, size: int, hosts: set[str] | None = None, after_step: int = 0):
    """Workers that reported a step past ``after_step`` in a round of ``size`` (on exactly ``hosts``)."""
    rows = [r for r in _progress(directory) if r["size"] == size and r["step"] > after_step]
    if hosts is not None and {r["host"] for r in rows} != hosts:
        return None
    return rows if len(rows) == size else None


def test_training_survives_a_node_removed_and_admits_a_node_added(nodes, tmp_path):
    a, b = nodes.add(2)
    progress = tmp_path / "progress"
    progress.mkdir()
    stop = tmp_path / "stop"
    example = load_example()
    run = _Run(_executor(1, 2), example.train,
               {"steps": 5, "step_sleep": 0.05, "stop_file": str(stop), "progress_dir": str(progress)})
    first = wait_for(lambda: _round_of(progress, 2, {a.node_id, b.node_id}), 120, "two workers training together",
                     ended=run.ended)

    nodes.remove(b)  # the node dies with its worker: the survivor rolls back and goes on alone
    alone = wait_for(lambda: _round_of(progress, 1, {a.node_id}, max(r["step"] for r in first)), 120,
                     "the survivor training alone", ended=run.ended)

    c, = nodes.add(1)  # a new node joins: it is admitted and gets the state
    wait_for(lambda: _round_of(progress, 2, {a.node_id, c.node_id}, alone[0]["step"]), 120,
             "the survivor and the new node training together", ended=run.ended)
    stop.touch()
    results = run.join(120)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results), results
    assert len({r["checksum"] for r in results}) == 1, results
    assert results[0]["step"] == results[1]["step"] > alone[0]["step"]


def test_a_node_ray_drains_leaves_at_a_commit_without_a_rollback(nodes, tmp_path, caplog):
    import ray
    from ray.core.generated import autoscaler_pb2

    a, b = nodes.add(2)
    progress = tmp_path / "progress"
    progress.mkdir()
    stop = tmp_path / "stop"
    example = load_example()
    run = _Run(_executor(1, 2), example.train,
               {"steps": 5, "step_sleep": 0.05, "stop_file": str(stop), "progress_dir": str(progress)})
    wait_for(lambda: _round_of(progress, 2, {a.node_id, b.node_id}), 120, "two workers training together",
             ended=run.ended)
    gcs = ray._raylet.GcsClient(address=nodes.cluster.address)
    caplog.set_level("INFO", logger="cloud_elastic.driver.job")  # before the drain: its first line may come at once
    accepted, why = gcs.drain_node(
        b.node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"), "spot", 0
    )
    assert accepted, why
    alone = wait_for(lambda: _round_of(progress, 1, {a.node_id}), 120, "the other worker training alone",
                     ended=run.ended)
    stop.touch()
    results = run.join(120)
    assert [r["size"] for r in results] == [1]
    messages = [r.getMessage() for r in caplog.records]
    assert any("will leave: " in m for m in messages), messages
    assert not any("roll back" in m for m in messages), messages
    assert results[0]["step"] >= alone[0]["step"]


class _HorovodDiscovery:
    """A Horovod host discovery object, as a ported script passes it in ``override_discovery``."""

    def __init__(self, hosts: dict[str, int]) -> None:
        self.hosts = hosts

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        return dict(self.hosts)


def test_a_failing_training_function_is_the_cause_of_the_job_failure_raised_in_the_caller(nodes):
    a, b = nodes.add(2)

    def broken() -> None:
        import cloud_elastic.torch as hvd

        hvd.init()
        raise ValueError(f"bad batch on rank {hvd.rank()}")

    # Built as a script ported from Horovod builds it: its arguments in Horovod's order, and a Horovod discovery
    # object naming the nodes (by node id here: the test cluster's nodes share one IP).
    settings = ElasticRayExecutor.create_settings(min_np=2, max_np=2)
    executor = ElasticRayExecutor(settings, False, 1, None, None, _HorovodDiscovery({a.node_id: 1, b.node_id: 1}))
    executor.start()
    with pytest.raises(JobFailed) as failed:
        executor.run(broken)
    assert isinstance(failed.value.__cause__, ValueError)
    assert "bad batch on rank" in str(failed.value.__cause__)


def test_a_spot_notice_from_a_nodes_metadata_drains_its_worker_at_a_commit_without_a_rollback(nodes, tmp_path, caplog):
    from tests.emulator.fake_metadata import FakeAWSMetadata, per_host

    # Each node on its own loopback address, each with its own fake IMDS on one shared port: the
    # watcher on a node expands {host} to its node's IP, as on EC2 each VM reaches its own IMDS.
    a, = nodes.add(1, node_ip_address="127.0.0.2")
    b, = nodes.add(1, node_ip_address="127.0.0.3")
    progress = tmp_path / "progress"
    progress.mkdir()
    stop = tmp_path / "stop"
    example = load_example()
    caplog.set_level("INFO", logger="cloud_elastic.driver.job")
    with per_host(FakeAWSMetadata, ["127.0.0.2", "127.0.0.3"]) as fakes:
        executor = ElasticRayExecutor(
            ElasticRayExecutor.create_settings(min_np=1, max_np=2, notice_watcher="aws"), cpus_per_slot=1,
            env_vars={"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{fakes['127.0.0.2'].port}",
                      "AWS_EC2_METADATA_DISABLED": "false"},
        )
        executor.start()
        run = _Run(executor, example.train,
                   {"steps": 5, "step_sleep": 0.05, "stop_file": str(stop), "progress_dir": str(progress)})
        wait_for(lambda: _round_of(progress, 2, {a.node_id, b.node_id}), 120, "two workers training together",
                 ended=run.ended)
        for fake in fakes.values():  # both nodes' watchers are up (one token each), so the notice is news
            assert fake.wait_for(lambda f=fake: f.count("spot/instance-action") > 0, 60), "no watcher on a node"
        fakes["127.0.0.3"].set_spot_action("terminate", time.time() + 120)
        alone = wait_for(lambda: _round_of(progress, 1, {a.node_id}), 120, "the other worker training alone",
                         ended=run.ended)
        stop.touch()
        results = run.join(120)
    assert [r["size"] for r in results] == [1]
    assert results[0]["step"] >= alone[0]["step"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("notice from aws" in m and f"for host {b.node_id}" in m for m in messages), messages
    assert not any("notice from" in m and a.node_id in m for m in messages), messages
    assert any(f"host {b.node_id} drained" in m and "0 steps lost" in m for m in messages), messages
    assert not any("roll back" in m for m in messages), messages
