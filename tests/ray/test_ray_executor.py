"""ElasticRayExecutor on a real local Ray cluster: real actors, real Gloo groups between them."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from cloud_elastic.ray import ElasticRayExecutor
from tests.ray.conftest import load_example, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def _executor(min_np: int, max_np: int, **more) -> ElasticRayExecutor:
    settings = ElasticRayExecutor.create_settings(min_np=min_np, max_np=max_np, **more)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    return executor


def test_results_come_back_in_rank_order_with_identical_replicas(nodes):
    nodes.add(2)
    example = load_example()
    results = _executor(2, 2).run(example.train, kwargs={"steps": 12})
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 and r["step"] == 12 for r in results), results
    assert len({r["checksum"] for r in results}) == 1, results
