"""Which fallback workers leave first when Spot comes back, and the cost figures of idle and $0 slots
(``driver/job/sourcing.py``, ``cost.py``; review h14)."""

from __future__ import annotations

import pytest

from cloud_elastic.cost import CostMeter, CostSoFar
from cloud_elastic.driver.job.actions import SetCapacity
from cloud_elastic.driver.job.elastic_job import WorkerState
from cloud_elastic.providers.api import DiscoveredHosts
from cloud_elastic.providers.sources import SourceSpec
from tests.unit.test_job import CLEAN
from tests.unit.test_job_sourcing import OD, SPOT_A, Sourced

pytestmark = pytest.mark.timeout(10)

CHEAP = SourceSpec("od-cheap", "aws", price=4.0, fallback=True)
DEAR = SourceSpec("od-dear", "aws", price=6.0, fallback=True)
SPECS = {s.name: s for s in (SPOT_A, CHEAP, DEAR, OD)}


def show(sim: Sourced, hosts: dict[str, str], prices: dict[str, float] | None = None,
         slots: dict[str, int] | None = None) -> None:
    """Discovery shows ``hosts`` (host -> source), of ``slots`` (default 1 each), at ``prices`` (default: their
    sources')."""
    prices = {h: SPECS[s].price for h, s in hosts.items()} if prices is None else prices
    ready = {h: (slots or {}).get(h, 1) for h in hosts}
    sim.job.discovered(DiscoveredHosts(ready=ready, sources=hosts, prices=prices), sim.now)
    sim._collect()


def test_of_several_fallback_groups_the_dearest_workers_leave_first_not_the_newest():
    """Review h14 5c: with two fallback groups, the newest workers left first: the $4 ones, while the $6 one,
    older, stayed."""
    sim = Sourced(4, min_np=2, progress_timeout_s=0, sources=(SPOT_A, CHEAP, DEAR), host_slots=0)
    spot = {f"a{i}": "spot-a" for i in range(4)}
    show(sim, spot)
    sim.join(*sim.slots_launched())
    sim.commit(*sim.slots_launched())
    show(sim, {"a0": "spot-a", "y0": "od-dear"})  # 3 Spot hosts reclaimed; the dear group's host is up first
    for slot in ("a1[0]", "a2[0]", "a3[0]"):
        sim.exit(slot, CLEAN)
    sim.advance(1)
    show(sim, {"a0": "spot-a", "y0": "od-dear", "x0": "od-cheap", "x1": "od-cheap"})
    sim.advance(1)
    assert sim.slots_launched()[4:] == ["y0[0]", "x0[0]", "x1[0]"]  # the $6 worker is the oldest
    sim.join("a0[0]", "y0[0]", "x0[0]", "x1[0]")
    # Spot gives --min-np 2: no fallback slot is wanted; they leave as the job can spare them, the dearest first.
    show(sim, {"a0": "spot-a", "a1": "spot-a", "y0": "od-dear", "x0": "od-cheap", "x1": "od-cheap"})
    fallback = ("y0[0]", "x0[0]", "x1[0]")
    staying = [s for s in fallback if sim.state(s) in (WorkerState.RUNNING, WorkerState.WAITING)]
    assert staying == ["x0[0]"], "the $6 worker stayed, two $4 ones left"  # y0, then the newest $4 one, left


def test_an_idle_slot_without_a_price_is_left_out_of_the_fallback_alone_figure_once():
    """Review h14 4: it was subtracted as unpriced and again as idle: $0.00 "on the fallback alone" for an hour of
    one priced slot at the fallback's $2."""
    meter = CostMeter()
    meter.fallback_price = 2.0
    held = {"spot": (1, 0.2, 0), "od": (4, 1.0, 3)}  # od: 1 priced slot, 3 unpriced ones, which are the idle ones
    meter.advance(0.0, held, idle=3, idle_unpriced=3)
    meter.advance(3600.0, held, idle=3, idle_unpriced=3)
    s = meter.summary()
    assert (s.slot_hours, s.unpriced_slot_hours, s.idle_slot_hours) == pytest.approx((5.0, 3.0, 3.0))
    assert s.fallback_only == pytest.approx(2.0 * 2)  # the spot slot and od's priced one, at $2
    meter = CostMeter()  # idle slots that have a price are still left out (the price of the fallback policy)
    meter.fallback_price = 2.0
    meter.advance(0.0, {"od": (4, 4.0, 0)}, idle=3)
    meter.advance(3600.0, {})
    assert meter.summary().fallback_only == pytest.approx(2.0)


def test_the_job_counts_a_raised_hosts_idle_unpriced_slots_once():
    sim = Sourced(2, min_np=2, manage_capacity=True, progress_timeout_s=0, sources=(SPOT_A, OD), host_slots=0)
    show(sim, {"a0": "spot-a"})
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od", 1)]
    show(sim, {"a0": "spot-a", "od0": "od"}, prices={"a0": 1.0}, slots={"od0": 4})  # od0's price is not known
    sim.join(*sim.slots_launched())
    sim.advance(3600)
    s = sim.job.capacity.sourcing.summary(sim.now)
    assert s.unpriced_slot_hours == pytest.approx(4.0, rel=1e-3) and s.idle_slot_hours == pytest.approx(3.0, rel=1e-3)
    assert s.fallback_only == pytest.approx(4.0, rel=1e-3)  # a0's slot-hour at od's $4 (was $0.00)


def test_a_source_priced_at_0_stays_in_the_per_source_list_across_a_driver_restart():
    """Review h14 5a: listed at $0.00 by the driver that metered it, dropped by the one restarted after it."""
    meter = CostMeter()
    meter.advance(0.0, {"free": (1, 0.0, 0), "od": (1, 4.0, 0)})
    meter.advance(3600.0, {})
    assert meter.summary().by_source == pytest.approx({"free": 0.0, "od": 4.0})
    restarted = CostMeter()
    restarted.carry(meter.so_far())
    assert restarted.summary().by_source == pytest.approx({"free": 0.0, "od": 4.0})
    assert restarted.so_far() == CostSoFar(4.0, 2.0, 0.0, (("free", 0.0), ("od", 4.0)))
