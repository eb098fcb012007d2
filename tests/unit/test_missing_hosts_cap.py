"""Discovery that names new hosts at every poll (a script listing replacement instances, a list API paging
inconsistently) must not grow the driver without bound (``driver/job/hosts.py``, ``driver/job/discovery_edge.py``).

Found by review (s62 rvH2, finding S): every host gone from discovery stayed "missing" for ``--host-missing-grace``
with no cap (98,298 of them with 16,384 hosts a poll and the default 10 s grace; without bound under a longer one),
and the driver's log listed every name: 158 MB in 75 s, lines of 3.3 MB, one WARNING per missing host per poll.
Scripted timelines on a fake clock.
"""

from __future__ import annotations

import random

import pytest

from cloud_elastic.driver.job.elastic_job import WorkerState
from cloud_elastic.driver.job.hosts import Blacklist, HostManager, Slot
from cloud_elastic.providers.api import MAX_HOSTS, DiscoveredHosts
from tests.unit.test_job import Sim, started

pytestmark = pytest.mark.timeout(20)


def removed(sim: Sim) -> dict[str, str]:
    return {h["host"]: h["reason"] for kind, f in sim.events if kind == "hosts_changed" for h in f["removed"]}


def lines(caplog: pytest.LogCaptureFixture, part: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if part in r.getMessage()]


def test_new_hosts_at_every_poll_keep_at_most_max_missing_and_log_lines_name_a_few(caplog) -> None:
    # hosts.MAX_MISSING is MAX_HOSTS: as many as one snapshot may list.
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(1, {"a": 1}, missing_grace=10)
    sim.commit("a[0]")
    for poll in range(4):  # 16,384 hosts a poll, each time new ones; "a", with the only worker, listed only first
        sim.discover({f"h{i}-{poll}.example": 1 for i in range(MAX_HOSTS - 1)} | ({"a": 1} if poll == 0 else {}))
        sim.advance(1)  # well within the grace: only the cap forgets anything
    hosts = sim.job.hosts
    assert len(hosts.missing) == MAX_HOSTS and "a" in hosts.missing  # not 3 x 16,383 + 1
    assert sim.job.workers[sim.id("a[0]")].state is WorkerState.RUNNING and sim.stops == []
    gone = removed(sim)
    assert len(gone) == 2 * (MAX_HOSTS - 1) and "a" not in gone  # the two oldest polls' hosts, never "a"
    assert {h.split("-")[1] for h in gone} == {"0.example", "1.example"}
    assert all(f"beyond the {MAX_HOSTS} missing hosts kept" in why for why in gone.values())
    assert max(len(r.getMessage()) for r in caplog.records) < 1000, max(r.getMessage() for r in caplog.records)
    missing = lines(caplog, "missing from discovery (")
    assert [line.split(" more; ")[1].split(")")[0] for line in missing] == ["1 with workers", "0 with workers",
                                                                           "0 with workers"], missing
    assert missing[0].startswith(f"job t: {MAX_HOSTS} hosts are missing from discovery (a, h0-0.example, "), missing
    assert len(lines(caplog, "hosts changed")) == 5  # the start and each poll


def test_the_cap_forgets_the_longest_missing_first_never_a_host_with_a_worker_or_a_blacklisted_slot() -> None:
    sim = Sim(2, min_np=1, missing_grace=10)
    sim.job.hosts.max_missing = 2
    sim.start({"a": 1, "b": 1})
    sim.commit("a[0]", "b[0]")
    sim.exit("b[0]")  # b[0] cools down: its host has no worker now, but the blacklist knows it
    assert sim.blocked("b[0]")
    sim.discover({"c": 1, "d": 1})  # a and b missing; c[0] takes b[0]'s place at once
    assert sim.slots_launched() == ["a[0]", "b[0]", "c[0]"]
    sim.advance(1)
    sim.discover({"e": 1, "f": 1})  # a, b, c, d missing: 2 over the cap, but only d matters to nobody
    hosts = sim.job.hosts
    assert set(hosts.missing) == {"a", "b", "c"} and list(removed(sim)) == ["d"]
    assert "beyond the 2 missing hosts kept" in removed(sim)["d"]
    assert sim.stops == [] and sim.job.workers[sim.id("a[0]")].alive and sim.job.workers[sim.id("c[0]")].alive
    sim.discover({"a": 1, "b": 1, "d": 1, "e": 1, "f": 1})  # within the grace: a and b come back as they were
    added = [h["host"] for kind, f in sim.events if kind == "hosts_changed" for h in f["added"]]
    assert added[-1:] == ["d"] and "a" not in added[2:] and "b" not in added[2:]
    assert sim.blocked("b[0]")  # its cooldown stands
    assert hosts.order_of("a") < hosts.order_of("b") < hosts.order_of("e") < hosts.order_of("f") < hosts.order_of("d")


def test_many_hosts_past_the_grace_are_removed_in_one_line_those_with_workers_named_first(caplog) -> None:
    caplog.set_level("INFO", logger="cloud_elastic.driver.job.discovery_edge")
    sim = started(2, {"a": 1, "b": 1}, min_np=1, missing_grace=10)
    sim.commit("a[0]", "b[0]")
    sim.discover({f"h{i}": 1 for i in range(100)} | {"a": 1, "b": 1})
    sim.discover({"a": 1})  # b, with a worker a[0] need not keep, goes with the 100 idle hosts
    sim.advance(11)
    assert len(removed(sim)) == 101 and sim.job.hosts.missing == {}
    said = lines(caplog, "stayed missing from discovery")
    assert said == ["job t: 101 hosts stayed missing from discovery for 10s; removed: b, h0, h1, h2, h3, h4, h5, h6 "
                    "and 93 more (1 with workers)"], said
    missing = lines(caplog, "missing from discovery (")
    assert missing == ["job t: 101 hosts are missing from discovery (b, h0, h1, h2, h3, h4, h5, h6 and 93 more; 1 with "
                       "workers); their workers keep running for up to 10s unless they come back or are reported "
                       "draining"], missing


def test_instances_of_forgotten_addresses_are_bounded_but_a_blacklisted_address_keeps_its_own() -> None:
    hosts = HostManager(Blacklist((10, 300), random.Random(0)), missing_grace_s=10)
    hosts.max_missing = 2
    hosts.update(DiscoveredHosts(ready={"x": 1}, instances={"x": "i-x"}), 0.0)
    for _ in range(3):  # --blacklist-cooldown-range aside: the third own failure at one commit blocks for good
        hosts.blacklist.record_failure(Slot("x", 0), 0.0, at_commit=5)
    assert hosts.blacklist.for_good(Slot("x", 0))
    for poll in range(1, 50):  # new addresses, new instances at every poll; each forgotten two polls on
        ready = {f"h{poll}-{i}": 1 for i in range(3)}
        hosts.update(DiscoveredHosts(ready=ready, instances={h: f"i-{h}" for h in ready}), float(poll))
    assert "x" not in hosts.missing and len(hosts._last_instance) <= len(hosts._order) + 2 + 1  # + 1: "x"
    hosts.update(DiscoveredHosts(ready={"x": 1}, instances={"x": "i-x"}), 60.0)
    assert hosts.blacklist.for_good(Slot("x", 0))  # the same instance: still blocked for good
    hosts.update(DiscoveredHosts(ready={"x": 1}, instances={"x": "i-x2"}), 61.0)
    assert not hosts.blacklist.for_good(Slot("x", 0))  # another instance at the address starts clean
