"""The job's cost counts the fallback hosts it raised that run no worker (cloud_elastic.driver.job.paid).

Found by review s62 rvS (finding 2): with --manage-capacity, the start-up raise sized the on-demand group to the
fewest Spot slots seen; once Spot gave more, the group kept hosts no worker used for as long as Spot stayed short
of -np (a group is not lowered while a worker runs on it). The job charged its workers only: it reported $0.019
where the on-demand hosts alone cost $0.044.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.actions import SetCapacity
from cloud_elastic.driver.job.elastic_job import WorkerState
from cloud_elastic.driver.runtime.costs import final_cost
from tests.unit.test_job import CLEAN
from tests.unit.test_job_sourcing import Sourced, running

pytestmark = pytest.mark.timeout(10)


def started_with_idle_fallback_hosts() -> Sourced:
    """-np 4 --min-np 2 --fallback-after 600: Spot shows 1 slot at start, so the fallback group is raised to 3;
    by the time its hosts are listed Spot shows 3, so the job starts on 3 Spot slots and od0, with od1 and od2
    listed, raised by the job, and idle."""
    sim = Sourced(4, min_np=2, manage_capacity=True, fallback_after_s=600, progress_timeout_s=0)
    sim.groups(a=1)
    assert sim.capacity == [SetCapacity("od", 3)]
    sim.groups(a=3, od=3)
    assert sorted(sim.slots_launched()) == ["a0[0]", "a1[0]", "a2[0]", "od0[0]"]
    sim.join(*sim.slots_launched())
    assert len(running(sim)) == 4 and sim.capacity == [SetCapacity("od", 3)]  # od1 and od2 stay in the group
    return sim


def test_the_raised_fallback_hosts_no_worker_uses_are_in_the_cost_and_a_warning_names_them(caplog):
    caplog.set_level("INFO", logger="cloud_elastic.driver.job")
    sim = started_with_idle_fallback_hosts()
    sim.advance(360)  # a tenth of an hour
    s = sim.job.capacity.sourcing.summary(sim.now)
    # 3 Spot slots at 1.0 and od0's worker at 4.0, as before; and od1, od2 at 4.0 each, the job's since it raised them
    assert s.dollars == pytest.approx(0.3 + 0.4 + 0.8, rel=1e-3)
    assert s.dollars_per_hour == pytest.approx(3.0 + 4.0 + 8.0)
    assert s.by_source == pytest.approx({"spot-a": 0.3, "od": 1.2}, rel=1e-3)
    assert s.slot_hours == pytest.approx(0.6, rel=1e-3) and s.idle_slot_hours == pytest.approx(0.2, rel=1e-3)
    costs = [f for k, f in sim.events if k == "cost"]
    assert costs[-1]["idle_slot_hours"] > 0 and costs[-1]["dollars_per_hour"] == pytest.approx(15.0)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "no worker" in r.getMessage()]
    assert len(said) == 1 and "2 host(s) of host source 'od', which the job raised" in said[0], said
    assert "for 30s (od1, od2)" in said[0]  # od0 was idle only until its worker was launched
    end = final_cost(sim.job, sim.now)
    assert end.fields["cost"] == pytest.approx(1.5, rel=1e-3)
    assert end.fields["idle_slot_hours"] == pytest.approx(0.2, rel=1e-3)
    assert "0.200 of the slot-hour(s) were on hosts of a fallback group the job raised" in end.line, end.line
    # A job on the fallback alone holds -np slots at 4.0 (0.4 slot-hours: $1.60), not the hosts this one raised
    # and left idle (review s63 rvX F5: it said $2.40, so the saving shown was $0.90 where it is $0.10).
    assert end.fields["cost_fallback_only"] == pytest.approx(1.6, rel=1e-3)
    assert "the same slot-hours on the fallback alone: $1.60" in end.line, end.line


def test_once_the_group_is_set_back_its_hosts_are_no_longer_charged():
    sim = started_with_idle_fallback_hosts()
    sim.commit(*running(sim))
    sim.groups(a=4, od=3)  # Spot gives -np: the fallback is no longer wanted
    sim.join("a3[0]")
    sim.advance(1)
    assert sim.state("od0[0]") is WorkerState.DRAINING
    sim.commit(*running(sim))
    sim.join(*running(sim), reason="update")
    sim.exit("od0[0]", CLEAN)
    sim.advance(1)
    assert sim.capacity[-1] == SetCapacity("od", 0)
    sim.groups(a=4, od=3)  # the cloud has not taken the hosts away yet: no longer the job's
    before = sim.job.capacity.sourcing.summary(sim.now)
    sim.advance(360)
    after = sim.job.capacity.sourcing.summary(sim.now)
    assert after.dollars - before.dollars == pytest.approx(0.4, rel=1e-3)  # 4 Spot slots at 1.0 only
    assert after.idle_slot_hours == pytest.approx(before.idle_slot_hours)


def test_a_fallback_group_the_job_did_not_raise_is_not_charged_for_its_free_hosts():
    sim = Sourced(4, min_np=2, fallback_after_s=600, progress_timeout_s=0)  # no --manage-capacity
    sim.groups(a=3, od=3)
    sim.join(*sim.slots_launched())
    sim.advance(360)
    s = sim.job.capacity.sourcing.summary(sim.now)
    assert s.dollars == pytest.approx(0.3 + 0.4, rel=1e-3) and s.idle_slot_hours == 0
