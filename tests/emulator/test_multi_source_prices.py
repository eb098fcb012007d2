"""Spot prices of several AWS groups over moto (review h14): a slow price read holds no other group up, and a
type and zone with no usable price in the history is read once per refresh, with one warning.

Through :class:`~cloud_elastic.providers.multi.MultiSourceDiscovery` as the command line builds it, botocore
calling moto through the test proxy, which delays or rewrites ``DescribeSpotPriceHistory``.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tests.emulator.moto_env import clients, group_backend, make_group
from tests.emulator.test_multi_source import aws_sources

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]

#: Well under the provider's read timeout (10 s: a longer delay is retried by botocore), well over the call limit.
DELAY_S = 6.0


def spot_group(proxy, name: str, cidr: str, instance_type: str = "g4dn.12xlarge") -> list[dict]:
    made = make_group(proxy.url, name, size=1, instance_type=instance_type, cidr=cidr)
    for state in group_backend(name).instance_states:
        state.instance.lifecycle = "spot"  # what a spot request's instance carries (moto's ASG launches on-demand)
    return made


def history(zone: str, price: str, instance_type: str = "g4dn.12xlarge") -> bytes:
    return (
        '<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>t</requestId>'
        '<spotPriceHistorySet>'
        f'<item><instanceType>{instance_type}</instanceType><productDescription>Linux/UNIX</productDescription>'
        f'<spotPrice>{price}</spotPrice><timestamp>2026-11-28T19:00:00.000Z</timestamp>'
        f'<availabilityZone>{zone}</availabilityZone></item>'
        '</spotPriceHistorySet><nextToken></nextToken></DescribeSpotPriceHistoryResponse>').encode()


def zone_of(proxy, instance_id: str) -> str:
    _, ec2 = clients(proxy.url)
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["Placement"][
        "AvailabilityZone"]


def test_a_slow_spot_price_read_holds_the_other_groups_hosts_up_no_longer_than_the_call_limit(aws, caplog):
    """s9/s10: a price read delayed 30 s with --discovery-timeout 10 made every find() take 64 s, and a host the
    other group gained was seen only after 112 s. The read now runs on its source's own thread: find() waits for it
    up to the source's call limit once, then not at all; its prices come with a later find()."""
    autoscaling, _ = clients(aws.url)
    spot = spot_group(aws, "sl-spot", "10.66.1.0/24")
    od = make_group(aws.url, "sl-od", size=1, instance_type="g4dn.xlarge", cidr="10.66.2.0/24")
    autoscaling.update_auto_scaling_group(AutoScalingGroupName="sl-spot", MaxSize=2)
    autoscaling.update_auto_scaling_group(AutoScalingGroupName="sl-od", MaxSize=3)
    zone = zone_of(aws, spot[0]["id"])
    aws.rewrite("DescribeSpotPriceHistory", lambda _body: history(zone, "1.9560"))
    multi = aws_sources(aws, "sl-spot", "sl-od", source=("sl-od:fallback,price=0.526",))
    try:
        assert multi.find().prices[spot[0]["ip"]] == pytest.approx(1.956 / 4)  # the SDK's clients made, warm
        read = threading.Event()

        def slow(_body: bytes) -> bytes:
            time.sleep(DELAY_S)
            read.set()
            return history(zone, "0.2000", "g4dn.2xlarge")

        aws.rewrite("DescribeSpotPriceHistory", slow)
        autoscaling.set_desired_capacity(AutoScalingGroupName="sl-spot", DesiredCapacity=2)
        for state in group_backend("sl-spot").instance_states:  # a spot host of a type not priced yet
            state.instance.lifecycle = "spot"
            if state.instance.id != spot[0]["id"]:
                state.instance.instance_type = "g4dn.2xlarge"
        autoscaling.set_desired_capacity(AutoScalingGroupName="sl-od", DesiredCapacity=2)
        limit_s = 1.5
        multi.find_limit_s(limit_s)  # --discovery-timeout 1.5 (the poller sets it so)
        with caplog.at_level(logging.WARNING, logger="cloud_elastic"):
            started = time.monotonic()
            first = multi.find()  # the new spot host's price is read: waited for up to the limit, not longer
            took_first = time.monotonic() - started
            autoscaling.set_desired_capacity(AutoScalingGroupName="sl-od", DesiredCapacity=3)
            started = time.monotonic()
            second = multi.find()  # not at all: the other group's new host at once
            took_second = time.monotonic() - started
        assert took_first < limit_s + 1.0, f"find() waited {took_first:.1f}s for the price read"
        assert len(first.ready) == 4 and first.prices[spot[0]["ip"]] == pytest.approx(1.956 / 4)
        assert took_second < limit_s, f"the other group's hosts waited {took_second:.1f}s for the price read"
        assert len([h for h, s in second.sources.items() if s == "sl-od"]) == 3
        assert not read.is_set()
        new = next(h for h, s in second.sources.items() if s == "sl-spot" and h != spot[0]["ip"])
        assert new in second.ready and new not in second.prices  # kept as last seen; its price not known yet
        assert read.wait(DELAY_S + 5)
        deadline = time.monotonic() + 10
        while new not in multi.find().prices and time.monotonic() < deadline:
            time.sleep(0.2)
        assert multi.find().prices[new] == pytest.approx(0.2 / first.ready[new])  # per slot
    finally:
        multi.close()
    assert aws.count("DescribeSpotPriceHistory") == 2


@pytest.mark.parametrize("price", [None, "abc"])
def test_a_spot_type_and_zone_without_a_usable_price_is_read_once_per_refresh_with_one_warning(aws, caplog, price):
    """No history entry for the pair (or a price that is no number): DescribeSpotPriceHistory was called at every
    find() (every second), where prices are read at most every 5 minutes per type and zone; the host stayed
    unpriced with no warning."""
    spot = spot_group(aws, f"np-spot-{price}", "10.67.1.0/24" if price is None else "10.67.3.0/24")
    zone = zone_of(aws, spot[0]["id"])
    empty = ('<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>t'
             '</requestId><spotPriceHistorySet></spotPriceHistorySet><nextToken></nextToken>'
             '</DescribeSpotPriceHistoryResponse>').encode()
    aws.rewrite("DescribeSpotPriceHistory", lambda _body: empty if price is None else history(zone, price))
    make_group(aws.url, f"np-od-{price}", size=0, instance_type="g4dn.xlarge",
               cidr="10.67.2.0/24" if price is None else "10.67.4.0/24")
    multi = aws_sources(aws, f"np-spot-{price}", f"np-od-{price}", source=(f"np-od-{price}:fallback,price=1",))
    try:
        with caplog.at_level(logging.WARNING, logger="cloud_elastic"):
            for _ in range(4):
                assert spot[0]["ip"] in multi.find().ready and not multi.find().prices
    finally:
        multi.close()
    assert aws.count("DescribeSpotPriceHistory") == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    said = "no price" if price is None else "a price that is no number ('abc')"
    assert f"DescribeSpotPriceHistory gave {said} for g4dn.12xlarge in {zone}" in warnings[0]
    assert "--source NAME:price=D" in warnings[0]
