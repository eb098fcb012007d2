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
ADVICE = (f"never reached the driver at {ADDRESS} within 60s, though it tried (see its output): check "
          "--driver-address and that the workers can reach the driver (firewall)")
SET_UP = (f"never reached the driver at {ADDRESS} within 60s and printed no failed try: its script's set-up before "
          "hvd.init(), or its launch, took that long (raise --start-timeout, or see what it waits on); else check "
          "--driver-address and that the workers can reach the driver (firewall)")


def _never_registered(tried: bool) -> Sim:
    sim = Sim(2, start_timeout_s=60)
    sim.job.silence.driver_address = ADDRESS  # the driver sets it once it listens
    sim.discover({"a": 1, "b": 1})
    for w in sim.job.workers.values():
        w.tried_driver = tried  # WorkerProcesses sets it on the worker's warning (test_retry_warning_is_read_back)
    while sim.outcome is None and sim.now < T0 + 90:
        for stop in sim.stops:
            if sim.job.workers[stop.worker_id].alive:
                sim.job.exited(stop.worker_id, None, sim.now)  # killed by the stop
        sim.advance(1)
    return sim


def test_a_worker_that_never_tried_the_driver_is_named_for_its_slow_set_up_first() -> None:
    """rvA s1: a script whose set-up before hvd.init() hung, on -H localhost, was told to check --driver-address
    and the firewall; it never tried the driver (it printed no failed call), so its set-up leads."""
    sim = _never_registered(tried=False)
    assert all(SET_UP in stop.reason and not stop.stacks for stop in sim.stops), sim.stops
    failed(sim, "(not yet ranked) " + SET_UP)


def test_workers_that_never_registered_are_stopped_naming_the_driver_address_without_stacks() -> None:
    sim = Sim(2, start_timeout_s=60)
    sim.job.silence.driver_address = ADDRESS  # the driver sets it once it listens
    sim.discover({"a": 1, "b": 1})
    for w in sim.job.workers.values():
        w.tried_driver = True  # each printed a failed call to the driver
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


def test_retry_warning_is_read_back() -> None:
    """The worker's warning (driver_link) is what the driver's output thread recognises, whatever the logging
    prefix; an ordinary line is not."""
    from cloud_elastic.protocol_reports import driver_retrying, said_retrying

    line = driver_retrying("a[0]#1", "register", ADDRESS, "failed", "[Errno 111] Connection refused", 65)
    assert line == (f"worker a[0]#1: register to the driver at {ADDRESS} failed ([Errno 111] Connection refused); "
                    "retrying for up to 65s")
    assert said_retrying(line) and said_retrying("WARNING:cloud_elastic.worker.link.driver_link:" + line)
    assert not said_retrying("loading the dataset; retrying for up to 3 times")


def test_the_output_thread_marks_a_worker_that_printed_a_failed_try() -> None:
    from cloud_elastic.protocol_reports import driver_retrying
    from tests.unit.test_unreachable_driver import launched

    sim = Sim(1)
    sim.discover({"a": 1})
    _, launcher = launched(sim, 41234)
    (wid, proc), = launcher.procs.items()
    proc.say("downloading the dataset")
    assert not sim.job.workers[wid].tried_driver
    proc.say(driver_retrying(wid, "register", ADDRESS, "failed", "timed out", 65))
    assert sim.job.workers[wid].tried_driver
