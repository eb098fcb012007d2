"""Several host sources in one job: the command line, the merged discovery, prices and the capacity calls.

The sources are scripted stand-ins for providers; the cloud ones are tested over HTTP in
``tests/emulator/test_multi_source.py``.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from cloud_elastic.errors import (CapacityDeniedError, CapacityError, ConfigError, FatalDiscoveryError,
                                  RetryableDiscoveryError)
from cloud_elastic.providers.api import DiscoveredHosts, Drain, HostDiscovery
from cloud_elastic.providers.multi import MultiSourceDiscovery
from cloud_elastic.providers.selection import build_discovery, parse_discovery_args, source_specs
from cloud_elastic.providers.sources import SourceSpec, parse_source_flag

pytestmark = pytest.mark.timeout(10)


class Scripted(HostDiscovery):
    """Answers what the test put in ``answers`` (a snapshot or an exception), the last one again and again."""

    name = "scripted"

    def __init__(self, *answers, hourly=None, capacity_errors=(), limits=None) -> None:
        self.answers = list(answers)
        self.hourly = hourly or {}
        self.capacity_errors = list(capacity_errors)
        self.capacity_calls: list[int] = []
        self.limits = limits
        self.price_calls = 0

    @classmethod
    def from_options(cls, options, *, slots_per_host=None):
        raise NotImplementedError

    def find(self) -> DiscoveredHosts:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def hourly_prices(self, snapshot):
        self.price_calls += 1
        if isinstance(self.hourly, Exception):
            raise self.hourly
        return {h: p for h, p in self.hourly.items() if h in snapshot.ready or h in snapshot.draining}

    def set_capacity(self, hosts, *, source=None):
        self.capacity_calls.append(hosts)
        if self.capacity_errors:
            raise self.capacity_errors.pop(0)

    def capacity_limits(self):
        return self.limits


def spec(name, **kw) -> SourceSpec:
    return SourceSpec(name=name, provider="scripted", **kw)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ----------------------------------------------------------------------------- command line

def specs(*argv: str):
    return source_specs(parse_discovery_args(list(argv)))


def test_repeated_and_mixed_group_flags_are_sources_named_after_their_groups_with_their_clouds_options():
    got = specs("--aws-asg", "spot-a", "--aws-asg", "spot-b", "--aws-region", "us-east-1",
                "--gcp-mig", "od", "--gcp-project", "p", "--gcp-zone", "z",
                "--source", "od:fallback,price=3.5", "--source", "spot-b:priority=2,region=us-west-2")
    assert [(s.name, s.provider, dict(s.options)) for s in got] == [
        ("spot-a", "aws", {"group": "spot-a", "region": "us-east-1"}),
        ("spot-b", "aws", {"group": "spot-b", "region": "us-west-2"}),
        ("od", "gcp", {"group": "od", "project": "p", "zone": "z"}),
    ]
    assert [(s.priority, s.price, s.fallback) for s in got] == [(0, None, False), (2, None, False), (0, 3.5, True)]


def test_a_value_may_hold_colons_and_a_group_name_may_too():
    got = specs("--aws-asg", "a", "--aws-asg", "team:b", "--source", "a:notice_queue=https://sqs.example:443/1/q",
                "--source", "team:b:price=0.5")
    assert dict(got[0].options) == {"group": "a", "notice_queue": "https://sqs.example:443/1/q"}
    assert (got[1].name, got[1].price) == ("team:b", 0.5)


def test_one_group_alone_is_one_provider_as_before():
    built = build_discovery(parse_discovery_args(["--aws-asg", "g", "--aws-region", "r"]))
    assert not isinstance(built, MultiSourceDiscovery) and built.name == "aws"


@pytest.mark.parametrize("argv, message", [
    (["--aws-asg", "g", "--aws-asg", "g"], "two host sources are named 'g' (--aws-asg g and --aws-asg g)"),
    (["--aws-asg", "g", "--gcp-mig", "g", "--gcp-project", "p", "--gcp-zone", "z"], "two host sources are named 'g'"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "b:price=-1"], "price must be >= 0 dollars, got -1"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "b:price=nan"], "must be a finite number of dollars"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "b:price=lots"], "price must be a number of dollars"),
    # review h14: the value as given (":g" showed "got 10000"), and only ASCII decimals (float() takes the others)
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "b:price=10000.000001"],
     "price must be at most 10000 dollars, got 10000.000001"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "b:price=1_000"],
     "price must be a number of dollars in digits 0-9 with at most one point (such as 0.9), got '1_000'"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "b:on_demand_price=\u0661"],
     "on_demand_price must be a number of dollars in digits 0-9 with at most one point (such as 0.9), got '\u0661'"),
    # the same rule for the single-group provider's own option (float() took '1_000' there)
    (["--aws-asg", "a", "-o", "on_demand_price=1_000"],
     "option 'on_demand_price' must be a number of dollars in digits 0-9 with at most one point"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "c:fallback"], "no host source is named 'c' (sources: a, b)"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "a:fallback", "--source", "b:fallback"],
     "every host source is marked fallback"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "a:priority=high"], "priority must be an integer"),
    # review h28: int() took these as 10 and 3
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "a:priority=1_0"],
     "priority must be an integer of at most 18 digits 0-9, got '1_0'"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "a:priority=\u0663"],
     "priority must be an integer of at most 18 digits 0-9, got '\u0663'"),
    # review h31: past 4,300 digits int() raised a ValueError of its own, shown as a traceback
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "a:priority=" + "9" * 5000],
     "priority must be an integer of at most 18 digits 0-9, got '99999"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "a:group=c"], "'group' is the group itself"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "a:price=1", "--source", "a:fallback"], "given twice"),
    (["--aws-asg", "a", "--aws-asg", "b", "--source", "nocolon"], "expected NAME:KEY=VALUE"),
    (["-H", "h", "--aws-asg", "a", "--aws-asg", "b"], "take one source only"),
    # one source: the mistake is --source, which weighs only the groups of the cloud group flags (review s60 rvS)
    (["-H", "h", "--source", "h:priority=1"], "--source applies only to the cloud group flags (--aws-asg, "
     "--gcp-mig, --azure-vmss, --ibm-instance-group, --k8s-selector), to weigh their groups; it does not apply to -H"),
    (["--host-discovery-script", "d.sh", "--source", "d:price=1"], "it does not apply to --host-discovery-script"),
    (["-H", "h", "--aws-asg", "a", "--source", "a:price=1"], "take one source only"),
    (["--aws-asg", "a", "--aws-asg", "b", "--aws-notice-queue", "https://sqs.example/q"],
     "a notice queue can serve one host source only"),
])
def test_bad_source_flags_are_refused_with_one_line(argv, message):
    with pytest.raises(ConfigError, match=None) as info:
        build_discovery(parse_discovery_args(argv))
    assert message in str(info.value)


@pytest.mark.parametrize("given", ["0.00001", "0.000001", "0.00009", "3.912", "10000"])
def test_an_on_demand_price_in_source_reaches_the_provider_as_given(given):
    """Review h28: a price under $0.0001 passed --source's check, then reached the provider written as repr() gives
    it (1e-05), which the provider's option refused, quoting a value the user never typed."""
    discovery = build_discovery(parse_discovery_args(["--aws-asg", "a", "--aws-asg", "od", "--aws-region", "us-east-1",
                                                      "--source", f"od:fallback,on_demand_price={given}"]))
    [od] = [s.discovery for s in discovery.sources if s.spec.name == "od"]
    assert od.on_demand_price == float(given)


@pytest.mark.parametrize("given", ["-0", "-0.0", "+0"])
def test_a_price_of_minus_zero_is_zero(given):
    flag = parse_source_flag(f"a:price={given},on_demand_price={given}")
    assert str(flag.price) == "0.0" and str(flag.on_demand_price) == "0.0"  # not "-0.0", shown as $-0.00


def test_an_unknown_provider_option_in_source_names_the_source():
    with pytest.raises(ConfigError, match="host source 'b': provider 'aws' has no option 'colour'"):
        build_discovery(parse_discovery_args(["--aws-asg", "a", "--aws-asg", "b", "--source", "b:colour=red"]))


# ----------------------------------------------------------------------------- merging

def test_discovery_merges_the_sources_and_tags_each_host_with_its_source_and_price():
    a = Scripted(DiscoveredHosts(ready={"10.0.0.1": 2}, instances={"10.0.0.1": "i-1"}))
    b = Scripted(DiscoveredHosts(ready={"10.0.1.1": 4}, draining={"10.0.1.2": Drain(None, "spot")}),
                 hourly={"10.0.1.1": 8.0, "10.0.1.2": 6.0})
    merged = MultiSourceDiscovery([(spec("a", price=0.5), a), (spec("b"), b)]).find()
    assert dict(merged.ready) == {"10.0.0.1": 2, "10.0.1.1": 4}
    assert dict(merged.draining) == {"10.0.1.2": Drain(None, "spot")}
    assert dict(merged.sources) == {"10.0.0.1": "a", "10.0.1.1": "b", "10.0.1.2": "b"}
    # The user's price per slot-hour; the cloud's per instance-hour over the host's slots (a host first seen
    # draining: over the slots of its group's other hosts).
    assert dict(merged.prices) == {"10.0.0.1": 0.5, "10.0.1.1": 2.0, "10.0.1.2": 1.5}
    assert dict(merged.instances) == {"10.0.0.1": "i-1"}


@pytest.mark.parametrize("wrong", [float("nan"), -1.0, 1e300])
def test_a_price_from_the_cloud_that_is_no_price_leaves_its_host_unpriced_and_every_source_discovered(caplog, wrong):
    """A review rewrote DescribeSpotPriceHistory's answer: one NaN (or negative) spot price failed every merged
    discovery call (121 tracebacks in 40 s, no host of any source seen), and 1e300 was taken, costing 2e297 dollars.
    That host is now unpriced (an unknown price: its cost counted apart), with one warning, and not looked up again
    at every call; the other hosts keep their prices."""
    clock = Clock()
    a = Scripted(DiscoveredHosts(ready={"h1": 2, "h2": 2}), hourly={"h1": wrong, "h2": 8.0})
    b = Scripted(DiscoveredHosts(ready={"h3": 1}))
    multi = MultiSourceDiscovery([(spec("a"), a), (spec("b", price=0.5), b)], clock=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            merged = multi.find()
            clock.now += 10
    assert dict(merged.ready) == {"h1": 2, "h2": 2, "h3": 1}
    assert dict(merged.prices) == {"h2": 4.0, "h3": 0.5}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "host source 'a': its provider gave 1 host(s) a price that is no price (h1 " \
        in warnings[0], warnings
    assert a.price_calls == 1, a.price_calls  # h1 is known (as no price): not asked again at every find()


def test_a_failing_source_keeps_its_last_hosts_and_the_others_go_on(caplog):
    clock = Clock()
    a = Scripted(DiscoveredHosts(ready={"h1": 1}), RetryableDiscoveryError("throttled"))
    b = Scripted(DiscoveredHosts(ready={"h2": 1}), DiscoveredHosts(ready={"h2": 1, "h3": 1}))
    multi = MultiSourceDiscovery([(spec("a"), a), (spec("b"), b)], stale_limit_s=60, clock=clock)
    assert set(multi.find().ready) == {"h1", "h2"}
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            clock.now += 10
            assert set(multi.find().ready) == {"h1", "h2", "h3"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "host source 'a': throttled" in warnings[0], warnings
    clock.now += 60  # past the stale limit: its hosts are left out, and the driver's missing grace takes over
    assert set(multi.find().ready) == {"h2", "h3"}


class Hung(Scripted):
    """Answers its first call; holds the later ones (a body trickled a byte at a time) until ``go`` is set."""

    def __init__(self, *answers) -> None:
        super().__init__(*answers)
        self.calls, self.go, self.released = 0, threading.Event(), []

    def find(self) -> DiscoveredHosts:
        self.calls += 1
        if self.calls > 1:
            self.go.wait(10)
        return super().find()

    def release(self, host, instance):
        self.released.append((host, self.go.is_set()))


def test_a_source_that_hangs_is_a_failing_source_and_holds_the_others_up_no_longer_than_its_own_limit(caplog):
    """A hung source ended the whole merged call at --discovery-timeout: every poll was a failure of the job's
    discovery (which --elastic-timeout ends) and the healthy sources were never asked again."""
    from cloud_elastic.driver.runtime.discovery import DiscoveryPoller

    a = Hung(DiscoveredHosts(ready={"h1": 1}), DiscoveredHosts(ready={"h1": 1}), DiscoveredHosts(ready={"h4": 1}))
    b = Scripted(DiscoveredHosts(ready={"h2": 1}), DiscoveredHosts(ready={"h2": 1, "h3": 1}))
    multi = MultiSourceDiscovery([(spec("a"), a), (spec("b"), b)])
    poller = DiscoveryPoller(multi, lambda _result: None, interval_s=1.0, call_timeout_s=0.5)
    try:
        assert set(poller.poll_once().ready) == {"h1", "h2"}
        with caplog.at_level(logging.WARNING):
            assert set(poller.poll_once().ready) == {"h1", "h2", "h3"}  # a's hosts kept as last seen
            started = time.monotonic()
            assert set(poller.poll_once().ready) == {"h1", "h2", "h3"}  # at once: a's call is still waited for
            assert time.monotonic() - started < 0.4
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "host source 'a': no answer within 0.5s (--discovery-timeout 0.5s)" in \
            warnings[0], warnings
        multi.release("h1", None)  # not beside its find() under way
        assert a.calls == 2 and a.released == []
        a.go.set()
        deadline = time.monotonic() + 10  # its call ends on its own thread: wait for the answer to be there
        while multi.sources[0].caller._answers.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(poller.poll_once().ready) == {"h1", "h2", "h3"}  # its late answer
        assert set(poller.poll_once().ready) == {"h4", "h2", "h3"} and a.calls == 3
        assert a.released == [("h1", True)]
    finally:
        a.go.set()
        poller.close()
        multi.close()


def test_no_fallback_is_raised_while_a_spot_source_has_not_answered_yet(caplog):
    # A spot group throttled at the job's first call: next to the fallback it reads as "no spot capacity".
    clock = Clock()
    spot = Scripted(RetryableDiscoveryError("Throttling"), RetryableDiscoveryError("Throttling"),
                    DiscoveredHosts(ready={"s1": 1}))
    od = Scripted(DiscoveredHosts(ready={"od1": 1}))
    multi = MultiSourceDiscovery([(spec("spot"), spot), (spec("od", fallback=True), od)], stale_limit_s=60, clock=clock)
    assert set(multi.find().ready) == {"od1"}  # the job starts on what answered
    with caplog.at_level(logging.INFO):
        multi.set_capacity(2, source="od")
        clock.now += 5
        multi.find()
    assert od.capacity_calls == []  # held back, asked again at each discovery
    held = [r.getMessage() for r in caplog.records if "not raising" in r.getMessage()]
    assert held == ["--manage-capacity: not raising host source 'od' while host source 'spot' has not answered yet "
                    "(Throttling); for up to 60s"]
    multi.set_capacity(0, source="od")  # a raise never sent: no 0 either (an operator's group is left as it is)
    assert od.capacity_calls == [] and multi.capacity_of("od") is None
    multi.set_capacity(2, source="od")
    clock.now += 5
    assert set(multi.find().ready) == {"s1", "od1"}  # spot answered: the job sees that answer before the raise goes
    assert od.capacity_calls == []
    multi.find()  # still wanted (no 0 asked): the raise goes through
    assert od.capacity_calls == [2]
    # A source that never answers holds a raise back for the stale limit only.
    broken = Scripted(RetryableDiscoveryError("AccessDenied"))
    od2 = Scripted(DiscoveredHosts(ready={"od1": 1}))
    multi = MultiSourceDiscovery([(spec("spot"), broken), (spec("od", fallback=True), od2)], stale_limit_s=60,
                                 clock=clock)
    multi.find()
    multi.set_capacity(1, source="od")
    assert od2.capacity_calls == []
    clock.now += 61
    multi.find()
    assert od2.capacity_calls == [1]
    multi.set_capacity(0, source="od")  # a group the job raised: its 0 goes at once
    assert od2.capacity_calls == [1, 0]


def test_every_source_failing_is_a_retryable_failure_and_a_fatal_first_answer_fails_the_job():
    a = Scripted(RetryableDiscoveryError("throttled"))
    b = Scripted(RetryableDiscoveryError("timeout"))
    with pytest.raises(RetryableDiscoveryError, match="every host source failed: a: throttled; b: timeout"):
        MultiSourceDiscovery([(spec("a"), a), (spec("b"), b)]).find()
    ok = Scripted(DiscoveredHosts(ready={"h": 1}))
    typo = Scripted(FatalDiscoveryError("group 'spot-c' not found"))
    with pytest.raises(FatalDiscoveryError, match="host source 'c': group 'spot-c' not found"):
        MultiSourceDiscovery([(spec("a"), ok), (spec("c"), typo)]).find()


def test_a_fatal_error_after_a_first_good_answer_counts_as_a_failing_source():
    a = Scripted(DiscoveredHosts(ready={"h1": 1}), FatalDiscoveryError("credentials expired"))
    b = Scripted(DiscoveredHosts(ready={"h2": 1}))
    multi = MultiSourceDiscovery([(spec("a"), a), (spec("b"), b)])
    multi.find()
    assert set(multi.find().ready) == {"h1", "h2"}


def test_a_fatal_error_after_a_first_retryable_failure_counts_as_a_failing_source_not_the_jobs():
    # Throttled at the job's first call, then ExpiredToken an hour later: that source fails, the others go on.
    clock = Clock()
    a = Scripted(DiscoveredHosts(ready={"h1": 1}), DiscoveredHosts(ready={"h1": 1, "h3": 1}))
    b = Scripted(RetryableDiscoveryError("Throttling"), FatalDiscoveryError("(ExpiredToken) token expired"))
    multi = MultiSourceDiscovery([(spec("a"), a), (spec("b"), b)], clock=clock)
    assert set(multi.find().ready) == {"h1"}
    clock.now += 3600
    assert set(multi.find().ready) == {"h1", "h3"}
    assert "ExpiredToken" in multi.sources[1].error


def test_a_host_two_sources_report_counts_for_the_first(caplog):
    a = Scripted(DiscoveredHosts(ready={"h": 1}))
    b = Scripted(DiscoveredHosts(ready={"h": 2}))
    with caplog.at_level(logging.WARNING):
        merged = MultiSourceDiscovery([(spec("a"), a), (spec("b"), b)]).find()
    assert dict(merged.ready) == {"h": 1} and dict(merged.sources) == {"h": "a"}
    assert "host h is reported by sources 'a' and 'b'" in caplog.text


# ----------------------------------------------------------------------------- capacity

def test_access_denied_says_so_once_and_the_source_is_left_unmanaged(caplog):
    od = Scripted(DiscoveredHosts(), capacity_errors=[CapacityDeniedError("AccessDenied: not allowed")])
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)])
    with caplog.at_level(logging.WARNING):
        multi.set_capacity(2, source="od")
        multi.set_capacity(3, source="od")
        multi.find()
    assert od.capacity_calls == [2]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "may not change host source 'od'" in warnings[0]
    assert "goes on without managing the group" in warnings[0]
    assert not multi.can_give("od").managed


def test_a_capacity_call_that_fails_otherwise_is_retried_at_the_next_discovery():
    od = Scripted(DiscoveredHosts(), capacity_errors=[CapacityError("throttled")])
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)])
    multi.set_capacity(2, source="od")
    multi.find()
    multi.find()
    assert od.capacity_calls == [2, 2] and multi.can_give("od").managed


# ----------------------------------------------------------------------------- the provider contract

def test_the_merged_discovery_keeps_the_provider_contract():
    """What tests/contract asks of every provider, for a merged one: complete and idempotent snapshots,
    --slots-per-host passed to each source, an idempotent close, a one-line failure, no I/O when built."""
    from tests.contract.scripted import ScriptedDiscovery

    a = DiscoveredHosts(ready={"10.0.0.1": 2})
    b = DiscoveredHosts(ready={"10.0.1.1": 1}, draining={"10.0.1.9": Drain(None, "scripted")})

    def build(sph=None, broken=False):
        sources = [ScriptedDiscovery([RetryableDiscoveryError("outage a") if broken else a], slots_per_host=sph),
                   ScriptedDiscovery([RetryableDiscoveryError("outage b") if broken else b], slots_per_host=sph)]
        return MultiSourceDiscovery([(spec("a"), sources[0]), (spec("b"), sources[1])])

    multi = build()
    first, second = multi.find(), multi.find()
    assert first == second and dict(first.ready) == {"10.0.0.1": 2, "10.0.1.1": 1}
    assert dict(first.draining) == {"10.0.1.9": Drain(None, "scripted")}
    multi.close()
    multi.close()
    assert dict(build(3).find().ready) == {"10.0.0.1": 3, "10.0.1.1": 3}
    with pytest.raises(RetryableDiscoveryError) as err:
        build(broken=True).find()
    assert "\n" not in str(err.value)


def test_discover_prints_each_hosts_source_and_price():
    import io
    import json as json_

    from cloud_elastic.driver.runtime.discovery import discover

    def multi():
        return MultiSourceDiscovery([(spec("spot", price=0.9), Scripted(DiscoveredHosts(ready={"10.0.0.1": 1}))),
                                     (spec("od", fallback=True), Scripted(DiscoveredHosts(ready={"10.0.1.1": 4})))])

    table, as_json = io.StringIO(), io.StringIO()
    assert discover(multi(), as_json=False, out=table) == 0
    rows = [line.split() for line in table.getvalue().splitlines()]
    assert rows[0][:5] == ["HOST", "STATE", "SLOTS", "SOURCE", "$/SLOT-H"]
    assert rows[1][:5] == ["10.0.0.1", "ready", "1", "spot", "0.9"]
    assert rows[2][:5] == ["10.0.1.1", "ready", "4", "od", "-"]
    assert discover(multi(), as_json=True, out=as_json) == 0
    shape = json_.loads(as_json.getvalue())
    assert shape["sources"] == {"10.0.0.1": "spot", "10.0.1.1": "od"} and shape["prices"] == {"10.0.0.1": 0.9}


def test_a_draining_host_is_priced_per_slot_it_had_not_at_its_whole_instance_price_per_slot():
    four_gpus = Scripted(DiscoveredHosts(ready={"h1": 4}, instances={"h1": "i-1"}),
                         DiscoveredHosts(draining={"h1": Drain(None, "Terminating:Wait")}, instances={"h1": "i-1"}),
                         hourly={"h1": 4.0})
    alone = Scripted(DiscoveredHosts(draining={"h2": Drain(None, "spot")}), hourly={"h2": 4.0})
    multi = MultiSourceDiscovery([(spec("spot"), four_gpus), (spec("other"), alone)])
    assert multi.find().prices == {"h1": 1.0}  # h2: never seen ready, nor any host of its group: unknown, not 4.0
    assert multi.find().prices == {"h1": 1.0}  # h1 drains: still $4 an instance-hour for its 4 slots


def test_a_failed_price_look_up_is_retried_with_backoff_and_warned_of_once_with_how_to_give_the_price(caplog):
    clock = Clock()
    denied = FatalDiscoveryError("An error occurred (UnauthorizedOperation) when calling DescribeSpotPriceHistory")
    g = Scripted(DiscoveredHosts(ready={"h": 1}), hourly=denied)
    multi = MultiSourceDiscovery([(spec("g"), g), (spec("od", fallback=True, price=1.0), Scripted(DiscoveredHosts()))],
                                 clock=clock, price_refresh_s=300)
    with caplog.at_level(logging.WARNING):
        for _ in range(600):  # ten minutes of discovery at its default interval of 1 s
            multi.find()
            clock.now += 1.0
    assert 3 <= g.price_calls <= 6  # after 30 s, then twice as long each time up to 300 s; not 600 times
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "UnauthorizedOperation" in warnings[0] and "--source g:price=D" in warnings[0]
    g.hourly = {"h": 2.0}  # the permission was granted: read at the next retry
    clock.now += 300
    assert multi.find().prices == {"h": 2.0}


def test_the_capacity_asked_is_held_within_the_groups_min_and_max_size_with_one_warning(caplog):
    od = Scripted(DiscoveredHosts(), limits=(1, 2))
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)])
    multi.find()
    with caplog.at_level(logging.WARNING):
        multi.set_capacity(4, source="od")
        multi.find()
        multi.set_capacity(5, source="od")  # MaxSize holds it at 2 again, and has not changed: no call
        multi.set_capacity(0, source="od")  # lowered: to MinSize, not below it (the cloud refuses less)
    assert od.capacity_calls == [2, 1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "wants 4 host(s) of host source 'od'" in warnings[0] and "maximum size is 2" in \
        warnings[0]


def test_a_raise_held_at_the_groups_max_size_is_recorded_as_such_and_made_whole_once_the_maximum_is_raised():
    """The warning says "raise the group's maximum to give the job more": the job's next request must get it."""
    od = Scripted(DiscoveredHosts(), limits=(0, 1))
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)])
    multi.find()
    multi.set_capacity(2, source="od")
    assert (od.capacity_calls, multi.capacity_of("od")) == ([1], 1)
    od.limits = (0, 4)  # the user raises MaxSize; the job asks again (the group shows fewer hosts than it needs)
    multi.set_capacity(2, source="od")
    assert (od.capacity_calls, multi.capacity_of("od")) == ([1, 2], 2)
    od.limits = (1, 4)
    multi.set_capacity(0, source="od")  # held at MinSize: what the job asked is done (the job ends with it)
    assert (od.capacity_calls, multi.capacity_of("od")) == ([1, 2, 1], 0)


def test_a_raise_asked_again_never_lowers_the_group_and_goes_only_while_its_desired_capacity_is_below_it():
    """The job asks again every 30 s while the group shows fewer hosts than it needs, and booting instances are
    not shown: a group an operator (or its own scaling) raised beyond it must not be set back down, and one that
    boots must not be asked at every turn; one its own scaling lowered is raised again."""
    clock = Clock()
    od = Scripted(DiscoveredHosts(), limits=(0, 10, 0))  # MinSize, MaxSize, DesiredCapacity as last read
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)], clock=clock)
    multi.find()
    multi.set_capacity(1, source="od")
    for desired in (4, 1):  # the operator raised it to 4, then the instance of the job's raise boots
        od.limits = (0, 10, desired)
        clock.now += 30
        multi.find()
        multi.set_capacity(1, source="od")
    assert od.capacity_calls == [1]
    od.limits = (0, 10, 0)  # a scheduled action set it back to 0
    multi.find()
    multi.set_capacity(1, source="od")
    assert (od.capacity_calls, multi.capacity_of("od")) == ([1, 1], 1)


def test_a_raise_asked_again_of_a_group_whose_desired_capacity_is_unknown_goes_every_few_minutes_while_no_host_came():
    from cloud_elastic.providers.multi import REASK_UNKNOWN_S

    clock = Clock()
    od = Scripted(DiscoveredHosts())
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)], clock=clock)
    multi.find()
    multi.set_capacity(2, source="od")
    clock.now += 30
    multi.set_capacity(2, source="od")
    assert od.capacity_calls == [2]
    clock.now += REASK_UNKNOWN_S
    multi.set_capacity(2, source="od")
    assert od.capacity_calls == [2, 2]
    od.answers = [DiscoveredHosts(ready={"o1": 1})]  # one of its hosts shows: the group is on its way
    multi.find()
    clock.now += REASK_UNKNOWN_S
    multi.set_capacity(2, source="od")
    assert od.capacity_calls == [2, 2]
    for ready in ({"o1": 1, "o2": 1}, {"o1": 1}):  # it fills, then its own scaling takes a host away
        od.answers = [DiscoveredHosts(ready=ready)]
        multi.find()
    clock.now += REASK_UNKNOWN_S
    multi.set_capacity(2, source="od")
    assert od.capacity_calls == [2, 2, 2]  # 465b923 never asked again: it showed more hosts than at the ask


def test_a_raise_skipped_for_a_group_an_operator_set_higher_is_not_set_back_to_0():
    od = Scripted(DiscoveredHosts(), limits=(0, 20, 10))  # the operator's group, at DesiredCapacity 10
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)], clock=Clock())
    multi.find()
    multi.set_capacity(4, source="od")
    multi.set_capacity(0, source="od")  # the job no longer wants it, or is over
    assert (od.capacity_calls, multi.capacity_of("od")) == ([], None)


def test_a_release_beside_a_raise_under_way_neither_runs_beside_it_nor_hides_its_value():
    """A release on the driver's thread while the discovery thread's raise runs: the provider takes one call at a
    time, and capacity_of() says the raise under way until it ends (lower() warns then; 465b923 said None)."""
    entered, go = threading.Event(), threading.Event()

    class Slow(Scripted):
        def set_capacity(self, hosts, *, source=None):
            entered.set()
            go.wait(5)
            super().set_capacity(hosts)

        def release(self, host, instance=None):
            self.released = [*getattr(self, "released", []), host]

    od = Slow(DiscoveredHosts(ready={"o1": 1}))
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)], clock=Clock())
    multi.find()
    raising = threading.Thread(target=multi.set_capacity, args=(3,), kwargs={"source": "od"})
    raising.start()
    assert entered.wait(5)
    multi.release("o1", None)
    assert (getattr(od, "released", []), multi.capacity_of("od"), multi.wait_for("od", 0.05)) == ([], 3, False)
    go.set()
    raising.join(5)
    multi.find()  # the release held back goes once no other call to the group runs
    assert (od.released, od.capacity_calls, multi.capacity_of("od")) == (["o1"], [3], 3)


def test_a_spot_source_down_from_the_start_holds_the_fallback_well_within_the_start_timeout(caplog):
    from cloud_elastic.providers.multi import UNHEARD_HOLD_S

    clock = Clock()
    od = Scripted(DiscoveredHosts())
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(RetryableDiscoveryError("no answer"))),
                                  (spec("od", fallback=True), od)], clock=clock)  # stale limit: 600 s
    multi.find()
    with caplog.at_level(logging.INFO):
        multi.set_capacity(1, source="od")
    assert od.capacity_calls == [] and f"for up to {UNHEARD_HOLD_S:g}s" in caplog.text
    assert UNHEARD_HOLD_S <= 120  # the default --start-timeout and --elastic-timeout are 600 s
    clock.now += UNHEARD_HOLD_S + 1
    multi.find()
    assert od.capacity_calls == [1]


def test_a_fallback_group_may_be_set_while_another_sources_call_hangs():
    """At the job's end the driver waits for the fallback source's own call, not the merged one (which a hung
    source holds up to its limit), and the group is set at once."""
    spot = Hung(DiscoveredHosts(ready={"h1": 1}))
    od = Scripted(DiscoveredHosts(ready={"od1": 1}))
    multi = MultiSourceDiscovery([(spec("spot"), spot), (spec("od", fallback=True), od)], call_timeout_s=5)
    multi.find()
    multi.set_capacity(2, source="od")  # the job's raise: set back to 0 at its end
    merged = threading.Thread(target=multi.find, daemon=True)  # the poller's call: waits on spot
    merged.start()
    try:
        deadline = time.monotonic() + 5
        while spot.calls < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert multi.wait_for("od", 5) and not multi.wait_for("spot", 0.05)
        multi.set_capacity(0, source="od")
        assert od.capacity_calls == [2, 0] and merged.is_alive()
    finally:
        spot.go.set()
        merged.join(5)
        multi.close()


def test_the_job_lowers_its_own_raise_when_fewer_fallback_slots_are_wanted_on_a_group_whose_capacity_is_read():
    """Review of 4ca09e6: on AWS, where the group's DesiredCapacity is read, the smaller number was dropped as
    "not above the group's desired capacity", which was the job's own larger raise: the group stayed large, paid."""
    class Group(Scripted):  # its DesiredCapacity follows what was set, as AWS reads it back
        def set_capacity(self, hosts, *, source=None):
            super().set_capacity(hosts)
            self.limits = (0, 20, hosts)

    od, clock = Group(DiscoveredHosts(), limits=(0, 20, 0)), Clock()
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)], clock=clock)
    multi.find()
    multi.set_capacity(3, source="od")
    clock.now += 31
    multi.find()  # its instances still boot: it shows none
    multi.set_capacity(1, source="od")  # spot came back: one fallback slot is wanted now
    multi.find()
    assert od.capacity_calls == [3, 1] and multi.capacity_of("od") == 1


def test_a_release_put_off_beside_the_jobs_last_calls_is_made_at_close():
    """Review of 4ca09e6: a release made while the driver's thread set the fallback to 0 at the job's end was put
    off "until the next find()", which never came: the instance the job gave back was kept, and paid for."""
    import threading

    class Slow(Scripted):
        def __init__(self, *snapshots, **kwargs):
            super().__init__(*snapshots, **kwargs)
            self.lowering, self.go, self.released = threading.Event(), threading.Event(), []

        def set_capacity(self, hosts, *, source=None):
            self.lowering.set()
            self.go.wait(10)
            super().set_capacity(hosts)

        def release(self, host, instance):
            self.released.append(host)

    od = Slow(DiscoveredHosts(ready={"o1": 1}), limits=(0, 20, 1))
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                  (spec("od", fallback=True), od)], clock=Clock())
    multi.find()
    multi.adopt("od", 1)  # the job's own raise (a crashed predecessor's): set back to 0 at the end
    lowering = threading.Thread(target=multi.set_capacity, args=(0,), kwargs={"source": "od"})
    lowering.start()
    assert od.lowering.wait(10)
    multi.release("o1", None)  # beside the lowering: put off
    assert od.released == []
    od.go.set()
    lowering.join(10)
    multi.close()
    assert od.released == ["o1"]


def test_a_price_read_that_hangs_holds_no_source_up_beyond_its_call_limit_and_its_prices_come_later(caplog):
    """Review h14 s9: hourly_prices ran on the discovery thread with no limit: a price read delayed 30 s held every
    source's find() (64 s each with --discovery-timeout 10). It runs on its source's side thread: find() waits for
    it up to that source's limit (0.5 s here), once; later ones keep the source's last snapshot and prices, and go on
    at once with the others'; past the limit the source counts as failing, as one whose find() hangs."""
    go = threading.Event()

    class SlowPrices(Scripted):
        finds = 0

        def find(self):
            self.finds += 1
            return super().find()

        def hourly_prices(self, snapshot):
            go.wait(10)
            return super().hourly_prices(snapshot)

    spot = SlowPrices(DiscoveredHosts(ready={"s1": 2}), hourly={"s1": 3.0})
    od = Scripted(DiscoveredHosts(ready={"o1": 1}), DiscoveredHosts(ready={"o1": 1, "o2": 1}))
    multi = MultiSourceDiscovery([(spec("spot"), spot), (spec("od", fallback=True, price=1.0), od)],
                                 call_timeout_s=0.5)
    try:
        started = time.monotonic()
        first = multi.find()
        assert time.monotonic() - started < 2.0 and dict(first.prices) == {"o1": 1.0}  # the limit, not 10 s
        with caplog.at_level(logging.WARNING):
            started = time.monotonic()
            second = multi.find()
            assert time.monotonic() - started < 0.5, "the other source waited for the price read"
            assert set(second.ready) == {"s1", "o1", "o2"} and "s1" not in second.prices
            time.sleep(0.5)
            multi.find()  # the read has run past the limit: the source fails (its hosts kept)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "host source 'spot': its price read (hourly_prices) gave no answer within " \
            "0.5s" in warnings[0], warnings
        assert spot.finds == 1  # no find() of it beside its price read
        go.set()
        assert multi.wait_for("spot", 5)
        assert multi.find().prices == {"s1": 1.5, "o1": 1.0, "o2": 1.0}
        assert spot.price_calls == 1 and spot.finds == 2
    finally:
        go.set()
        multi.close()


def test_a_capacity_call_that_hangs_is_waited_for_up_to_its_sources_limit_and_taken_later():
    """Review h14 s10: set_capacity ran on the discovery thread with no limit. A raise whose call hangs holds the
    caller up to the source's call limit; discovery goes on meanwhile, the raise counted as under way, and its answer
    is taken at a later call."""
    go = threading.Event()

    class SlowGroup(Scripted):
        def set_capacity(self, hosts, *, source=None):
            go.wait(10)
            super().set_capacity(hosts)

    od = SlowGroup(DiscoveredHosts())
    spot = Scripted(DiscoveredHosts(ready={"h1": 1}), DiscoveredHosts(ready={"h1": 1, "h2": 1}))
    multi = MultiSourceDiscovery([(spec("spot"), spot), (spec("od", fallback=True), od)], call_timeout_s=0.5)
    try:
        multi.find()
        started = time.monotonic()
        multi.set_capacity(2, source="od")
        assert 0.4 < time.monotonic() - started < 2.0 and multi.capacity_of("od") == 2  # under way
        started = time.monotonic()
        assert set(multi.find().ready) == {"h1", "h2"} and time.monotonic() - started < 0.5
        go.set()
        assert multi.wait_for("od", 5)
        multi.find()
        assert od.capacity_calls == [2] and multi.capacity_of("od") == 2 and multi.can_give("od").owned
    finally:
        go.set()
        multi.close()


def test_a_host_the_provider_gives_no_price_is_not_looked_up_again_at_every_find():
    """Review h14 3: only the hosts priced were remembered, so a host with no price (no Spot history for its type and
    zone) had hourly_prices called at every find(), where prices are read at most every price_refresh_s."""
    clock = Clock()
    spot = Scripted(DiscoveredHosts(ready={"h1": 1, "h2": 1}), hourly={"h1": 2.0})
    multi = MultiSourceDiscovery([(spec("spot"), spot), (spec("od", fallback=True, price=1.0),
                                                         Scripted(DiscoveredHosts()))], clock=clock,
                                 price_refresh_s=300)
    for _ in range(5):
        assert multi.find().prices == {"h1": 2.0}
        clock.now += 1
    assert spot.price_calls == 1
    clock.now += 300
    multi.find()
    assert spot.price_calls == 2


def test_a_capacity_change_to_0_slower_than_the_call_limit_is_waited_for_at_close():
    """Review h15: with capacity changes on the source's own thread, a set_capacity(0) at the job's end slower than
    the source's call limit was cut when the process exited (a daemon thread): the group stayed raised, and paid."""
    slow = threading.Event()

    class Slow(Scripted):
        def set_capacity(self, hosts, *, source=None):
            if slow.is_set():
                time.sleep(1.5)
            super().set_capacity(hosts)

    od = Slow(DiscoveredHosts())
    multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h1": 1}))),
                                  (spec("od", fallback=True), od)], call_timeout_s=0.3)
    multi.find()
    multi.set_capacity(2, source="od")
    slow.set()
    multi.set_capacity(0, source="od")  # waited for 0.3 s only: still under way
    multi.close()
    assert od.capacity_calls == [2, 0]
