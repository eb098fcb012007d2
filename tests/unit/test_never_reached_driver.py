"""Workers that never reach the driver within --start-timeout: the driver's line names the address they were told
to reach, and no stack dump is asked of them (review s56 rv6 d9_addr.sh: with --driver-address 10.9.9.9 and
--start-timeout 60, below the worker's own 65 s retry limit, the job ended "all workers failed; last: worker ...
(not yet ranked) did not reach rendezvous within 60s", never naming the address, after a 15-line stack dump per
worker that only showed it retrying the driver)."""

from __future__ import annotations

import pytest

from tests.unit.test_job import T0, Sim, failed

pytestmark = pytest.mark.timeout(10)

ADDRESS = "10.9.9.9:41234"
ADVICE = (f"never reached the driver at {ADDRESS} within 60s: check --driver-address and that the workers can reach "
          "the driver (firewall)")


def test_workers_that_never_registered_are_stopped_naming_the_driver_address_without_stacks() -> None:
    sim = Sim(2, start_timeout_s=60)
    sim.job.silence.driver_address = ADDRESS  # the driver sets it once it listens
    sim.discover({"a": 1, "b": 1})
    while sim.outcome is None and sim.now < T0 + 90:
        for stop in sim.stops:
            if sim.job.workers[stop.worker_id].alive:
                sim.job.exited(stop.worker_id, None, sim.now)  # killed by the stop
        sim.advance(1)
    assert {stop.worker_id for stop in sim.stops} == {sim.id("a[0]"), sim.id("b[0]")}
    assert all(ADVICE in stop.reason and not stop.stacks for stop in sim.stops), sim.stops
    failed(sim, "(not yet ranked) " + ADVICE)


def test_a_registered_worker_gone_silent_is_still_asked_for_its_stacks() -> None:
    sim = Sim(2, start_timeout_s=60, heartbeat_timeout_s=5)
    sim.job.silence.driver_address = ADDRESS
    sim.discover({"a": 2})
    sim.join("a[0]", "a[1]")
    sim.silent = {sim.id("a[0]")}
    sim.advance(10)
    [stop] = sim.stops
    assert stop.worker_id == sim.id("a[0]") and stop.stacks and "stopped answering heartbeats" in stop.reason
