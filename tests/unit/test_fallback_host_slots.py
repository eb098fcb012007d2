"""How many hosts a raise of a fallback group asks when its hosts' slots are not known yet
(``driver/job/sourcing.py``, ``Sourcing._shares``).

Review h14 s5: Spot hosts of 1 GPU (g4dn.xlarge), an on-demand fallback of 4-GPU hosts (g4dn.12xlarge),
``-np 4 --min-np 4 --manage-capacity``: before any fallback host was seen its slots per host were taken from a
Spot host, so the group was raised to 3 hosts (12 GPUs) for 3 workers, and the 2 idle instances were paid for the
whole job (a group is never lowered while a worker runs on it). A group none of whose hosts has shown its slots is
now raised by one host; the rest is sized from the slots that host shows.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.actions import SetCapacity
from cloud_elastic.driver.job.sourcing import REASK_S
from cloud_elastic.providers.api import DiscoveredHosts
from cloud_elastic.providers.sources import SourceSpec
from tests.unit.test_job_sourcing import SPOT_A, Sourced

pytestmark = pytest.mark.timeout(10)

OD4 = SourceSpec("od", "aws", price=0.978, fallback=True)  # $3.912 an instance-hour over 4 GPUs


def show(sim: Sourced, spot: int, od: int, od_slots: int = 4) -> None:
    """Discovery shows ``spot`` 1-slot Spot hosts and ``od`` fallback hosts of ``od_slots`` slots."""
    ready = {**{f"a{i}": 1 for i in range(spot)}, **{f"od{i}": od_slots for i in range(od)}}
    sources = {h: "spot-a" if h.startswith("a") else "od" for h in ready}
    prices = {h: 0.3 if h.startswith("a") else 0.978 for h in ready}
    sim.job.discovered(DiscoveredHosts(ready=ready, sources=sources, prices=prices), sim.now)
    sim._collect()


def capacity_events(sim: Sourced) -> list[tuple[str, int]]:
    return [(f["source"], f["hosts"]) for k, f in sim.events if k == "capacity"]


def test_a_fallback_group_of_unseen_hosts_is_raised_by_one_host_not_sized_from_another_groups_hosts():
    sim = Sourced(4, min_np=4, manage_capacity=True, sources=(SPOT_A, OD4), host_slots=0)
    show(sim, spot=1, od=0)
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od", 1)], "sized from a 1-GPU Spot host: 3 hosts of 4 GPUs for 3 workers"
    sim.capacity.clear()
    show(sim, spot=1, od=0)
    sim.advance(REASK_S + 1)  # still booting: the same one host asked again, no larger
    assert sim.capacity == [SetCapacity("od", 1)] and capacity_events(sim) == [("od", 1)]
    sim.capacity.clear()
    show(sim, spot=1, od=1)  # its host shows 4 slots: the 3 fallback slots wanted fit on it
    sim.advance(REASK_S + 1)
    show(sim, spot=1, od=1)
    sim.advance(1)
    assert sim.capacity == [] and capacity_events(sim) == [("od", 1)]
    assert sorted(sim.slots_launched()) == ["a0[0]", "od0[0]", "od0[1]", "od0[2]"]


def test_the_rest_of_a_raise_is_sized_from_the_slots_the_groups_first_host_shows():
    sim = Sourced(8, min_np=8, manage_capacity=True, sources=(SPOT_A, OD4), host_slots=0)
    show(sim, spot=1, od=0)
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od", 1)]
    show(sim, spot=1, od=1)  # 4 slots: 7 wanted need 2 hosts of 4
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od", 1), SetCapacity("od", 2)]
    assert capacity_events(sim) == [("od", 1), ("od", 2)]
