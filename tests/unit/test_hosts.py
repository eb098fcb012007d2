"""Blacklist arithmetic and host ordering (cloud_elastic.driver.job.hosts)."""

from __future__ import annotations

import random

import pytest

from cloud_elastic.driver.job.hosts import GIVEN_BACK_GRACE_S, Blacklist, HostManager, Slot
from cloud_elastic.providers.api import DiscoveredHosts, Drain

pytestmark = pytest.mark.timeout(10)

NOW = 1000.0
A0, A1 = Slot("a", 0), Slot("a", 1)


class FixedRandom(random.Random):
    """A random source whose ``random()`` always returns ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def snapshot(ready: dict[str, int], draining: dict[str, Drain] | None = None) -> DiscoveredHosts:
    return DiscoveredHosts(ready=ready, draining=draining or {})


def manager(*snapshots: DiscoveredHosts, blacklist: Blacklist | None = None) -> HostManager:
    hosts = HostManager(blacklist or Blacklist((10, 300), random.Random(0)))
    for snap in snapshots:
        hosts.update(snap)
    return hosts


# --------------------------------------------------------------- blacklist
def test_nth_failure_blocks_lo_times_two_to_the_n_minus_one_capped_at_hi() -> None:
    blacklist = Blacklist((10, 300), FixedRandom(0.0))
    delays = [blacklist.record_failure(A0, NOW) for _ in range(7)]
    assert delays == [10, 20, 40, 80, 160, 300, 300]
    assert blacklist.failures(A0) == 7


@pytest.mark.parametrize(
    ("jitter", "cooldown", "failures", "expected"),
    [
        (0.5, (10, 300), 1, 10.5),  # +5 %
        (0.999, (10, 300), 2, 20 * 1.0999),  # just under +10 %
        (0.999, (10, 170), 5, 170),  # 160 s + 10 % would pass hi: capped at hi
        (0.999, (10, 300), 6, 300),  # base already at hi: no jitter above it
    ],
)
def test_jitter_adds_at_most_ten_percent_and_never_passes_hi(
    jitter: float, cooldown: tuple[float, float], failures: int, expected: float
) -> None:
    blacklist = Blacklist(cooldown, FixedRandom(jitter))
    delays = [blacklist.record_failure(A0, NOW) for _ in range(failures)]
    assert delays[-1] == pytest.approx(expected)


def test_slots_failing_together_come_back_at_different_times() -> None:
    blacklist = Blacklist((10, 300), random.Random(0))
    delays = [blacklist.record_failure(Slot("h", i), NOW) for i in range(8)]
    assert all(10 <= d <= 11 for d in delays)
    assert len(set(delays)) == len(delays)


def test_slot_is_blocked_for_exactly_its_delay() -> None:
    blacklist = Blacklist((10, 300), FixedRandom(0.0))
    delay = blacklist.record_failure(A0, NOW)
    assert blacklist.blocked(A0, NOW + delay - 0.001)
    assert not blacklist.blocked(A0, NOW + delay)


def test_blacklisting_is_per_slot_so_siblings_stay_usable() -> None:
    blacklist = Blacklist((10, 300), FixedRandom(0.0))
    blacklist.record_failure(A0, NOW)
    blacklist.record_failure(A0, NOW)
    assert blacklist.blocked(A0, NOW + 1)
    assert not blacklist.blocked(A1, NOW + 1)
    assert not blacklist.blocked(Slot("b", 0), NOW + 1)
    assert (blacklist.failures(A0), blacklist.failures(A1)) == (2, 0)


def test_zero_range_disables_blocking_but_still_counts() -> None:
    blacklist = Blacklist((0, 0), random.Random(0))
    assert blacklist.record_failure(A0, NOW) == 0.0
    assert blacklist.record_failure(A0, NOW) == 0.0
    assert not blacklist.blocked(A0, NOW)
    assert blacklist.failures(A0) == 2


def test_each_slot_comes_back_after_its_own_cooldown() -> None:
    blacklist = Blacklist((10, 300), FixedRandom(0.0))
    blacklist.record_failure(A0, NOW)  # back at NOW + 10
    blacklist.record_failure(A1, NOW)
    blacklist.record_failure(A1, NOW)  # back at NOW + 20
    assert blacklist.blocked(A0, NOW + 9.9) and not blacklist.blocked(A0, NOW + 10)
    assert blacklist.blocked(A1, NOW + 19.9) and not blacklist.blocked(A1, NOW + 20)


# ------------------------------------------------------------ host manager
def test_older_hosts_sort_first_regardless_of_name() -> None:
    hosts = manager(snapshot({"c": 1, "b": 2}), snapshot({"a": 1, "b": 2, "c": 1}))
    assert [hosts.order_of(h) for h in ("c", "b", "a")] == sorted(hosts.order_of(h) for h in "abc")
    assert hosts.available_slots(NOW) == [Slot("c", 0), Slot("b", 0), Slot("b", 1), Slot("a", 0)]


def test_host_that_leaves_and_returns_counts_as_new() -> None:
    hosts = manager(
        snapshot({"a": 1, "b": 1, "c": 1}),
        snapshot({"b": 1, "c": 1}),
        snapshot({"a": 1, "b": 1, "c": 1}),
    )
    assert hosts.order_of("a") > hosts.order_of("c")
    assert [s.host for s in hosts.available_slots(NOW)] == ["b", "c", "a"]


def test_draining_host_keeps_its_age_and_is_not_usable() -> None:
    hosts = manager(snapshot({"a": 1, "b": 1}), snapshot({"b": 1}, {"a": Drain(reason="spot")}))
    assert not hosts.is_usable(Slot("a", 0))
    assert hosts.available_slots(NOW) == [Slot("b", 0)]
    hosts.update(snapshot({"a": 1, "b": 1}))
    assert hosts.order_of("a") < hosts.order_of("b")


def test_update_reports_what_changed() -> None:
    hosts = manager(snapshot({"a": 2, "b": 1, "c": 1}))
    changes = hosts.update(snapshot({"a": 1, "d": 1}, {"c": Drain()}))
    assert changes.added == ("d",)
    assert changes.removed == ("b",)
    assert changes.draining == ("c",)
    assert changes.resized == ("a",)
    assert not hosts.update(snapshot({"a": 1, "d": 1}, {"c": Drain()}))


def test_shrunk_host_makes_its_high_slots_unusable() -> None:
    hosts = manager(snapshot({"a": 2}), snapshot({"a": 1}))
    assert hosts.is_usable(Slot("a", 0))
    assert not hosts.is_usable(Slot("a", 1))
    assert not hosts.is_usable(Slot("gone", 0))


def test_available_slots_skip_only_blocked_slots() -> None:
    blacklist = Blacklist((10, 300), FixedRandom(0.0))
    hosts = manager(snapshot({"a": 2, "b": 1}), blacklist=blacklist)
    blacklist.record_failure(A0, NOW)
    assert hosts.available_slots(NOW + 5) == [A1, Slot("b", 0)]
    assert hosts.available_slots(NOW + 10) == [A0, A1, Slot("b", 0)]


# ------------------------------------------------------- notices that lapse
def _noticed(drain: Drain, *, at: float = NOW, grace: float = 120.0, ttl: float = 600.0) -> HostManager:
    hosts = HostManager(Blacklist((10, 300), random.Random(0)), notice_grace_s=grace, soft_notice_ttl_s=ttl)
    hosts.update(snapshot({"a": 1, "b": 1}), at)
    assert hosts.notice("b", drain, at)
    return hosts


def test_a_hard_notice_the_cloud_did_not_follow_lapses_its_grace_after_the_deadline() -> None:
    hosts = _noticed(Drain(deadline=NOW + 30, reason="spot interruption"))
    assert not hosts.update(snapshot({"a": 1, "b": 1}), NOW + 149).lapsed
    assert hosts.available_slots(NOW + 149) == [Slot("a", 0)]
    changes = hosts.update(snapshot({"a": 1, "b": 1}), NOW + 150)
    assert changes.lapsed == ("b",) and changes.added == ("b",)
    assert hosts.notices == {} and "b" not in hosts.draining
    assert hosts.available_slots(NOW + 150) == [Slot("a", 0), Slot("b", 0)]
    assert hosts.order_of("b") > hosts.order_of("a")  # it kept its age: it never left the group


def test_a_hard_notice_without_a_deadline_lapses_its_grace_after_it_arrived() -> None:
    hosts = _noticed(Drain(reason="target lifecycle state Terminated"), grace=60)
    assert not hosts.update(snapshot({"a": 1, "b": 1}), NOW + 59).lapsed
    assert hosts.update(snapshot({"a": 1, "b": 1}), NOW + 60).lapsed == ("b",)


def test_a_deadline_absurdly_far_ahead_still_lapses_an_hour_on() -> None:
    """A Spot notice whose time reads year 9999 must not keep a host the cloud did not take off for ever."""
    hosts = _noticed(Drain(deadline=253402300799.0, reason="spot interruption"))
    assert not hosts.update(snapshot({"a": 1, "b": 1}), NOW + 3600 + 119).lapsed
    assert hosts.update(snapshot({"a": 1, "b": 1}), NOW + 3600 + 120).lapsed == ("b",)


def test_a_hard_notice_does_not_lapse_while_the_group_reports_the_host_leaving() -> None:
    hosts = _noticed(Drain(deadline=NOW + 30, reason="spot interruption"))
    leaving = snapshot({"a": 1}, {"b": Drain(reason="Terminating:Wait")})
    assert not hosts.update(leaving, NOW + 1000).lapsed
    assert hosts.draining["b"] == Drain(NOW + 30, "spot interruption")


def test_a_deadline_in_wall_time_is_counted_on_the_managers_clock() -> None:
    hosts = HostManager(Blacklist((10, 300), random.Random(0)), notice_grace_s=120)
    hosts.update(snapshot({"a": 1, "b": 1}), 5.0)  # a monotonic clock; the wall clock reads NOW
    hosts.notice("b", Drain(deadline=NOW + 30, reason="spot interruption"), 5.0, NOW)
    assert not hosts.update(snapshot({"a": 1, "b": 1}), 154.0).lapsed
    assert hosts.update(snapshot({"a": 1, "b": 1}), 155.0).lapsed == ("b",)


def test_a_host_given_back_for_a_hard_notice_waits_longer_while_the_same_instance_is_listed() -> None:
    # A Kubernetes pod whose SIGTERM drained it may be listed Running and Ready until it is gone.
    hosts = HostManager(Blacklist((10, 300), random.Random(0)), notice_grace_s=120)
    pod = DiscoveredHosts(ready={"a": 1, "b": 1}, instances={"a": "pa/u1/0", "b": "pb/u2/0"})
    hosts.update(pod, NOW)
    hosts.notice("b", Drain(deadline=NOW + 30, reason="SIGTERM to worker b[0]"), NOW)
    hosts.given_back("b")  # its workers left and it was released to the cloud
    assert not hosts.update(pod, NOW + 150 + GIVEN_BACK_GRACE_S - 1).lapsed
    assert "b" in hosts.draining and hosts.available_slots(NOW + 700) == [Slot("a", 0)]
    # Not for good: a VM whose guest rebooted (systemd's SIGTERM reached the worker) is the same instance after.
    assert hosts.update(pod, NOW + 150 + GIVEN_BACK_GRACE_S).lapsed == ("b",)
    assert hosts.available_slots(NOW + 800) == [Slot("a", 0), Slot("b", 0)]


def test_a_host_given_back_that_is_another_instance_now_lapses_as_before() -> None:
    hosts = HostManager(Blacklist((10, 300), random.Random(0)), notice_grace_s=120)
    hosts.update(DiscoveredHosts(ready={"a": 1, "b": 1}, instances={"a": "pa/u1/0", "b": "pb/u2/0"}), NOW)
    hosts.notice("b", Drain(deadline=NOW + 30, reason="SIGTERM to worker b[0]"), NOW)
    hosts.given_back("b")
    # The container restarted: another instance at the address, which the lapse may give back to the job.
    restarted = DiscoveredHosts(ready={"a": 1, "b": 1}, instances={"a": "pa/u1/0", "b": "pb/u2/1"})
    assert not hosts.update(restarted, NOW + 149).lapsed
    assert hosts.update(restarted, NOW + 150).lapsed == ("b",)
    assert hosts.available_slots(NOW + 150) == [Slot("a", 0), Slot("b", 0)]


def test_a_host_given_back_without_an_instance_id_lapses_as_before() -> None:
    hosts = _noticed(Drain(deadline=NOW + 30, reason="spot interruption"))
    hosts.given_back("b")  # a static list or a script: nothing tells this host from its successor
    assert hosts.update(snapshot({"a": 1, "b": 1}), NOW + 150).lapsed == ("b",)


def test_a_soft_notice_lapses_after_its_ttl_and_the_host_takes_workers_again() -> None:
    hosts = HostManager(Blacklist((10, 300), random.Random(0)), soft_notice_ttl_s=600)
    hosts.update(snapshot({"a": 1, "b": 1}), NOW)
    assert hosts.soft_notice("b", "rebalance recommendation", NOW)
    assert not hosts.update(snapshot({"a": 1, "b": 1}), NOW + 599).lapsed
    assert hosts.available_slots(NOW + 599) == [Slot("a", 0)]
    assert hosts.update(snapshot({"a": 1, "b": 1}), NOW + 600).lapsed == ("b",)
    assert hosts.available_slots(NOW + 600) == [Slot("a", 0), Slot("b", 0)]


def test_drain_soft_drains_the_hosts_of_the_providers_soft_notices_while_it_reports_them() -> None:
    hosts = HostManager(Blacklist((10, 300), random.Random(0)), drain_soft=True)
    hosts.update(snapshot({"a": 1, "b": 1}))
    changes = hosts.update(DiscoveredHosts(ready={"a": 1, "b": 1}, soft={"b": "rebalance recommendation"}))
    assert changes.draining == ("b",) and hosts.draining == {"b": Drain(None, "rebalance recommendation")}
    assert hosts.available_slots(NOW) == [Slot("a", 0)]
    assert hosts.update(snapshot({"a": 1, "b": 1})).added == ("b",)  # the provider no longer reports it
