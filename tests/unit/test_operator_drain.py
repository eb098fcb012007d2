"""``cloud-elastic drain JOB HOST``: a host an operator drained takes no new worker until it leaves discovery.

A cloud's notice lapses when the cloud did not take the host (tests/unit/test_hosts.py); an operator's drain is a
decision, like ``kubectl cordon`` + ``drain``, and lasts until the host leaves discovery. A drained slot keeps its
blacklist with cooldown (tests/unit/test_job_health.py).
"""

from __future__ import annotations

import logging
import random

import pytest

from cloud_elastic.driver.job.elastic_job import WorkerState
from cloud_elastic.driver.job.hosts import Blacklist, HostManager, Slot
from cloud_elastic.providers.api import DiscoveredHosts, Drain
from tests.unit.test_job import CLEAN, Sim, failed, started

pytestmark = pytest.mark.timeout(30)

S = WorkerState
NOW = 1000.0


def _elastic(sim: Sim) -> Sim:
    """The job's script enters ``hvd.elastic.run`` (its workers' heartbeats say so): a drained worker leaves at a
    commit. A job none of whose workers did may be fixed-size, whose drained workers run to the end of the script
    (tests/unit/test_operator_drain_fixed_size.py)."""
    sim.job.fixed.entered(sim.id(sim.layout()[0]))
    return sim


def _leave_at_commit(sim: Sim, stay: tuple[str, ...], host: str) -> None:
    """The drained host's workers leave at their next commit; the others re-form without them."""
    sim.join(*stay, reason="update")
    for slot in [str(w.slot) for w in sim.job.workers.values() if w.alive and w.slot.host == host]:
        sim.join(slot, reason="update")
        sim.exit(slot, CLEAN)


def _listed(sim: Sim, ready: dict[str, int], seconds: float) -> None:
    """Discovery keeps listing ``ready`` every 5 s for ``seconds``."""
    for _ in range(int(seconds // 5)):
        sim.advance(5)
        sim.discover(ready)


def test_a_drained_host_gets_no_new_worker_while_discovery_lists_it(caplog):
    caplog.set_level(logging.INFO)
    sim = started(3, {"a": 2, "b": 1}, min_np=1, progress_timeout_s=0)  # the survivors' steps are not played
    done, message = sim.job.drain("b", None, sim.now)
    assert done
    _leave_at_commit(sim, ("a[0]", "a[1]"), "b")
    _listed(sim, {"a": 2, "b": 1}, 600)  # well past a cloud notice's 2-minute lapse
    assert sim.slots_launched().count("b[0]") == 1, sim.slots_launched()
    assert "lapsed" not in caplog.text
    assert "b" in sim.job.hosts.draining and sim.job.phase.value == "running"


def test_a_drained_host_that_left_discovery_and_came_back_takes_workers_again():
    sim = started(3, {"a": 2, "b": 1}, min_np=1)
    sim.job.drain("b", None, sim.now)
    _leave_at_commit(sim, ("a[0]", "a[1]"), "b")
    _listed(sim, {"a": 2}, 10)
    _listed(sim, {"a": 2, "b": 1}, 10)
    assert sim.slots_launched().count("b[0]") == 2


def test_the_reply_warns_when_the_drain_leaves_fewer_ready_slots_than_min_np():
    sim = _elastic(started(3, {"a": 2, "b": 1}, min_np=3, elastic_timeout_s=300))
    done, message = sim.job.drain("b", None, sim.now)
    assert done
    assert message.endswith("; WARNING: that leaves room for 2 worker(s), below --min-np 3: the job waits for more "
                            "up to --elastic-timeout (300s), then fails")


def test_on_a_fixed_host_list_the_reply_says_the_job_ends_and_it_does():
    sim = _elastic(started(3, {"a": 2, "b": 1}, min_np=3, elastic_timeout_s=300, hosts_fixed=True))
    done, message = sim.job.drain("b", None, sim.now)
    assert done
    assert message.endswith("; WARNING: that leaves 2 slot(s), below --min-np 3, and a fixed -H list cannot "
                            "grow: the job ends once its workers have left (its newest commit written first with "
                            "--checkpoint-dir)")
    _leave_at_commit(sim, ("a[0]", "a[1]"), "b")
    sim.advance(5)
    sim.discover({"a": 2, "b": 1})
    failed(sim, "left for --min-np 3", "b drained by an operator",
           "a fixed host list never grows")


def test_a_cloud_notice_on_a_drained_host_lapses_but_the_drain_stays():
    hosts = HostManager(Blacklist((10, 300), random.Random(0)), notice_grace_s=120)
    both = DiscoveredHosts(ready={"a": 1, "b": 1})
    hosts.update(both, NOW)
    assert hosts.hold("b", Drain(reason="drained by hand"))
    assert hosts.notice("b", Drain(deadline=NOW + 30, reason="spot interruption"), NOW) is False
    assert hosts.draining["b"] == Drain(NOW + 30, "spot interruption")  # the cloud's deadline is honoured
    changes = hosts.update(both, NOW + 1000)
    assert changes.lapsed == () and not changes  # the notice went, quietly: the host still drains
    assert hosts.notices == {} and "b" in hosts.draining
    assert hosts.available_slots(NOW + 1000) == [Slot("a", 0)]
    hosts.update(DiscoveredHosts(ready={"a": 1}), NOW + 1001)
    hosts.update(both, NOW + 1002)
    assert hosts.available_slots(NOW + 1002) == [Slot("a", 0), Slot("b", 0)]


def test_on_a_fixed_host_list_a_slot_cooling_down_is_waited_for_as_the_reply_says():
    """The rule that ends a fixed list's job counts a slot cooling down (it serves again), and so does the reply.

    Before: c[0] crashed once (cooldown 60 s), then b was drained: the reply counted only the slots ready now
    ("leaves 1 ready slot(s) ... the job ends now") while the job waited for c[0] and went on there."""
    sim = _elastic(started(2, {"a": 1, "b": 1, "c": 1}, min_np=2, cooldown=(60.0, 60.0), elastic_timeout_s=300,
                           hosts_fixed=True))
    assert sorted(str(w.slot) for w in sim.job.members()) == ["a[0]", "b[0]"]
    sim.advance(1)
    sim.exit("b[0]")  # a crash: b[0] cools down for 60 s; c[0] takes its place
    sim.join("a[0]", reason="failure")
    sim.join("c[0]")
    assert sorted(str(w.slot) for w in sim.job.members()) == ["a[0]", "c[0]"]
    done, message = sim.job.drain("c", None, sim.now)
    assert done
    assert message.endswith("; WARNING: that leaves room for 1 worker(s), below --min-np 2, and 1 more slot(s) "
                            "cooling down after a failure or on a host with a notice: the job waits for them up to "
                            "--elastic-timeout (300s), then fails")
    _leave_at_commit(sim, ("a[0]",), "c")
    sim.advance(5)
    assert sim.outcome is None
    for _ in range(14):
        sim.advance(5)
    assert sim.outcome is None and sim.slots_launched().count("b[0]") == 2, sim.slots_launched()


def test_a_drain_that_leaves_enough_ready_slots_says_nothing_more():
    sim = _elastic(started(2, {"a": 1, "b": 1, "c": 1}, min_np=2, hosts_fixed=True))
    done, message = sim.job.drain("b", None, sim.now)
    assert done and "WARNING" not in message


def test_a_cloud_notice_with_a_deadline_on_a_drained_host_is_said_once_with_its_deadline(caplog):
    # Review s59 rvO: the cloud's notice was no news (the host drains already), and Leavers.notice returned before
    # its line: the operator never saw that the cloud reclaims the host, nor by when (fixT d2.py: no line at all).
    caplog.set_level(logging.INFO)
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    sim.job.drain("b", None, sim.now)
    deadline = sim.now + sim.job.wall_offset + 90
    for _ in range(3):  # the metadata watcher reports it again at each poll
        sim.job.notice("b", Drain(deadline=deadline, reason="EC2 Spot interruption"), sim.now, source="aws-imds")
        sim.advance(1)
    lines = [r.getMessage() for r in caplog.records if "notice from aws-imds" in r.getMessage()]
    assert lines == ["job t: notice from aws-imds for host b: EC2 Spot interruption, 90s before its deadline; the "
                     "operator drained it already: its workers leave by that deadline at the latest"], lines
    notices = [(f["source"], f["deadline"]) for kind, f in sim.events if kind == "notice" and f["host"] == "b"]
    assert notices == [("operator", None), ("aws-imds", deadline)], notices
