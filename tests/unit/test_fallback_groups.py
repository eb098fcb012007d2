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


def test_idle_raised_slot_hours_are_a_metric_served_at_metrics_the_carried_ones_included():
    """fixL: ``status`` shows the slot-hours of raised fallback hosts that ran no worker (fixI), and no metric
    did. Scraped from the server's own /metrics endpoint."""
    pytest.importorskip("prometheus_client")
    from cloud_elastic.metrics import MetricsServer
    from tests.integration.test_metrics import scrape

    server = MetricsServer("j", 0)
    server.carry_cost(4.5, 2.0, 1.25)  # the previous driver's figures
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        assert scrape(url)["cloud_elastic_cost_idle_slot_hours_total"] == 1.25
        server.emit("cost", dollars=4.75, dollars_per_hour=1.0, slot_hours=4.0, idle_slot_hours=1.5)
        server.emit("cost", dollars=4.8, dollars_per_hour=1.0, slot_hours=4.1)  # an event without it: no change
        assert scrape(url)["cloud_elastic_cost_idle_slot_hours_total"] == 1.5
        server.emit("job_finished", outcome="succeeded", exit_code=0, resets=0, wall_s=1.0, cost=5.0,
                    slot_hours=5.0, idle_slot_hours=2.0)
        got = scrape(url)
        assert (got["cloud_elastic_cost_idle_slot_hours_total"], got["cloud_elastic_cost_dollars_total"]) == (2.0, 5.0)
    finally:
        server.close()


# ------------------------------------------------------------------ the job, its provider and the runtime between
OD2 = SourceSpec("od2", "scripted", price=5.0, fallback=True)


def _job(np: int, *fallbacks: SourceSpec):
    from tests.unit.test_job_sourcing import OD, SPOT_A, Sourced

    return Sourced(np, manage_capacity=True, sources=(SPOT_A, OD, *fallbacks))


def _run(sim, multi: MultiSourceDiscovery, seconds: float) -> None:
    """The driver's part: each discovery answer to the job, what the provider knows refreshed first
    (``raised.discovered``) and before each tick (``raised.share``), and each capacity action to the provider, as
    the discovery thread makes it."""
    from cloud_elastic.driver.runtime import raised

    for _ in range(int(seconds)):
        raised.discovered(sim.job, multi, multi.find(), sim.now)
        raised.share(sim.job, multi)
        sim.advance(1)
        while sim.capacity:
            action = sim.capacity.pop(0)
            multi.set_capacity(action.hosts, source=action.source)


def _sources(od: Scripted, od2: Scripted | None = None, spot_hosts: int = 1, sim=None,
             spot: Scripted | None = None) -> MultiSourceDiscovery:
    """spot-a (``spot_hosts`` hosts, or ``spot``), od and od2 (fallbacks, in that order); on ``sim``'s clock if
    given."""
    spot = spot or Scripted(DiscoveredHosts(ready={f"a{i}": 1 for i in range(spot_hosts)}))
    groups = [(spec("spot-a", price=1.0), spot), (spec("od", price=4.0, fallback=True), od)]
    if od2 is not None:
        groups.append((spec("od2", price=5.0, fallback=True), od2))
    return MultiSourceDiscovery(groups, **({} if sim is None else {"clock": lambda: sim.now}))


def _capacity_events(sim) -> list[tuple[str, int]]:
    return [(f["source"], f["hosts"]) for k, f in sim.events if k == "capacity"]


def test_the_next_fallback_group_is_raised_for_what_the_preferred_one_cannot_give_and_lowered_once_it_can():
    od = Scripted(DiscoveredHosts(), limits=(0, 1, 0))  # MaxSize 1
    od2 = Scripted(DiscoveredHosts(), limits=(0, 10, 0))
    multi = _sources(od, od2)
    sim = _job(3, OD2)  # one spot slot of the 3 wanted: 2 fallback slots
    _run(sim, multi, 3)
    assert max(od.capacity_calls) == 1 and od2.capacity_calls == [1]
    assert ("capacity", {"source": "od2", "hosts": 1, "reason": "2 fallback slot(s) wanted (below --min-np 3)"}) \
        in sim.events
    od.limits = (0, 5, 1)  # its maximum was raised: the preferred group gives both, the other is set back
    _run(sim, multi, 35)
    assert od.capacity_calls[-1] == 2 and od2.capacity_calls == [1, 0]
    assert sim.job.capacity.sourcing.raised() == {"od": 2}


def test_a_preferred_fallback_group_the_job_may_not_raise_or_whose_raise_keeps_failing_leaves_it_to_the_next():
    from cloud_elastic.errors import CapacityDeniedError, CapacityError
    from cloud_elastic.providers.multi import REFUSALS_TO_SPILL

    for error, calls in ((CapacityDeniedError("AccessDenied"), 1), (CapacityError("Throttling"), REFUSALS_TO_SPILL)):
        od = Scripted(DiscoveredHosts(), capacity_errors=[error] * 10, limits=(0, 10, 0))
        od2 = Scripted(DiscoveredHosts(), limits=(0, 10, 0))
        sim = _job(2, OD2)
        _run(sim, multi := _sources(od, od2), 2 + calls)
        # A refused raise is tried again at each discovery, never lowered (AccessDenied: never tried again).
        assert od.capacity_calls == [1] * len(od.capacity_calls) and len(od.capacity_calls) >= calls, error
        assert od2.capacity_calls == [1]
        assert multi.capacity_of("od2") == 1


def test_at_the_end_an_operators_group_the_job_never_set_is_not_said_set_back_to_0(caplog):
    from cloud_elastic.driver.runtime import raised

    od = Scripted(DiscoveredHosts(), limits=(0, 20, 10))  # an operator keeps it at DesiredCapacity 10
    multi = _sources(od)
    sim = _job(2)
    _run(sim, multi, 2)
    assert sim.job.capacity.sourcing.raised() == {"od": 1} and od.capacity_calls == []  # asked, skipped
    with caplog.at_level(logging.INFO):
        raised.lower(sim.job, multi, threading.Condition(), None, pause_s=0)
    sim._collect()
    assert od.capacity_calls == [] and sim.job.capacity.sourcing.raised() == {}
    assert "set back to 0" not in caplog.text and "host source 'od' is left as it is" in caplog.text
    assert not [f for k, f in sim.events if k == "capacity" and f["hosts"] == 0]


def test_a_restarted_driver_lowers_the_group_its_predecessor_raised_though_it_skipped_its_own_smaller_raise():
    from cloud_elastic.driver.runtime import raised

    od = Scripted(DiscoveredHosts(), limits=(0, 20, 2))  # raised to 2 by the crashed driver; its hosts boot
    multi = _sources(od)
    sim = _job(2)
    sim.job.capacity.sourcing.inherit({"od": 2})
    _run(sim, multi, 2)  # one fallback slot is wanted: the raise to 1 is skipped (the group is at 2)
    assert od.capacity_calls == [] and sim.capacity == []
    raised.lower(sim.job, multi, threading.Condition(), None, pause_s=0)
    assert od.capacity_calls == [0] and multi.capacity_of("od") == 0
    # Mid-job too: once nothing needs it, the predecessor's group is set back to 0.
    od = Scripted(DiscoveredHosts(), limits=(0, 20, 2))
    multi = _sources(od)
    sim = _job(2)
    sim.job.capacity.sourcing.inherit({"od": 2})
    _run(sim, multi, 2)
    multi.sources[0].discovery.answers = [DiscoveredHosts(ready={"a0": 1, "a1": 1})]  # spot came back
    _run(sim, multi, 2)
    assert od.capacity_calls == [0]


def test_a_fallback_group_whose_hosts_run_workers_keeps_them_when_the_preferred_one_can_give_more():
    od = Scripted(DiscoveredHosts(), limits=(0, 1, 0))
    od2 = Scripted(DiscoveredHosts(), limits=(0, 10, 0))
    multi = _sources(od, od2)
    sim = _job(2, OD2)  # one fallback slot wanted; od's only host is kept from it (MaxSize 1, already 1 elsewhere)
    od.limits = (0, 0, 0)  # od can give nothing: od2 gives the slot
    _run(sim, multi, 2)
    assert od2.capacity_calls == [1]
    od2.answers = [DiscoveredHosts(ready={"x0": 1})]
    _run(sim, multi, 1)
    sim.join("a0[0]", "x0[0]")
    od.limits = (0, 5, 0)  # od could give it now: od2's worker keeps its host, od is not raised for it
    _run(sim, multi, 40)
    assert od.capacity_calls == [] and od2.capacity_calls == [1]
    assert sim.job.capacity.sourcing.raised() == {"od2": 1}


# ---------------------------------------------- refusals, groups never raised, groups that never launch, reasons
def test_a_lone_fallback_group_whose_raise_is_throttled_keeps_its_raise_and_gets_it_once_the_cloud_takes_it():
    from cloud_elastic.errors import CapacityError
    from cloud_elastic.providers.multi import REFUSALS_TO_SPILL

    od = Scripted(DiscoveredHosts(), capacity_errors=[CapacityError("Throttling")] * REFUSALS_TO_SPILL,
                  limits=(0, 10, 0))
    sim = _job(2)  # one spot slot, --min-np 2: one fallback slot, and no second group to ask
    multi = _sources(od, sim=sim)
    _run(sim, multi, REFUSALS_TO_SPILL + 3)
    # Never asked for 0 (it stayed below --min-np for 300 s): the refused raise is tried again until it is made.
    assert od.capacity_calls == [1] * (REFUSALS_TO_SPILL + 1) and multi.capacity_of("od") == 1
    assert _capacity_events(sim) == [("od", 1)]


def test_a_refused_preferred_group_keeps_its_raise_the_next_is_asked_for_the_rest_and_lowered_once_it_is_made():
    from cloud_elastic.errors import CapacityError
    from cloud_elastic.providers.multi import REFUSALS_TO_SPILL

    od = Scripted(DiscoveredHosts(), capacity_errors=[CapacityError("Throttling")] * (REFUSALS_TO_SPILL + 2),
                  limits=(0, 10, 0))
    od2 = Scripted(DiscoveredHosts(), limits=(0, 10, 0))
    sim = _job(2, OD2)
    multi = _sources(od, od2, sim=sim)
    _run(sim, multi, REFUSALS_TO_SPILL + 1)
    assert 0 not in od.capacity_calls and od2.capacity_calls == [1]
    _run(sim, multi, 3)  # od's call is taken at last: the refusals are forgotten, od2 (no worker) is set back
    assert 0 not in od.capacity_calls and multi.capacity_of("od") == 1 and od2.capacity_calls == [1, 0]
    assert _capacity_events(sim) == [("od", 1), ("od2", 1), ("od2", 0)]
    assert [f["reason"] for k, f in sim.events if k == "capacity"][-1] == \
        "host source(s) 'od' give the 1 fallback slot(s) wanted"


def test_a_group_whose_raise_was_held_back_and_never_sent_is_never_set_to_0_mid_job_or_at_the_end(caplog):
    from cloud_elastic.driver.runtime import raised
    from cloud_elastic.errors import RetryableDiscoveryError

    # An operator keeps od at DesiredCapacity 3 (booting); spot's first calls are throttled: the job's raise of od
    # is held back (UNHEARD_HOLD_S), never sent.
    od = Scripted(DiscoveredHosts(), limits=(0, 10, 3))
    spot = Scripted(RetryableDiscoveryError("Throttling"))
    sim = _job(1)
    multi = _sources(od, spot=spot, sim=sim)
    _run(sim, multi, 3)
    assert sim.job.capacity.sourcing.raised() == {"od": 1} and od.capacity_calls == []
    with caplog.at_level(logging.INFO):
        raised.lower(sim.job, multi, threading.Condition(), None, pause_s=0)  # the user stops the job
    sim._collect()
    assert od.capacity_calls == [], "the operator's 3 instances were terminated"
    assert "host source 'od' is left as it is" in caplog.text and "set back to 0" not in caplog.text
    assert ("od", 0) not in _capacity_events(sim)
    # Mid-job: spot answers with enough slots before the hold ends: the job no longer wants od, sends it no 0 and
    # reports none (review of 4f7dc85: an 'od 0' capacity event for a change never made), and the raise held back
    # is dropped, never sent once the hold is over.
    from cloud_elastic.providers.multi import UNHEARD_HOLD_S

    od = Scripted(DiscoveredHosts(), limits=(0, 10, 3))
    spot = Scripted(RetryableDiscoveryError("Throttling"))
    sim = _job(1)
    multi = _sources(od, spot=spot, sim=sim)
    _run(sim, multi, 3)
    spot.answers = [DiscoveredHosts(ready={"a0": 1})]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _run(sim, multi, 3)
    assert _capacity_events(sim) == [("od", 1)] and od.capacity_calls == []
    assert "host source 'od' is left as it is: this job never set its desired capacity" in caplog.text
    assert sim.job.capacity.sourcing.raised() == {}
    _run(sim, multi, UNHEARD_HOLD_S + 5)
    assert od.capacity_calls == [] and multi.capacity_of("od") is None


@pytest.mark.parametrize("spot_at_last", ["its-host", "none"])
def test_a_raise_held_back_goes_only_if_still_wanted_once_spot_answers_and_each_call_has_its_event(caplog,
                                                                                                  spot_at_last):
    """Review of 7680445 (over moto: tests/emulator/test_multi_source_held.py): spot throttled twice, then
    answering with the slot wanted: the held raise went out in the very find() that read spot's answer, and the
    job, a view behind, logged 'left as it is' with no event while the provider sent od its 0 (2 calls)."""
    from cloud_elastic.errors import RetryableDiscoveryError
    from cloud_elastic.providers.multi import UNHEARD_HOLD_S

    last = DiscoveredHosts(ready={"a0": 1}) if spot_at_last == "its-host" else DiscoveredHosts()
    od = Scripted(DiscoveredHosts(), limits=(0, 10, 0))  # the job's own fallback group, at 0
    spot = Scripted(RetryableDiscoveryError("Throttling"), RetryableDiscoveryError("Throttling"), last)
    sim = _job(1)
    multi = _sources(od, spot=spot, sim=sim)
    with caplog.at_level(logging.INFO):
        _run(sim, multi, 6)
    if spot_at_last == "none":  # still wanted: sent at the next discovery
        assert od.capacity_calls == [1] and multi.capacity_of("od") == 1 and _capacity_events(sim) == [("od", 1)]
        return
    _run(sim, multi, UNHEARD_HOLD_S + 5)  # no longer wanted: dropped, never sent (its ask's event the only one)
    assert od.capacity_calls == [], "od was raised after spot had answered with the slot wanted"
    assert "host source 'od' is left as it is: this job never set its desired capacity" in caplog.text
    assert sim.job.capacity.sourcing.raised() == {} and _capacity_events(sim) == [("od", 1)]


def test_a_group_raised_in_the_discovery_that_shows_it_unneeded_is_set_back_with_its_event(caplog):
    """The job lowers a group on the very answer whose find() sent its raise: it knows it set it (``owned``
    refreshed before the answer, ``raised.discovered``): the 0 it sends has its event."""
    od = Scripted(DiscoveredHosts(), limits=(0, 10, 0))
    spot = Scripted(DiscoveredHosts(), DiscoveredHosts(ready={"a0": 1}))
    sim = _job(1)
    multi = _sources(od, spot=spot, sim=sim)
    with caplog.at_level(logging.INFO):
        _run(sim, multi, 4)
    assert od.capacity_calls == [1, 0] and _capacity_events(sim) == [("od", 1), ("od", 0)]
    assert "left as it is" not in caplog.text


class _Group(Scripted):
    """A group whose DesiredCapacity is what the job set (AWS records it), with no instance launched
    (InsufficientInstanceCapacity in its scaling activities, or still booting) until ``launch`` is set."""

    launch: DiscoveredHosts | None = None

    def set_capacity(self, hosts, *, source=None):
        super().set_capacity(hosts, source=source)
        self.limits = (0, 10, hosts)

    def find(self):
        return self.launch if self.launch is not None else super().find()


def test_a_preferred_group_that_takes_its_raise_but_launches_nothing_leaves_the_rest_to_the_next_within_minutes():
    od = _Group(DiscoveredHosts(), limits=(0, 10, 0))
    od2 = _Group(DiscoveredHosts(), limits=(0, 10, 0))
    sim = _job(2, OD2)  # one spot slot, --min-np 2: one fallback slot
    multi = _sources(od, od2, sim=sim)
    _run(sim, multi, 60)
    assert od.capacity_calls == [1] and od2.capacity_calls == []  # its hosts may still come (SHORT_FOR_S)
    _run(sim, multi, 240)
    assert od.capacity_calls == [1] and od2.capacity_calls == [1]  # od keeps its raise; od2 gives the slot
    assert multi.capacity_of("od") == 1
    od.launch = DiscoveredHosts(ready={"o0": 1})  # od's host comes at last: it is used, od2 (no worker) set back
    _run(sim, multi, 2)
    assert od2.capacity_calls == [1, 0] and od.capacity_calls == [1]
    assert sim.join("a0[0]", "o0[0]")
    assert sim.job.capacity.sourcing.raised() == {"od": 1}


def test_a_preferred_group_the_job_may_not_change_is_asked_nothing_more_and_no_0_is_reported_for_it():
    from cloud_elastic.errors import CapacityDeniedError

    od = Scripted(DiscoveredHosts(), capacity_errors=[CapacityDeniedError("AccessDenied")], limits=(0, 10, 0))
    od2 = _Group(DiscoveredHosts(), limits=(0, 10, 0))
    sim = _job(2, OD2)
    multi = _sources(od, od2, sim=sim)
    _run(sim, multi, 40)
    assert od.capacity_calls == [1] and od2.capacity_calls == [1]
    assert _capacity_events(sim) == [("od", 1), ("od2", 1)]  # no 'od 0' for a 0 never sent


def test_the_reason_a_group_is_set_back_names_the_groups_that_give_the_slots():
    od = Scripted(DiscoveredHosts(), limits=(0, 1, 0))
    od2 = Scripted(DiscoveredHosts(), limits=(0, 10, 0))
    sim = _job(3, OD2)
    multi = _sources(od, od2, sim=sim)
    _run(sim, multi, 3)
    od.limits = (0, 5, 1)
    _run(sim, multi, 35)
    assert od2.capacity_calls == [1, 0]
    reasons = {(f["source"], f["hosts"]): f["reason"] for k, f in sim.events if k == "capacity"}
    assert reasons[("od2", 0)] == "host source(s) 'od' give the 2 fallback slot(s) wanted"


# ------------------------------------------------------------------------- what a driver restarted after a crash gets
def test_the_sign_of_life_carries_a_raise_whose_call_was_made_even_if_it_failed_but_not_one_held_back():
    from cloud_elastic.errors import CapacityError, RetryableDiscoveryError

    # Held back (spot throttled): the job asked od for 1, its provider sent nothing: nothing to carry.
    od = Scripted(DiscoveredHosts(), limits=(0, 10, 3))
    sim = _job(1)
    multi = _sources(od, spot=Scripted(RetryableDiscoveryError("Throttling")), sim=sim)
    _run(sim, multi, 3)
    sourcing = sim.job.capacity.sourcing
    assert od.capacity_calls == [] and sourcing.raised() == {"od": 1} and sourcing.raised(sent=True) == {}
    # A call made that timed out (it may have landed): carried, so the restarted driver sets it back to 0.
    od = Scripted(DiscoveredHosts(), capacity_errors=[CapacityError("Read timeout")] * 10, limits=(0, 10, 0))
    sim = _job(1)
    multi = _sources(od, spot_hosts=0, sim=sim)
    _run(sim, multi, 3)
    assert od.capacity_calls[0] == 1 and sim.job.capacity.sourcing.raised(sent=True) == {"od": 1}


@pytest.mark.parametrize("restarted", [False, True], ids=["own-raise", "taken-over"])
def test_a_group_taken_over_that_never_launches_leaves_the_rest_to_the_next_group(restarted):
    """Review of 4f7dc85: a group the restarted driver took over at the job's value (its crashed predecessor raised
    it to 1, AWS took it, InsufficientInstanceCapacity) was never measured short: the next group was never asked."""
    from cloud_elastic.driver.runtime import raised
    from cloud_elastic.providers.multi import SHORT_FOR_S

    od = _Group(DiscoveredHosts(), limits=(0, 10, 1 if restarted else 0))  # the predecessor's raise: desired 1
    od2 = _Group(DiscoveredHosts(), limits=(0, 10, 0))
    sim = _job(2, OD2)  # one spot slot, --min-np 2: one fallback slot
    multi = _sources(od, od2, sim=sim)
    if restarted:
        raised.inherit(sim.job, {"od": 1})  # what the sign of life carried
    _run(sim, multi, 60)
    assert od2.capacity_calls == []  # od's hosts may still come
    _run(sim, multi, SHORT_FOR_S + 60)
    assert od2.capacity_calls == [1] and multi.capacity_of("od") == 1
    assert od.capacity_calls == ([] if restarted else [1])  # already at the job's value: nothing sent
    assert sim.job.capacity.sourcing.raised(sent=True) == {"od": 1, "od2": 1}
