"""A training function whose return value is slow to serialise (a large state_dict) still succeeds on Ray.

The worker keeps heartbeating until the value is handed over: the driver gives up a completed worker that
stays silent past ``heartbeat_timeout`` (:data:`HEARTBEAT_TIMEOUT_S` here), and serialising this value takes longer
than that.
"""

from __future__ import annotations

import time

import pytest

from tests.ray.conftest import load_example

pytestmark = [pytest.mark.ray, pytest.mark.timeout(360)]

#: The jobs' heartbeat timeout (here and in tests/spark's twin of this test): six heartbeat intervals (0.5 s), and
#: the shortest these tests use on a loaded machine. :data:`SERIALISE_S` must exceed it; both tests wait all of
#: SERIALISE_S out.
HEARTBEAT_TIMEOUT_S = 3.0
#: Longer than :data:`HEARTBEAT_TIMEOUT_S`, with room for the driver's check: a worker silent while its value is
#: serialised would be given up before it is handed over.
SERIALISE_S = HEARTBEAT_TIMEOUT_S + 2.0


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
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=1, max_np=1,
                                                                    heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S),
                                  cpus_per_slot=1)
    executor.start()
    results = executor.run(train_and_return_slowly, kwargs={"example": load_example(), "steps": 4})
    assert [(r["rank"], r["step"], r["blob"]) for r in results] == [(0, 4, {})]
