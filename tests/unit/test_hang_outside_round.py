"""Hangs outside any round (cloud_elastic.driver.job.failures, review s57 rvC F1 of 7d46b89).

Workers given up together count once: a host whose waiting workers froze once together is one outage. A worker
relaunched after a give-up that hangs again is a new hang, though it too waits outside any round: keyed by its
host alone, every later hang there matched the first and counted 0, and a fixed-size job ran for good.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.repeats import REPEATS
from tests.unit.test_job import KILLED, failed
from tests.unit.test_job_repeats import fixed, signalled

pytestmark = pytest.mark.timeout(30)


def give_up_silent(sim, slot: str, printed: bool) -> str:
    """The worker on ``slot`` goes silent until the driver gives it up; it prints its stacks on the signal
    (``printed``: a GIL hang) or not, and the driver's kill ends it. Its worker id."""
    w = sim.id(slot)
    sim.silent.add(w)
    for _ in range(60):
        sim.advance(0.5)
        if not sim.job.workers[w].alive:
            break
    assert not sim.job.workers[w].alive, sim.job.workers[w].state
    signalled(sim, w, printed=printed)
    if sim.outcome is None:
        sim.exit(slot, KILLED)
    return w


def relaunched(sim, slot: str, before: str) -> str:
    """The slot cools down and a new worker starts there; it registers (waiting at rendezvous, in no round)."""
    for _ in range(20):
        sim.advance(0.5)
        if sim.id(slot) != before:
            break
    w = sim.id(slot)
    assert w != before
    sim.job.registered(w, sim.now)
    assert sim.job.workers[w].round == 0
    return w


def test_a_worker_relaunched_after_a_hang_that_hangs_again_in_its_set_up_counts_again(caplog) -> None:
    """setup_hang.py: rank 1 holds the GIL after commit 6 (given up as a member of round 1: 1 of 3); each worker
    relaunched on its slot holds it the same way in its set-up, after hvd.init(), outside any round. The second
    counted (2 of 3); every later one matched its key and counted 0, and -np 2 ran past 300 s. Now the third ends
    the job with the usual line."""
    caplog.set_level("WARNING", logger="cloud_elastic.driver.job.failures")
    sim = fixed()
    b = give_up_silent(sim, "b[0]", printed=True)
    sim.join("a[0]", reason="failure")  # rank 0 back at rendezvous after the abort, waiting for rank 1
    for n in range(2, REPEATS + 1):
        assert sim.outcome is None, sim.outcome
        b = relaunched(sim, "b[0]", b)
        give_up_silent(sim, "b[0]", printed=True)
    assert caplog.text.count(f"in a row at commit 6 before the job ends") == REPEATS - 1, caplog.text
    failed(sim, f"was given up {REPEATS} times in a row at commit 6", "silent (holding the GIL?)")


def test_unarmed_workers_relaunched_on_a_host_count_once_per_outage(caplog) -> None:
    """Unarmed workers (counted on their silence alone) outside any round: the two workers of one host that froze
    together count once; the two relaunched there that freeze again later are a second outage."""
    caplog.set_level("WARNING", logger="cloud_elastic.driver.job.failures")
    from tests.unit.test_job import Sim

    sim = Sim(3, min_np=3, cooldown=(1.0, 2.0), progress_timeout_s=5, elastic_timeout_s=60)
    sim.discover({"a": 1, "b": 2})
    sim.job.registered(sim.id("a[0]"), sim.now)  # b's workers wait, registered, for a round that needs them both
    for outage in (1, 2):
        host = [sim.id(f"b[{i}]") for i in range(2)]
        for w in host:
            sim.job.registered(w, sim.now)
            sim.job.workers[w].stacks_signal = False
        sim.silent.update(host)
        for _ in range(60):
            sim.advance(0.5)
            if not any(sim.job.workers[w].alive for w in host):
                break
        for i, w in enumerate(host):
            signalled(sim, w, printed=False)
            sim.exit(f"b[{i}]", KILLED)
        assert f"{outage} of {REPEATS}" in caplog.text and f"{outage + 1} of {REPEATS}" not in caplog.text, caplog.text
        for _ in range(20):  # both slots cool down and get new workers
            sim.advance(0.5)
            if all(sim.id(f"b[{i}]") not in host for i in range(2)):
                break
        assert sim.outcome is None
