"""A fallback raise held back while spot has not answered, over moto (``providers/multi.py``,
``driver/runtime/raised.py``): once spot answers with the slot wanted, the group gets no SetDesiredCapacity."""

from __future__ import annotations

import pytest

from cloud_elastic.errors import RetryableDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts
from tests.emulator.moto_env import clients, make_group
from tests.emulator.test_multi_source import desired
from tests.emulator.test_multi_source_restart import _sources
from tests.unit.test_fallback_groups import _capacity_events, _job, _run
from tests.unit.test_providers_multi import Scripted

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def test_a_held_back_raise_no_longer_wanted_is_never_sent(aws):
    """Review of 7680445: spot throttled twice, then answering with its host: od was set to 1 in the find() that
    read that answer, then to 0 (2 calls, an instance paid for nothing), with one 'capacity' event."""
    group = "held-dropped"
    make_group(aws.url, group, size=0, instance_type="g4dn.xlarge", cidr="10.94.1.0/24")
    clients(aws.url)[0].update_auto_scaling_group(AutoScalingGroupName=group, MaxSize=10)
    sim = _job(1)
    spot = Scripted(RetryableDiscoveryError("Throttling"), RetryableDiscoveryError("Throttling"),
                    DiscoveredHosts(ready={"a0": 1}))
    multi = _sources(aws, spot, sim, group)
    try:
        _run(sim, multi, 6)
    finally:
        multi.close()
    assert aws.count("SetDesiredCapacity") == 0, "the held-back raise went out once spot answered with the slot"
    assert desired(aws, group) == 0 and _capacity_events(sim) == [("od", 1)]  # the ask, never sent
