"""The AWS provider against moto over HTTP (through a counting proxy)."""

from __future__ import annotations

import pytest

from cloud_elastic.errors import FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers.api import Drain
from cloud_elastic.providers.selection import build_discovery, parse_discovery_args
from tests.emulator.fixtures import aws_options, provider
from tests.emulator.moto_env import (
    EC2_UNAVAILABLE,
    THROTTLED,
    clients,
    make_group,
    set_member,
    stop_instance,
)

pytestmark = pytest.mark.emulator

DENIED = (b'<ErrorResponse><Error><Type>Sender</Type><Code>UnrecognizedClientException</Code>'
          b'<Message>The security token included in the request is invalid.</Message></Error></ErrorResponse>')


def test_lifecycle_health_and_ec2_states_map_to_ready_draining_absent(aws):
    members = make_group(aws.url, "states", size=8, instance_type="g4dn.12xlarge")
    ip = [m["ip"] for m in members]
    autoscaling, _ = clients(aws.url)
    # The API call first: moto re-balances the group on it, and would replace members set aside below.
    autoscaling.enter_standby(AutoScalingGroupName="states", InstanceIds=[members[6]["id"]],
                              ShouldDecrementDesiredCapacity=True)
    set_member("states", members[1]["id"], lifecycle="Terminating:Wait")
    set_member("states", members[2]["id"], health="Unhealthy")
    set_member("states", members[3]["id"], lifecycle="Pending:Wait")
    set_member("states", members[4]["id"], lifecycle="Detaching")
    stop_instance(members[5]["id"])

    snapshot = provider("aws", aws_options(aws, "states")).find()

    assert dict(snapshot.ready) == {ip[0]: 4, ip[7]: 4}  # g4dn.12xlarge has 4 T4s
    assert dict(snapshot.draining) == {
        ip[1]: Drain(None, "Terminating:Wait"),
        ip[2]: Drain(None, "Unhealthy"),
        ip[4]: Drain(None, "Detaching"),
        ip[5]: Drain(None, "EC2 stopped"),
        ip[6]: Drain(None, "Standby"),
    }


def test_a_root_volume_replacement_drains_its_host_instead_of_dropping_it(aws):
    # Replacing the root volume reboots the instance: its workers die, so they must leave at the next
    # commit like any other leaving host, not vanish from the snapshot as if they had never been there.
    members = make_group(aws.url, "root-volume", size=4, cidr="10.20.2.0/24")
    ip = [m["ip"] for m in members]
    for member, state in zip(members, ("ReplacingRootVolume:Wait", "ReplacingRootVolume", "RootVolumeReplaced")):
        set_member("root-volume", member["id"], lifecycle=state)
    snapshot = provider("aws", aws_options(aws, "root-volume")).find()
    assert dict(snapshot.ready) == {ip[3]: 4}
    assert dict(snapshot.draining) == {
        ip[0]: Drain(None, "ReplacingRootVolume:Wait"),
        ip[1]: Drain(None, "ReplacingRootVolume"),
        ip[2]: Drain(None, "RootVolumeReplaced"),
    }


def test_hosts_are_ordered_by_launch_time_whatever_its_notation(aws):
    # 14:30+02:00 is 12:30 UTC: the second instance is the oldest although its time reads larger.
    members = make_group(aws.url, "launch-order", size=3, cidr="10.20.3.0/24")
    times = {members[0]["id"]: "2026-11-23T13:00:00.000Z", members[1]["id"]: "2026-11-23T14:30:00+02:00",
             members[2]["id"]: "2026-11-23T13:00:00.500Z"}

    def rewrite(body: bytes) -> bytes:
        text = body.decode()
        for instance, when in times.items():
            start = text.index(f"<instanceId>{instance}</instanceId>")
            at = text.index("<launchTime>", start) + len("<launchTime>")
            text = text[:at] + when + text[text.index("</launchTime>", at):]
        return text.encode()

    aws.rewrite("DescribeInstances", rewrite)
    snapshot = provider("aws", aws_options(aws, "launch-order")).find()
    assert list(snapshot.ready) == [members[1]["ip"], members[0]["ip"], members[2]["ip"]]


def test_a_fractional_gpu_is_one_slot_per_partition_the_instance_sees(aws):
    """A slot is a GPU device the instance sees (LogicalGpuCount): not a physical GPU (Count, 0 on
    fractional types, which would leave the host 1 slot as if CPU-only) and not a share of one GPU
    (1 / GpuPartitionSize workers)."""
    # g6f.large as AWS describes it, an eighth of an L4: Count 0, LogicalGpuCount 1, GpuPartitionSize 0.125.
    # One worker on its one partition, not eight sharing it. (Counting Count would also give 1 here.)
    members = make_group(aws.url, "fractional", size=1, instance_type="g6f.large", cidr="10.20.4.0/24")
    assert provider("aws", aws_options(aws, "fractional")).find().ready == {members[0]["ip"]: 1}

    # A type exposing three quarter-GPU partitions: 3 slots, where Count gives 1 and 1 / GpuPartitionSize 4.
    members = make_group(aws.url, "three-partitions", size=1, instance_type="g6f.2xlarge", cidr="10.20.5.0/24")
    aws.rewrite("DescribeInstanceTypes", lambda body: body.replace(
        b"<logicalGpuCount>1</logicalGpuCount>", b"<logicalGpuCount>3</logicalGpuCount>"))
    snapshot = provider("aws", aws_options(aws, "three-partitions")).find()
    assert snapshot.ready == {members[0]["ip"]: 3}


def test_cpu_only_type_gets_one_slot_and_slots_per_host_wins_without_type_lookups(aws):
    cpu = make_group(aws.url, "cpu-only", size=2, instance_type="m5.large", cidr="10.21.1.0/24")
    assert provider("aws", aws_options(aws, "cpu-only")).find().ready == {m["ip"]: 1 for m in cpu}

    gpu = make_group(aws.url, "pinned", size=2, instance_type="p4d.24xlarge", cidr="10.22.1.0/24")
    aws.reset()
    assert provider("aws", aws_options(aws, "pinned"), slots_per_host=2).find().ready == {m["ip"]: 2 for m in gpu}
    assert aws.count("DescribeInstanceTypes") == 0


def test_instance_types_are_looked_up_once(aws):
    make_group(aws.url, "cached", size=2, instance_type="p4d.24xlarge", cidr="10.23.1.0/24")
    discovery = provider("aws", aws_options(aws, "cached"))
    first, second = discovery.find(), discovery.find()
    assert first == second and set(first.ready.values()) == {8}  # p4d.24xlarge: 8 A100s
    assert aws.count("DescribeInstanceTypes") == 1


def test_a_type_the_api_does_not_know_gets_one_slot_without_failing_discovery(aws):
    # moto's catalogue lacks p3.8xlarge, like a partition that has not published a new type yet.
    members = make_group(aws.url, "odd-type", size=1, instance_type="p3.8xlarge", cidr="10.23.2.0/24")
    assert provider("aws", aws_options(aws, "odd-type")).find().ready == {members[0]["ip"]: 1}


def test_describe_instances_is_followed_past_one_page(aws):
    # Seven scaling steps put the instances in seven EC2 reservations; pages hold five.
    members = make_group(aws.url, "paged", size=7, steps=7, cidr="10.24.1.0/24")
    aws.reset()
    snapshot = provider("aws", aws_options(aws, "paged", page_size="5")).find()
    assert set(snapshot.ready) == {m["ip"] for m in members}
    assert aws.count("DescribeInstances") == 2


def test_a_large_group_costs_a_handful_of_calls_per_cycle(aws):
    make_group(aws.url, "large", size=201, cidr="10.25.0.0/16")
    # A generous read timeout: on a loaded machine the emulator's answer for 200 instances can take
    # longer than the default 10 s, and the retry would count as a call (seen in two fresh-clone runs).
    discovery = provider("aws", aws_options(aws, "large", timeout_s="120"))
    discovery.find()
    aws.reset()
    assert len(discovery.find().ready) == 201
    # One group read, the instance ids in chunks of 200, types cached.
    assert [what for _, what in aws.log] == ["DescribeAutoScalingGroups", "DescribeInstances", "DescribeInstances"], \
        aws.log


def test_throttling_is_retried_with_backoff_then_succeeds(aws):
    members = make_group(aws.url, "throttled", size=1, cidr="10.26.1.0/24")
    aws.reset()
    aws.fail("DescribeAutoScalingGroups", 2, 400, THROTTLED)
    assert set(provider("aws", aws_options(aws, "throttled")).find().ready) == {members[0]["ip"]}
    assert aws.count("DescribeAutoScalingGroups") == 3


def test_persistent_5xx_is_retryable_after_max_attempts_and_no_more(aws):
    make_group(aws.url, "unavailable", size=1, cidr="10.27.1.0/24")
    aws.reset()
    aws.fail("DescribeInstances", 10, 503, EC2_UNAVAILABLE)
    with pytest.raises(RetryableDiscoveryError, match="Unavailable") as err:
        provider("aws", aws_options(aws, "unavailable", max_attempts="2")).find()
    assert aws.count("DescribeInstances") == 2
    assert "\n" not in str(err.value)


def test_missing_group_is_fatal_and_names_group_and_region(aws):
    with pytest.raises(FatalDiscoveryError) as err:
        provider("aws", aws_options(aws, "no-such-group")).find()
    assert str(err.value) == "AWS Auto Scaling group 'no-such-group' not found in region us-east-1"


def test_missing_credentials_are_fatal_before_any_request(aws, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(FatalDiscoveryError, match="no AWS credentials"):
        provider("aws", aws_options(aws, "whatever")).find()
    assert aws.log == []


def test_refused_credentials_are_fatal_and_not_retried(aws):
    aws.fail("DescribeAutoScalingGroups", 5, 400, DENIED)
    with pytest.raises(FatalDiscoveryError, match="UnrecognizedClientException"):
        provider("aws", aws_options(aws, "whatever")).find()
    assert aws.count("DescribeAutoScalingGroups") == 1


def test_missing_region_is_fatal(aws):
    options = aws_options(aws, "whatever")
    del options["region"]
    with pytest.raises(FatalDiscoveryError, match="no AWS region"):
        provider("aws", options).find()


def test_aws_endpoint_url_from_the_environment_is_honoured(aws, monkeypatch):
    members = make_group(aws.url, "env-endpoint", size=1, cidr="10.28.1.0/24")
    aws.reset()
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws.url)
    snapshot = provider("aws", {"group": "env-endpoint", "region": "us-east-1"}).find()
    assert set(snapshot.ready) == {members[0]["ip"]}
    assert aws.count("DescribeAutoScalingGroups") == 1


def test_cloud_flags_and_address_map_through_selection(aws):
    members = make_group(aws.url, "flags", size=2, cidr="10.29.1.0/24")
    args = parse_discovery_args([
        "--aws-asg", "flags", "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url,
        "--address-map", "10.29.1.0/24=127.0.29.0/24",
    ])
    snapshot = build_discovery(args).find()
    expected = {"127.0.29." + m["ip"].rsplit(".", 1)[1]: 4 for m in members}
    assert dict(snapshot.ready) == expected
