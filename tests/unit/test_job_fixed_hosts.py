"""A fixed ``-H`` list never grows (``Policy.hosts_fixed``, driver.job.capacity): once the slots not blacklisted
for the rest of the job are fewer than ``--min-np``, the job ends at once, naming them and the last failure.

Before: an allreduce of different shapes on ``-H 127.0.0.2:1,127.0.0.3:1`` crashed Gloo (SIGABRT) on every
round, the slot was blacklisted for good on the third, and the job then waited ``--elastic-timeout`` (600 s)
"for more" slots that a fixed list can never offer.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.exit_status import ExitStatus, LastErrors
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.repeats import REPEATS
from cloud_elastic.notices.api import NOTICE_GRACE_S
from cloud_elastic.providers.api import DiscoveredHosts, Drain
from cloud_elastic.providers.addressmap import AddressMappedDiscovery, parse_address_map
from cloud_elastic.providers.static import StaticHosts, never_grows
from tests.unit.test_job import failed, started

pytestmark = pytest.mark.timeout(30)

ABORTED = ExitStatus(-6)


WHAT = ("what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] "
        "op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected size. Is there a "
        "distributed collective mismatch in your code?")
#: What a worker whose allreduce got another shape prints as Gloo aborts it (trimmed from a real run).
GLOO_ABORT = ["allreduce -> [2.0, 2.0, 2.0]", "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
              "  " + WHAT, "Fatal Python error: Aborted", "", "Thread 0x00007f7367a806c0 (most recent call first):",
              '  File "/usr/lib/python3.11/threading.py", line 327 in wait', "",
              "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)"]


def crash_loop(sim) -> None:
    """b[0]'s worker is killed by SIGABRT REPEATS times at commit 0: its slot is out for the rest of the job."""
    for n in range(1, REPEATS + 1):
        sim.exit("b[0]", ExitStatus(-6, last_error=WHAT))
        sim.join("a[0]", reason="failure")
        if n < REPEATS:
            sim.advance(3)  # past the cooldown: a new worker on b[0] joins the survivor
            sim.join("b[0]")
    assert sim.job.hosts.blacklist.for_good(Slot("b", 0))


def test_a_fixed_list_left_below_min_np_by_a_slot_blacklisted_for_good_ends_the_job_at_once() -> None:
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), hosts_fixed=True)
    crash_loop(sim)
    sim.advance(0.5)
    failed(sim, "1 worker(s) ready and 1 slot(s) left for --min-np 2: b[0] blacklisted for the rest of the job, "
                "and a fixed host list never grows; last failure: worker b[0]#",
           f"killed by signal 6 after printing: {WHAT}; slot b[0] is blacklisted for the rest of the job: it "
           f"failed {REPEATS} times in a row at commit 0")
    assert "elastic timeout" not in sim.outcome.reason and "\n" not in sim.outcome.reason


def test_a_source_that_may_grow_still_waits_for_the_elastic_timeout() -> None:
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=30)
    crash_loop(sim)
    sim.advance(10)
    assert sim.outcome is None  # a cloud group may bring a host back
    sim.advance(25)
    failed(sim, "fewer than --min-np 2 worker(s) for 30s (elastic timeout)")


def test_a_fixed_list_with_enough_slots_left_goes_on_below_np() -> None:
    sim = started(2, {"a": 1, "b": 1, "c": 1}, min_np=1, cooldown=(0.0, 0.0), hosts_fixed=True)
    sim.exit("b[0]", ABORTED)  # 0 0: out for good at once; a[0] and c[0] are left, --min-np 1
    sim.advance(0.5)
    assert sim.outcome is None


def out_for_good_then_notice(soft: bool = False, source: str = "sigterm"):
    """-np 3 --min-np 2 on a fixed a, b, c: c[0] crashes once (cooldown 0 0: out for good), then b gets a notice."""
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=2, cooldown=(0.0, 0.0), hosts_fixed=True, elastic_timeout_s=300)
    sim.exit("c[0]", ABORTED)
    sim.join("a[0]", "b[0]", reason="failure")
    sim.advance(1)
    assert sim.outcome is None and sim.job.hosts.blacklist.for_good(Slot("c", 0))
    sim.job.hosts.drain_soft = soft  # --drain-on-rebalance
    sim.job.notice("b", Drain(sim.now + 30, "SIGTERM to the worker (a pod deletion or node drain)"), sim.now,
                   source=source, soft=soft)
    sim._collect()
    sim.join("a[0]", "b[0]", reason="update")  # b[0] leaves at its next commit; a[0] waits, below --min-np
    sim.exit("b[0]", ExitStatus(0))
    sim.advance(5)
    return sim


@pytest.mark.parametrize("soft", [False, True], ids=["sigterm", "soft-notice-drain-on-rebalance"])
def test_a_host_draining_for_a_notice_still_counts_on_a_fixed_list(soft: bool) -> None:
    """Review rv6 d4: a host draining for a notice that lapses (a SIGTERM on a reboot) was counted as gone for
    good, and the job ended "1 worker(s) ready and 1 slot(s) left for --min-np 2" instead of waiting for it."""
    sim = out_for_good_then_notice(soft)
    assert "b" in sim.job.hosts.draining
    assert sim.outcome is None, sim.outcome.reason  # the notice may lapse: the host comes back
    sim.advance(30 + NOTICE_GRACE_S)  # the deadline and its grace passed, the host still listed
    sim.job.discovered(DiscoveredHosts(ready={"a": 1, "b": 1, "c": 1}), sim.now)  # lapsed: b is ready again
    sim.advance(5)
    assert sim.outcome is None and "b" in sim.job.hosts.ready
    sim.join("b[0]")
    assert sorted(sim.layout()) == ["a[0]", "b[0]"]


def test_a_host_an_operator_drained_is_gone_for_good_on_a_fixed_list() -> None:
    sim = out_for_good_then_notice(source="operator")
    failed(sim, "1 worker(s) ready and 1 slot(s) left for --min-np 2: c[0] blacklisted for the rest of the job, "
                "host(s) b drained by an operator, and a fixed host list never grows; last failure: worker c[0]#")


def test_only_a_fixed_list_never_grows() -> None:
    hosts = StaticHosts({"127.0.0.2": 1})
    assert never_grows(hosts) and never_grows(AddressMappedDiscovery(hosts, parse_address_map(["127.0.0.0/24=10.0.0.0/24"])))
    assert not never_grows(object())  # a discovery script, a cloud group


def test_a_worker_killed_by_a_signal_is_named_with_the_last_error_line_it_printed() -> None:
    last = LastErrors(lambda: 0.0)
    for line in GLOO_ABORT:
        last.offer("b[0]#2", line)
    status, _ = last.attach("b[0]#2", ExitStatus(-6))
    assert status.describe == f"killed by signal 6 after printing: {WHAT}"
    assert last.attach("b[0]#2", ExitStatus(-6))[0].describe == "killed by signal 6"  # forgotten once attached
    last.offer("b[0]#3", "RuntimeError: " + "x" * 1000)
    assert len(last.attach("b[0]#3", ExitStatus(-11))[0].last_error) == 300  # bounded
    last.offer("b[0]#4", "ValueError: bad input")
    assert last.attach("b[0]#4", ExitStatus(1), reported=True)[0].describe == "exited with code 1"  # its report
