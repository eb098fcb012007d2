"""Several host sources in the pure job (cloud_elastic.driver.job.sourcing): the choice rule and its ties,
the fallback and its --fallback-after, draining the fallback when cheaper slots return, the capacity the
job asks of a fallback group, and what the job costs."""

from __future__ import annotations

import pytest

from cloud_elastic.cost import CostMeter, CostSoFar
from cloud_elastic.driver.job.actions import SetCapacity
from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder, Finish, Launch, Release, Stop, WorkerState
from cloud_elastic.driver.job.hosts import Blacklist, HostManager
from cloud_elastic.driver.job.sourcing import FallbackRule, choose
from cloud_elastic.events import validate
from cloud_elastic.providers.api import DiscoveredHosts
from cloud_elastic.providers.sources import SourceSpec
from tests.unit.test_job import CLEAN, UNREACHABLE, Sim

pytestmark = pytest.mark.timeout(10)

SPOT_A = SourceSpec("spot-a", "aws", price=1.0)
SPOT_B = SourceSpec("spot-b", "aws", price=1.2)
OD = SourceSpec("od", "aws", price=4.0, fallback=True)
SPECS = {s.name: s for s in (SPOT_A, SPOT_B, OD)}


# ------------------------------------------------------------------------- the choice rule

def hosts_of(ready: dict[str, int], sources: dict[str, str], prices: dict[str, float]) -> HostManager:
    hosts = HostManager(Blacklist((0, 0)))
    hosts.update(DiscoveredHosts(ready=ready, sources=sources, prices=prices), 0.0)
    return hosts


def test_the_cheapest_slots_are_taken_first_and_the_fallback_last():
    hosts = hosts_of({"od1": 2, "b1": 2, "a1": 2}, {"od1": "od", "b1": "spot-b", "a1": "spot-a"},
                     {"od1": 4.0, "b1": 1.2, "a1": 1.0})
    free = hosts.available_slots(0.0)  # oldest host first: od1, b1, a1
    assert [str(s) for s in choose(free, hosts, SPECS)] == ["a1[0]", "a1[1]", "b1[0]", "b1[1]", "od1[0]", "od1[1]"]


def test_priority_wins_over_price_and_an_unknown_price_comes_after_every_known_one():
    specs = {"cheap": SourceSpec("cheap", "aws"), "favoured": SourceSpec("favoured", "aws", priority=5),
             "unpriced": SourceSpec("unpriced", "aws")}
    hosts = hosts_of({"u": 1, "c": 1, "f": 1}, {"u": "unpriced", "c": "cheap", "f": "favoured"},
                     {"c": 0.5, "f": 3.0})
    assert [s.host for s in choose(hosts.available_slots(0.0), hosts, specs)] == ["f", "c", "u"]


def test_ties_keep_the_older_host_first_then_the_lower_slot():
    hosts = HostManager(Blacklist((0, 0)))
    hosts.update(DiscoveredHosts(ready={"x": 2}, sources={"x": "spot-a"}, prices={"x": 1.0}), 0.0)
    hosts.update(DiscoveredHosts(ready={"x": 2, "y": 2, "z": 1}, sources={"x": "spot-a", "y": "spot-a", "z": "spot-b"},
                                 prices={"x": 1.0, "y": 1.0, "z": 1.0}), 1.0)
    # x and y: same source, same price, x seen first; z: another source at the same price, seen with y.
    assert [str(s) for s in choose(hosts.available_slots(1.0), hosts, SPECS)] == ["x[0]", "x[1]", "y[0]", "y[1]",
                                                                                   "z[0]"]


def test_the_fallback_is_wanted_below_min_np_at_once_and_below_np_only_after_fallback_after():
    rule = FallbackRule(num_proc=4, min_np=2, max_np=6, fallback_after_s=30)
    assert rule.wanted(4, 0.0) == (0, "")
    assert rule.wanted(1, 1.0) == (3, "below --min-np 2")  # tops the job up to -np, never beyond
    assert rule.wanted(3, 2.0) == (0, "")  # at --min-np or more: not yet
    assert rule.wanted(3, 30.9)[0] == 0
    assert rule.wanted(3, 31.0) == (1, "below -np 4 for 30s (--fallback-after)")  # below -np since t=1
    assert rule.wanted(4, 32.0) == (0, "")
    never = FallbackRule(num_proc=4, min_np=2, max_np=3, fallback_after_s=None)
    assert never.wanted(3, 1e6) == (0, "") and never.wanted(0, 1e6)[0] == 3  # --max-np 3 bounds it


# ------------------------------------------------------------------------- the job

class Sourced(Sim):
    """The test_job simulator, with several sources and the capacity actions collected."""

    def __init__(self, np: int, host_slots: int = 1, **kwargs) -> None:
        self.capacity: list[SetCapacity] = []
        kwargs.setdefault("sources", (SPOT_A, SPOT_B, OD))
        super().__init__(np, **kwargs)
        # The fallback groups' hosts have shown ``host_slots`` slots each before (0: none seen, and a group is then
        # raised by one host at a time: tests/unit/test_fallback_host_slots.py).
        if host_slots:
            self.job.capacity.sourcing.host_slots.update({s.name: host_slots for s in kwargs["sources"] if s.fallback})

    def _collect(self) -> None:
        for kind, fields in self.job.take_events():
            validate(kind, fields)
            self.events.append((kind, fields))
        for action in self.job.take_actions():
            kinds = {Launch: self.launched, Stop: self.stops, Finish: self.finished, Release: self.released,
                     SetCapacity: self.capacity}
            kinds[type(action)].append(action)

    def groups(self, a: int = 0, b: int = 0, od: int = 0, slots: int = 1) -> None:
        """Discovery shows ``a`` hosts of spot-a, ``b`` of spot-b and ``od`` of the fallback, ``slots`` slots each."""
        ready, sources = {}, {}
        for name, count in (("a", a), ("b", b), ("od", od)):
            for i in range(count):
                ready[f"{name}{i}"] = slots
                sources[f"{name}{i}"] = {"a": "spot-a", "b": "spot-b", "od": "od"}[name]
        prices = {h: SPECS[s].price for h, s in sources.items()}
        self.job.discovered(DiscoveredHosts(ready=ready, sources=sources, prices=prices), self.now)
        self._collect()

    def state(self, slot: str) -> WorkerState:
        return self.job.workers[self.id(slot)].state


def running(sim: Sourced) -> list[str]:
    return sorted(str(w.slot) for w in sim.job.workers.values() if w.state is WorkerState.RUNNING)


def test_a_job_with_enough_spot_slots_never_touches_the_fallback():
    sim = Sourced(2, manage_capacity=True)
    sim.groups(a=1, b=1, od=2)
    assert sim.slots_launched() == ["a0[0]", "b0[0]"]
    sim.join(*sim.slots_launched())
    sim.advance(60)
    assert sim.slots_launched() == ["a0[0]", "b0[0]"] and sim.capacity == []


@pytest.mark.parametrize("key", ["price", "on_demand_price"])
def test_of_two_fallback_groups_the_cheaper_is_raised_first_whichever_way_it_is_priced(key):
    """A review listed a $10/h fallback before a $1/h one, both priced by ``on_demand_price`` (AWS's per-instance
    way, in the docs' example): the $10 one was raised, as the groups were ordered by ``price`` alone."""
    dear = SourceSpec("od-x", "aws", fallback=True, **{key: 10.0})
    cheap = SourceSpec("od-y", "aws", fallback=True, **{key: 1.0})
    sim = Sourced(2, manage_capacity=True, sources=(SPOT_A, dear, cheap))
    sim.job.discovered(DiscoveredHosts(ready={"a0": 1}, sources={"a0": "spot-a"}, prices={"a0": 1.0}), sim.now)
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od-y", 1)]


def test_more_slots_than_max_np_fill_the_cheapest_source_first():
    sim = Sourced(2, max_np=3)
    sim.groups(a=2, b=2)
    assert sim.slots_launched() == ["a0[0]", "a1[0]", "b0[0]"]


def test_below_min_np_the_fallback_group_is_scaled_up_its_hosts_admitted_then_drained_and_scaled_to_zero():
    sim = Sourced(2, manage_capacity=True)
    sim.groups(a=1, b=1, od=0)
    sim.join("a0[0]", "b0[0]")
    sim.commit("a0[0]", "b0[0]")
    # spot-b is emptied: below --min-np 2, the fallback group (at 0 hosts) is asked for one.
    sim.groups(a=1, b=0, od=0)
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od", 1)]
    assert ("capacity", {"source": "od", "hosts": 1, "reason": "1 fallback slot(s) wanted (below --min-np 2)"}) \
        in sim.events
    sim.exit("b0[0]", CLEAN)  # its host is gone; the survivor comes back to rendezvous
    sim.groups(a=1, b=0, od=1)
    assert sim.slots_launched()[-1] == "od0[0]"
    sim.join("a0[0]", "od0[0]")
    assert running(sim) == ["a0[0]", "od0[0]"]
    # Spot returns: spot-b is filled beside the fallback worker, which leaves at its next commit (draining, no
    # rollback) once the replacement is ready.
    rollbacks = [f for k, f in sim.events if k == "rollback"]  # b0's silent loss above cost one; no more
    sim.groups(a=1, b=1, od=1)
    assert sim.slots_launched()[-1] == "b0[0]"
    assert sim.state("od0[0]") is WorkerState.RUNNING
    sim.join("b0[0]")
    sim.advance(1)
    assert sim.state("od0[0]") is WorkerState.DRAINING
    assert sim.capacity == [SetCapacity("od", 1)]  # not lowered while its worker runs
    sim.join("od0[0]")  # it reached its commit and came to rendezvous: it is told to leave
    sim.exit("od0[0]", CLEAN)
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od", 1), SetCapacity("od", 0)]
    assert [f for k, f in sim.events if k == "rollback"] == rollbacks
    left = [f for k, f in sim.events if k == "worker_left"]
    assert left and "cheaper slots are back" in left[-1]["reason"]


def sent_back(sim: Sourced) -> list[str]:
    """The hosts of the workers that left because the fallback was no longer needed."""
    return [f["host"] for k, f in sim.events if k == "worker_left" and "cheaper slots are back" in f["reason"]]


def fallback_topped_up(**kwargs) -> Sourced:
    """-np 2 --min-np 2: spot-b was reclaimed, and a0 and the fallback's od0 train in a round, committed."""
    sim = Sourced(2, manage_capacity=True, **kwargs)
    sim.groups(a=1, b=1, od=0)
    sim.join("a0[0]", "b0[0]")
    sim.groups(a=1, b=0, od=0)
    sim.exit("b0[0]", CLEAN)
    sim.groups(a=1, b=0, od=1)
    sim.join("a0[0]", "od0[0]")
    sim.commit("a0[0]", "od0[0]")
    assert running(sim) == ["a0[0]", "od0[0]"] and sim.capacity == [SetCapacity("od", 1)]
    return sim


def test_a_fallback_worker_trains_on_until_its_replacement_is_ready():
    sim = fallback_topped_up()
    sim.groups(a=1, b=1, od=1)  # a new spot-b host is listed while it still boots
    assert sim.slots_launched()[-1] == "b0[0]"  # launched beside od0, though the job is at --max-np
    sim.advance(60)
    assert sim.state("b0[0]") is WorkerState.STARTING
    assert sim.state("od0[0]") is WorkerState.RUNNING and running(sim) == ["a0[0]", "od0[0]"]
    sim.commit("a0[0]", "od0[0]")
    replies = sim.join("a0[0]", "od0[0]", reason="update")  # at its commit od0 is not told to leave
    assert all(isinstance(r, Assignment) for r in replies.values())
    assert sim.capacity == [SetCapacity("od", 1)] and not sent_back(sim)
    sourcing = sim.job.capacity.sourcing
    assert sourcing.summary(sim.now).dollars_per_hour == pytest.approx(1.0 + 4.0 + 1.2)  # both charged meanwhile
    sim.join("b0[0]")  # the replacement reaches rendezvous: od0 leaves at its next commit
    sim.advance(0.5)
    assert sim.state("od0[0]") is WorkerState.DRAINING
    sim.commit("a0[0]", "od0[0]")
    replies = sim.join("a0[0]", "od0[0]", reason="update")
    assert isinstance(replies["od0[0]"], ExitOrder) and isinstance(replies["a0[0]"], Assignment)
    sim.exit("od0[0]", CLEAN)
    sim.advance(1)
    assert running(sim) == ["a0[0]", "b0[0]"] and sent_back(sim) == ["od0"]
    assert sourcing.summary(sim.now).dollars_per_hour == pytest.approx(1.0 + 1.2)
    assert sim.capacity == [SetCapacity("od", 1), SetCapacity("od", 0)]  # lowered only once od0 left


def test_a_replacement_that_never_comes_up_leaves_the_fallback_worker_and_its_group_in_place():
    sim = fallback_topped_up()
    sim.groups(a=1, b=1, od=1)
    sim.advance(30)
    sim.exit("b0[0]", UNREACHABLE)  # reclaimed again before it booted, or a bad boot
    assert sim.blocked("b0[0]")
    sim.advance(60)
    assert sim.state("od0[0]") is WorkerState.RUNNING and running(sim) == ["a0[0]", "od0[0]"]
    assert sim.capacity == [SetCapacity("od", 1)]  # never set back to 0, so never raised again from a cold boot
    assert not sent_back(sim)


def test_above_min_np_a_fallback_brought_by_fallback_after_also_waits_for_its_replacement():
    sim = Sourced(2, min_np=1, fallback_after_s=20, progress_timeout_s=0)
    sim.groups(a=1, b=1, od=1)
    sim.join("a0[0]", "b0[0]")
    sim.groups(a=1, od=1)
    sim.exit("b0[0]", CLEAN)
    sim.join("a0[0]")  # above --min-np 1: a0 trains on alone
    sim.advance(21)
    sim.join("od0[0]", "a0[0]", reason="update")
    assert running(sim) == ["a0[0]", "od0[0]"]
    sim.groups(a=1, b=1, od=1)
    sim.advance(30)
    assert sim.state("od0[0]") is WorkerState.RUNNING  # not short of -np while b0 boots
    sim.join("b0[0]")
    sim.advance(0.5)
    assert sim.state("od0[0]") is WorkerState.DRAINING


def test_fallback_workers_the_job_will_not_keep_leave_at_once_and_the_rest_once_replacements_are_ready():
    """-np 4 --min-np 2 with one spot slot and three fallback ones: a second spot slot makes the job's size 2
    (the fallback is wanted only below --min-np), so two fallback workers leave at once and the third stays
    until the new spot worker is ready: the job never has fewer ready workers than it will end with."""
    sim = Sourced(4, min_np=2, progress_timeout_s=0)
    sim.groups(a=1, od=3)
    sim.join("a0[0]", "od0[0]", "od1[0]", "od2[0]")
    assert len(running(sim)) == 4
    sim.groups(a=2, od=3)
    assert sim.slots_launched()[-1] == "a1[0]"
    leaving = [s for s in ("od0[0]", "od1[0]", "od2[0]") if sim.state(s) is WorkerState.DRAINING]
    assert leaving == ["od1[0]", "od2[0]"]  # newest first
    assert sim.state("od0[0]") is WorkerState.RUNNING
    sim.join("a1[0]")
    sim.advance(0.5)
    assert sim.state("od0[0]") is WorkerState.DRAINING


def test_with_whole_hosts_a_fallback_host_leaves_once_a_whole_host_of_replacements_is_ready():
    sim = Sourced(4, min_np=4, whole_host_slots=2, progress_timeout_s=0)
    sim.job.discovered(DiscoveredHosts(ready={"a0": 2, "od0": 2}, sources={"a0": "spot-a", "od0": "od"}), sim.now)
    sim._collect()
    sim.join(*sim.slots_launched())
    sources = {"a0": "spot-a", "a1": "spot-a", "od0": "od"}
    sim.job.discovered(DiscoveredHosts(ready={"a0": 2, "a1": 2, "od0": 2}, sources=sources), sim.now)
    sim._collect()
    assert sorted(sim.slots_launched()[-2:]) == ["a1[0]", "a1[1]"]
    sim.join("a1[0]")  # half the replacement host is ready: half a fallback host cannot leave
    sim.advance(0.5)
    assert [sim.state(s) for s in ("od0[0]", "od0[1]")] == [WorkerState.RUNNING] * 2
    sim.join("a1[1]")
    sim.advance(0.5)
    assert [sim.state(s) for s in ("od0[0]", "od0[1]")] == [WorkerState.DRAINING] * 2


def test_a_fallback_group_its_own_scaling_lowered_is_asked_again_while_the_job_still_needs_it():
    from cloud_elastic.driver.job.sourcing import REASK_S

    sim = Sourced(2, manage_capacity=True)
    sim.groups(a=1, b=1)
    sim.join("a0[0]", "b0[0]")
    sim.groups(a=1)  # below --min-np 2: the fallback group is raised to 1
    sim.exit("b0[0]", CLEAN)
    sim.groups(a=1, od=1)
    sim.join("a0[0]", "od0[0]")
    sim.groups(a=1)  # a scheduled action sets the group back to 0: its host goes
    sim.exit("od0[0]", CLEAN)
    sim.advance(REASK_S / 2)
    assert sim.capacity == [SetCapacity("od", 1)]
    sim.advance(REASK_S / 2 + 1)
    sim.groups(a=1)
    assert sim.capacity == [SetCapacity("od", 1)] * 2  # the provider sends it where the group is below it
    assert [e[1]["hosts"] for e in sim.events if e[0] == "capacity"] == [1]  # an unchanged value: no event
    sim.groups(a=1, od=1)
    assert sim.slots_launched()[-1] == "od0[0]"


def test_a_fallback_group_asked_again_once_fewer_slots_are_wanted_is_asked_the_smaller_number():
    """The larger value asked earlier would keep the group large (the cloud skips it: already desired)."""
    from cloud_elastic.driver.job.sourcing import REASK_S

    sim = Sourced(4, manage_capacity=True)
    sim.groups(a=2, b=2)
    sim.join("a0[0]", "a1[0]", "b0[0]", "b1[0]")
    sim.commit("a0[0]", "a1[0]", "b0[0]", "b1[0]")
    sim.groups(a=1, b=0)  # 3 of the 4 spot hosts reclaimed: the fallback group is raised to 3
    for slot in ("a1[0]", "b0[0]", "b1[0]"):
        sim.exit(slot, CLEAN)
    sim.advance(1)
    sim.groups(a=1, b=2, od=0)  # spot-b is back: 1 fallback slot is still wanted, none shows yet
    sim.advance(REASK_S + 1)
    sim.groups(a=1, b=2, od=0)
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od", 3), SetCapacity("od", 1)]
    assert [e[1]["hosts"] for e in sim.events if e[0] == "capacity"] == [3, 1]


def test_without_manage_capacity_no_group_is_ever_changed():
    sim = Sourced(2)
    sim.groups(a=1, b=1)
    sim.join("a0[0]", "b0[0]")
    sim.groups(a=1)
    sim.advance(5)
    sim.groups(a=1, od=1)
    assert sim.slots_launched()[-1] == "od0[0]" and sim.capacity == []


def test_a_group_the_job_never_raised_is_never_lowered():
    sim = Sourced(1, manage_capacity=True)
    sim.groups(a=1, od=3)  # the user left the fallback group at 3 hosts
    sim.advance(10)
    assert sim.capacity == [] and sim.slots_launched() == ["a0[0]"]


def test_below_np_the_fallback_waits_for_fallback_after():
    sim = Sourced(2, min_np=1, fallback_after_s=20)
    sim.groups(a=1, b=1, od=1)
    sim.join("a0[0]", "b0[0]")
    sim.groups(a=1, od=1)
    sim.exit("b0[0]", CLEAN)
    sim.advance(19)
    assert "od0[0]" not in sim.slots_launched()
    sim.advance(2)
    assert sim.slots_launched()[-1] == "od0[0]"


def test_the_job_is_charged_each_slot_at_its_hosts_price_and_compared_with_the_fallback_alone():
    sim = Sourced(2, progress_timeout_s=0)
    sim.groups(a=1, b=1, od=1)
    sim.join("a0[0]", "b0[0]")
    sim.advance(360)  # a tenth of an hour at 1.0 + 1.2 $/slot-hour
    summary = sim.job.capacity.sourcing.summary(sim.now)
    assert summary.dollars == pytest.approx(0.22, rel=1e-6)
    assert summary.slot_hours == pytest.approx(0.2, rel=1e-6)
    assert summary.fallback_only == pytest.approx(0.8, rel=1e-6)  # 0.2 slot-hours at the fallback's 4.0
    assert summary.by_source == pytest.approx({"spot-a": 0.1, "spot-b": 0.12})
    costs = [f for k, f in sim.events if k == "cost"]
    assert costs and costs[-1]["dollars_per_hour"] == pytest.approx(2.2)
    started = [f for k, f in sim.events if k == "worker_started"]
    assert [(f["source"], f["price"]) for f in started] == [("spot-a", 1.0), ("spot-b", 1.2)]


def test_the_cost_meter_integrates_rates_between_calls_and_counts_unpriced_slots_apart():
    meter = CostMeter()
    meter.advance(0.0, {"a": (2, 2.0, 0)})
    meter.advance(1800.0, {"a": (2, 2.0, 0), "x": (1, 0.0, 1)})
    meter.advance(3600.0, {})
    s = meter.summary()
    assert s.dollars == pytest.approx(2.0) and s.slot_hours == pytest.approx(2.5)
    assert s.unpriced_slot_hours == pytest.approx(0.5) and s.fallback_only is None


def test_unpriced_slots_are_reported_apart_and_never_shown_as_a_saving_on_the_fallback():
    from cloud_elastic.driver.runtime.costs import final_cost

    sim = Sourced(2, sources=(SourceSpec("spot-a", "aws"), OD), progress_timeout_s=0)  # spot-a's price look-up fails
    sim.job.discovered(DiscoveredHosts(ready={"a0": 1, "a1": 1}, sources={"a0": "spot-a", "a1": "spot-a"}),
                       sim.now)
    sim._collect()
    sim.join(*sim.slots_launched())
    sim.advance(360)
    cost = [f for k, f in sim.events if k == "cost"][-1]
    assert cost["unpriced_slot_hours"] == pytest.approx(cost["slot_hours"]) and cost["by_source"] == {}
    fields = final_cost(sim.job, sim.now).fields
    assert fields["unpriced_slot_hours"] == pytest.approx(0.2) and fields["cost_fallback_only"] == 0.0
    validate("job_finished", {"outcome": "succeeded", "exit_code": 0, "resets": 0, "wall_s": 1.0, **fields})


def test_a_meter_carried_from_a_crashed_driver_goes_on_from_its_figures():
    meter = CostMeter()
    meter.carry(CostSoFar(10.0, 5.0, 1.0, (("od", 8.0), ("spot-a", 2.0))))  # the predecessor's last sign of life
    meter.advance(0.0, {"od": (1, 4.0, 0), "x": (1, 0.0, 1)})
    meter.advance(1800.0, {})
    s = meter.summary()
    assert (s.dollars, s.slot_hours, s.unpriced_slot_hours) == pytest.approx((12.0, 6.0, 1.5))
    assert s.by_source == pytest.approx({"od": 10.0, "spot-a": 2.0})  # x's price is unknown: not $0
    assert meter.so_far() == CostSoFar(s.dollars, s.slot_hours, 1.5, (("od", 10.0), ("spot-a", 2.0)))


def test_a_source_priced_at_0_is_carried_at_0():
    """A source with no known price is never in by_source (above): a $0 entry is a source priced at 0, listed as
    such by the driver that metered it and by the one restarted after it (review h14; a predecessor from before
    afa41de listed unpriced sources at $0 too: those are listed at $0 now)."""
    meter = CostMeter()
    meter.carry(CostSoFar(3.0, 2.0, 0.0, (("od", 3.0), ("free", 0.0))))
    assert meter.summary().by_source == pytest.approx({"od": 3.0, "free": 0.0})


def test_a_job_that_carried_its_predecessors_cost_reports_the_sum_in_events_status_and_its_end_line():
    from cloud_elastic.config import JobConfig
    from cloud_elastic.driver.job.status_reply import status_reply
    from cloud_elastic.driver.runtime.costs import final_cost

    sim = Sourced(1, progress_timeout_s=0)
    sim.job.capacity.sourcing.carry_cost(CostSoFar(10.0, 5.0, by_source=(("od", 10.0),)))
    sim._collect()
    assert [f["dollars"] for k, f in sim.events if k == "cost"] == [10.0]  # at once, not at the next rate change
    sim.groups(a=1)
    sim.join("a0[0]")
    sim.advance(3600)  # an hour on spot-a at 1.0 $/slot-hour
    config = JobConfig(command=("python", "t.py"), num_proc=1, min_np=1, max_np=1)
    reply = status_reply(sim.job, config, provider="aws", now=sim.now, wall_now=sim.now, uptime_s=3600)
    assert reply.cost == pytest.approx(11.0, rel=1e-3)
    assert final_cost(sim.job, sim.now).line.startswith(f"job {sim.job.job_id}: cost $11.00 for 6.000 slot-hour(s)")
    # The events go on from the sum too (one at least every minute: a minute at 1 $/h behind at most).
    assert [f["dollars"] for k, f in sim.events if k == "cost"][-1] == pytest.approx(11.0, abs=1 / 60)


def test_with_whole_hosts_the_fallback_gives_whole_hosts():
    sim = Sourced(4, min_np=2, max_np=4, whole_host_slots=2, progress_timeout_s=0, fallback_after_s=0)
    ready = {"a0": 2, "a1": 2, "od0": 2, "od1": 2}
    sources = {"a0": "spot-a", "a1": "spot-a", "od0": "od", "od1": "od"}
    sim.job.discovered(DiscoveredHosts(ready=ready, sources=sources), sim.now)
    sim._collect()
    assert sorted(sim.slots_launched()) == ["a0[0]", "a0[1]", "a1[0]", "a1[1]"]
    sim.join(*sim.slots_launched())
    # One fallback slot wanted (a Spot slot blacklisted, say) is half a host: a whole host is allowed instead.
    sourcing = sim.job.capacity.sourcing
    sourcing.wanted = 1
    free = sim.job.hosts.available_slots(sim.now)
    assert [str(s) for s in sourcing.order(free) if s.host.startswith("od")] == ["od0[0]", "od0[1]"]


# ------------------------------------------------------------------------- raised groups across the driver's life

def test_what_the_job_raised_is_reported_until_it_is_set_back_to_zero():
    sim = Sourced(2, manage_capacity=True)
    sim.groups(a=1, b=1)
    sim.join("a0[0]", "b0[0]")
    sim.groups(a=1)  # below --min-np: the fallback is raised
    sim.advance(1)
    sourcing = sim.job.capacity.sourcing
    assert sourcing.raised() == {"od": 1}
    sourcing.lowered("od")  # the driver set it back to 0 as the job ended (driver.runtime.raised)
    sim._collect()
    assert sourcing.raised() == {}
    assert ("capacity", {"source": "od", "hosts": 0, "reason": "the job is over"}) in sim.events


def test_a_group_a_crashed_predecessor_raised_is_set_back_to_zero_once_nothing_needs_it():
    sim = Sourced(1, manage_capacity=True)
    sim.job.capacity.sourcing.inherit({"od": 2})
    sim.groups(a=1, od=2)  # the spot slot is enough: nothing needs the fallback the predecessor raised
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od", 0)] and sim.slots_launched() == ["a0[0]"]


def test_a_predecessors_raised_group_that_is_still_needed_stays_and_is_not_asked_again():
    sim = Sourced(2, manage_capacity=True)
    sim.job.capacity.sourcing.inherit({"od": 1})
    sim.groups(a=1, od=1)  # below --min-np 2 without it
    sim.advance(1)
    assert sim.capacity == [] and sim.slots_launched() == ["a0[0]", "od0[0]"]


def test_a_predecessors_word_that_a_group_is_raised_does_not_stop_this_job_raising_it_when_it_shows_none():
    sim = Sourced(2, manage_capacity=True)
    sim.job.capacity.sourcing.inherit({"od": 2})  # stale: the group was set back to 0 since
    sim.groups(a=1, od=0)  # below --min-np 2, and the fallback group shows no host
    sim.advance(1)
    assert sim.capacity == [SetCapacity("od", 1)]


def test_a_raised_source_this_command_does_not_manage_as_a_fallback_is_left_alone(caplog):
    sim = Sourced(1, manage_capacity=True)
    sim.job.capacity.sourcing.inherit({"spot-a": 3, "gone": 1})
    sim.groups(a=1)
    sim.advance(5)
    assert sim.capacity == [] and sim.job.capacity.sourcing.raised() == {}
    assert "raised host source 'spot-a' to 3, which this command does not manage" in caplog.text
    unmanaged = Sourced(1)  # no --manage-capacity: no group is ever changed, an inherited one included
    unmanaged.job.capacity.sourcing.inherit({"od": 2})
    unmanaged.groups(a=1, od=2)
    unmanaged.advance(5)
    assert unmanaged.capacity == []


def test_a_failed_first_discovery_call_raises_no_group_before_any_host_was_seen():
    sim = Sourced(2, manage_capacity=True)
    sim.discovery_failed("Rate exceeded (Throttling)")  # no host known yet: not a lack of Spot hosts
    sim.advance(5)
    assert sim.capacity == []
    sim.groups(a=1, b=1, od=0)  # the retry answers: Spot has every slot
    sim.advance(5)
    assert sim.capacity == [] and sim.slots_launched() == ["a0[0]", "b0[0]"]
    sim.groups(a=0, b=1, od=0)  # an answer that shows too few Spot slots still raises the fallback
    assert sim.capacity == [SetCapacity("od", 1)]


def test_the_cost_goes_on_at_each_driver_tick_while_nothing_is_launched_and_stops_with_the_workers():
    """A finishing job plans no launches; the driver's tick still moves the meter (a cost event at least every
    60 s, the metric with it), and a worker stops costing when it exits."""
    from cloud_elastic.driver.runtime.costs import charge

    sim = Sourced(2, progress_timeout_s=0, finish_timeout_s=600)
    sim.groups(a=1, b=1, od=1)
    sim.join("a0[0]", "b0[0]")
    sim.complete("a0[0]")
    sim.exit("a0[0]", CLEAN)  # b0 (spot-b, 1.2 $/slot-hour) still runs: the job is finishing
    meter = sim.job.capacity.sourcing.cost
    start, before = sim.now, meter.summary().dollars
    sim.events.clear()
    while sim.now < start + 180:
        sim.advance(0.5)
        charge(sim.job, sim.now)  # what the driver's loop does after each tick
        sim._collect()
    assert meter.summary().dollars - before == pytest.approx(1.2 * 180 / 3600, rel=0.02)
    costs = [f for k, f in sim.events if k == "cost"]
    assert len(costs) >= 3 and costs[-1]["dollars_per_hour"] == pytest.approx(1.2)
    sim.exit("b0[0]", CLEAN)
    charge(sim.job, sim.now)
    stopped = meter.summary().dollars
    sim.advance(120)
    charge(sim.job, sim.now)
    assert meter.summary().dollars == pytest.approx(stopped) and meter.summary().dollars_per_hour == 0
