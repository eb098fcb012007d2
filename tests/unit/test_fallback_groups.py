"""Several fallback groups, what the job reports of unpriced slots, and what it lowers at the end
(``providers/multi.py``, ``driver/job/sourcing.py``, ``driver/runtime/raised.py``, ``metrics.py``)."""

from __future__ import annotations

import logging
import threading

import pytest

from cloud_elastic.driver.job.actions import SetCapacity
from cloud_elastic.providers.api import DiscoveredHosts
from cloud_elastic.providers.multi import MultiSourceDiscovery
from cloud_elastic.providers.sources import SourceSpec
from tests.unit.test_providers_multi import Scripted, spec

pytestmark = pytest.mark.timeout(30)


def test_unpriced_slot_hours_are_a_metric_beside_the_cost_carried_included():
    pytest.importorskip("prometheus_client")
    from cloud_elastic.metrics import MetricsServer

    server = MetricsServer("j", 0)
    server.carry_cost(4.5, 2.0)  # the previous driver's figures
    value = server.registry.get_sample_value
    assert value("cloud_elastic_cost_unpriced_slot_hours_total") == 2.0
    server.emit("cost", dollars=4.75, dollars_per_hour=1.0, slot_hours=4.0, unpriced_slot_hours=2.5)
    assert value("cloud_elastic_cost_unpriced_slot_hours_total") == 2.5
    server.emit("job_finished", outcome="succeeded", exit_code=0, resets=0, wall_s=1.0, cost=5.0,
                slot_hours=5.0, unpriced_slot_hours=3.0)
    assert value("cloud_elastic_cost_unpriced_slot_hours_total") == 3.0
    assert value("cloud_elastic_cost_dollars_total") == 5.0
