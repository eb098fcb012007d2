"""examples/elastic_anywhere.py: the same script under ``cloud-elastic run`` and on Ray.

On Spark: ``tests/spark/test_spark_run_elastic.py`` runs the example's ``main()`` in that module's Spark
session (in CI the test with a Spark of its own took 33 s, against 10 s for the same training in the
shared session), against the same reference, :func:`under_run_results`.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

from tests.ray.conftest import REPO

# Generous bounds: these start whole engines, and the machine may be shared.
pytestmark = pytest.mark.timeout(420)

EXAMPLE = str(REPO / "examples" / "elastic_anywhere.py")


def _results(out: subprocess.CompletedProcess) -> list[dict]:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return [json.loads(line.split("RESULT ", 1)[1]) for line in out.stdout.splitlines() if "RESULT " in line]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    # SPARK_LOCAL_IP: the example's own Spark advertises loopback, not the machine's interface address.
    # PYSPARK_PYTHON: Spark's Python workers use this interpreter (else "python3" from PATH, which may lack torch).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               SPARK_LOCAL_IP="127.0.0.1")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=360)


def same_training(results: list[dict], size: int) -> None:
    assert sorted(r["rank"] for r in results) == list(range(size)), results
    assert all(r["size"] == size and r["step"] == 10 for r in results), results
    assert len({r["checksum"] for r in results}) == 1, results


@functools.cache
def under_run_results() -> list[dict]:
    """The example's results under ``cloud-elastic run`` (-np 2, 10 steps): the reference the engines must match.

    Computed once per pytest process (it starts a job: 7-8 s), for Ray here and for Spark in tests/spark."""
    out = _run([sys.executable, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:2",
                sys.executable, EXAMPLE, "--steps", "10"])
    results = _results(out)
    same_training(results, 2)
    return results


@pytest.fixture(scope="module")
def under_run() -> list[dict]:
    """The example's results under ``cloud-elastic run``: the reference the engines must match."""
    return under_run_results()


@pytest.mark.integration
def test_the_example_under_cloud_elastic_run(under_run):
    assert len(under_run) == 2


@pytest.mark.ray
def test_the_example_on_ray_returns_its_results_in_rank_order_with_identical_replicas_the_same_model(nodes, under_run):
    # main() calls ElasticRayExecutor(min_np=2, max_np=2).run(train, kwargs={"steps": 10}) and prints what it
    # returns in that order: the job of a test of its own in test_ray_executor.py before (two more actors,
    # each a Ray worker process importing torch: 7 CPU-s).
    nodes.add(2)
    on_ray = _results(_run([sys.executable, EXAMPLE, "--ray", nodes.cluster.address, "--steps", "10",
                            "--min-np", "2", "--max-np", "2"]))
    assert [r["rank"] for r in on_ray] == [0, 1], on_ray
    same_training(on_ray, 2)  # the size, the steps and one checksum on every rank
    assert on_ray[0]["checksum"] == under_run[0]["checksum"]

