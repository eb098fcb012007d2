"""A training function whose return value is slow to serialise (a large state_dict) still succeeds on Ray.

The worker keeps heartbeating until the value is handed over: the driver gives up a completed worker that
stays silent past ``heartbeat_timeout`` (5 s here), and serialising this value takes longer than that.
"""

from __future__ import annotations

import time

import pytest

from tests.ray.conftest import load_example

pytestmark = [pytest.mark.ray, pytest.mark.timeout(360)]

#: Longer than the jobs' 5 s heartbeat timeout, with room for the driver's check.
SERIALISE_S = 8.0


class SlowToSerialise:
    """Pickles (as Ray and Spark do with a return value) in :data:`SERIALISE_S`, into an empty dict."""

    def __reduce__(self):
        time.sleep(SERIALISE_S)  # stands in for serialising gigabytes
        return (dict, ())


def train_and_return_slowly(example, steps: int) -> dict:
    """``example.train`` whose result carries a value slow to serialise."""
    result = example.train(steps=steps)
    result["blob"] = SlowToSerialise()
    return result


def test_a_return_value_slower_to_serialise_than_the_heartbeat_timeout_comes_back(nodes):
    from cloud_elastic.ray import ElasticRayExecutor

    nodes.add(1)
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=1, max_np=1, heartbeat_timeout_s=5.0),
                                  cpus_per_slot=1)
    executor.start()
    results = executor.run(train_and_return_slowly, kwargs={"example": load_example(), "steps": 4})
    assert [(r["rank"], r["step"], r["blob"]) for r in results] == [(0, 4, {})]
