"""A job started while its hosts still boot: the cloud says "running" minutes before sshd answers or
cloud-elastic is installed, so every first launch fails on the transport. The job waits for them up to
--start-timeout (cloud_elastic.driver.job.failures, .capacity); a script that crashes still ends it fast."""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.launch.api import ExitStatus
from cloud_elastic.driver.job.workers import WorkerState as S
from tests.unit.test_job import CRASH, T0, PAST_FIRST_COOLDOWN_S, UNREACHABLE, Sim, assert_round, failed

pytestmark = pytest.mark.timeout(10)

NO_MODULE = ExitStatus(1, transport_error="SSH failure on a:22 (not a worker failure): python3 on that host cannot "
                                          "import cloud_elastic")


def test_a_booting_host_is_retried_until_it_answers_and_the_job_then_runs(caplog) -> None:
    sim = Sim(2, start_timeout_s=120)
    sim.discover({"a": 2})
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.driver.job"):
        sim.exit("a[0]", NO_MODULE)
        sim.exit("a[1]", NO_MODULE)
    assert sim.outcome is None and sim.blocked("a[0]") and sim.blocked("a[1]")
    assert "waiting up to 120s (--start-timeout) for more" in caplog.text
    sim.advance(PAST_FIRST_COOLDOWN_S)
    assert sim.slots_launched() == ["a[0]", "a[1]"] * 2  # relaunched after the usual cooldown
    assert_round(sim.join("a[0]", "a[1]"), 1, needs_sync=True)
    sim.advance(200)  # past --start-timeout: the job formed, the start-up rule no longer applies
    assert sim.outcome is None


def test_hosts_that_never_answer_end_the_job_at_the_start_timeout_naming_the_last_transport_error() -> None:
    sim = Sim(2, start_timeout_s=120, elastic_timeout_s=30)
    sim.discover({"a": 2})
    sim.exit("a[0]", UNREACHABLE)
    while sim.outcome is None and sim.now < T0 + 200:
        for worker_id in [w.worker_id for w in sim.job.alive()]:  # every launch fails on the transport
            sim.job.exited(worker_id, NO_MODULE, sim.now)
            last = worker_id
        if sim.now < T0 + 119:
            assert sim.outcome is None, sim.outcome  # past --elastic-timeout: the start-up wait is --start-timeout's
        sim.advance(1)
    assert len(sim.launched) > 16  # both slots retried every ~11 s (the shortest cooldown), not backed off
    failed(sim, f"could be started within 120s (--start-timeout): last: worker {last} "
                "(not yet ranked) SSH failure on a:22 (not a worker failure): python3 on that host cannot import")
    assert sim.now < T0 + 122


def test_a_script_crashing_on_every_worker_at_start_still_ends_the_job_at_once() -> None:
    sim = Sim(3, min_np=1)
    sim.discover({"a": 2, "b": 1})
    sim.exit("b[0]", UNREACHABLE)  # b boots
    sim.exit("a[0]", CRASH)
    sim.exit("a[1]", CRASH)
    failed(sim, "all workers failed; last: worker " + sim.id("a[1]"), "exited with code 1")


@pytest.mark.parametrize("resumed", [False, True], ids=["new", "resumed"])
@pytest.mark.parametrize("ready_at", [250, 450])
def test_a_booting_host_is_tried_every_shortest_cooldown_and_used_soon_after_it_answers(ready_at: int,
                                                                                       resumed: bool) -> None:
    sim = Sim(1, start_timeout_s=600, checkpointing=resumed)  # the defaults: --blacklist-cooldown-range 10 300
    if resumed:  # re-run with the same --checkpoint-dir: the state is in the checkpoint (Driver._resume)
        sim.job.resumed = sim.job.state_committed = True
    sim.discover({"a": 1})
    while sim.outcome is None and not sim.job.round and sim.now < T0 + 700:
        for w in [w for w in sim.job.alive() if w.state is S.STARTING]:
            if sim.now < T0 + ready_at:
                sim.job.exited(w.worker_id, NO_MODULE, sim.now)  # sshd not up yet
            else:
                sim.join("a[0]")
        sim.advance(1)
    assert sim.outcome is None and sim.job.round == 1
    assert sim.now - T0 < ready_at + 12  # used at the next try after it answers (10 s plus up to 10 % jitter)


def test_failures_while_booting_do_not_lengthen_the_cooldown_of_a_later_real_failure() -> None:
    sim = Sim(2, min_np=1, start_timeout_s=600)
    sim.discover({"a": 1, "b": 1})
    for _ in range(5):  # a boots for a minute: its tries fail on the transport
        sim.exit("a[0]", NO_MODULE)
        sim.advance(PAST_FIRST_COOLDOWN_S)
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.exit("a[0]", CRASH)  # its first real failure
    cooldowns = [f["blacklisted_s"] for kind, f in sim.events if kind == "worker_failed"]
    assert cooldowns[:5] == [pytest.approx(10.5, abs=0.6)] * 5  # each try of the booting host at the shortest
    assert cooldowns[5] <= 11  # the first cooldown, not the 160-300 s of a sixth failure in a row


def test_with_no_blacklist_cooldown_a_host_refusing_at_once_is_tried_once_a_second_and_still_times_out() -> None:
    """--blacklist-cooldown-range 0 0: the relaunched try counts as an active worker, which kept the start-up
    bound from ever being reached (1,146 launches in 60 s, for good)."""
    sim = Sim(1, start_timeout_s=30, cooldown=(0.0, 0.0))
    sim.discover({"a": 1})
    while sim.outcome is None and sim.now < T0 + 120:
        for worker_id in [w.worker_id for w in sim.job.alive() if w.state is S.STARTING]:
            sim.job.exited(worker_id, NO_MODULE, sim.now)  # refused at once, every time
        sim.advance(0.5)
    failed(sim, "no worker could be started within 30s (--start-timeout)")
    assert sim.now < T0 + 32 and len(sim.launched) <= 32  # about one try a second, not a tight loop
