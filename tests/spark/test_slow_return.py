"""A training function whose return value is slow to pickle (a large state_dict) still succeeds on Spark.

The worker keeps heartbeating while its value is pickled for the task: see tests/ray/test_slow_return.py.
"""

from __future__ import annotations

import pytest

from tests.ray.conftest import load_example
from tests.ray.test_slow_return import train_and_return_slowly

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def test_a_return_value_slower_to_pickle_than_the_heartbeat_timeout_comes_back(spark):
    from cloud_elastic.spark import run_elastic

    results = run_elastic(train_and_return_slowly, kwargs={"example": load_example("pyspark"), "steps": 4},
                          num_proc=1, min_np=1, max_np=1, heartbeat_timeout=5.0)
    assert [(r["rank"], r["step"], r["blob"]) for r in results] == [(0, 4, {})]
