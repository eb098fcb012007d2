"""The AWS notice parser and book, and the AWS slot and order rules (pure functions, no SDK)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.aws import AWSAutoScalingGroup, gpu_devices, launch_order
from cloud_elastic.providers.aws_notices import Ignored, Notice, NoticeBook, parse_message
from cloud_elastic.providers.selection import build_discovery, parse_discovery_args

T = "2026-11-23T14:00:00Z"
T_S = datetime(2026, 11, 23, 14, 0, tzinfo=timezone.utc).timestamp()
I = "i-0123456789abcdef0"


def eventbridge(detail_type: str, detail, *, time=T, event_id="ev-1", source="aws.ec2") -> str:
    return json.dumps({"version": "0", "id": event_id, "detail-type": detail_type, "source": source,
                       "account": "123456789012", "time": time, "region": "us-east-1",
                       "resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{I}"], "detail": detail})


LIFECYCLE_DETAIL = {"LifecycleActionToken": "tok-1", "AutoScalingGroupName": "gpus", "LifecycleHookName": "drain",
                    "EC2InstanceId": I, "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING"}


@pytest.mark.parametrize(("action", "reason"), [
    ("terminate", "spot interruption notice (aws-sqs)"),
    ("stop", "spot interruption notice: stop (aws-sqs)"),
    ("hibernate", "spot interruption notice: hibernate (aws-sqs)"),
])
def test_a_spot_warning_gives_the_instance_two_minutes_from_the_event_time(action, reason):
    body = eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": I, "instance-action": action})
    assert parse_message(body) == Notice("spot", I, T_S, T_S + 120, reason, "ev-1")


def test_a_rebalance_recommendation_is_a_notice_without_deadline():
    body = eventbridge("EC2 Instance Rebalance Recommendation", {"instance-id": I})
    assert parse_message(body) == Notice("rebalance", I, T_S, None, "rebalance recommendation (aws-sqs)", "ev-1")


def test_a_terminate_lifecycle_action_carries_group_hook_and_token():
    body = eventbridge("EC2 Instance-terminate Lifecycle Action", LIFECYCLE_DETAIL, source="aws.autoscaling")
    assert parse_message(body) == Notice("lifecycle", I, T_S, None, "terminate lifecycle action (aws-sqs)", "ev-1",
                                         group="gpus", hook="drain", token="tok-1")


def test_a_hook_that_targets_the_queue_directly_is_read_and_its_test_notification_ignored():
    direct = {**LIFECYCLE_DETAIL, "Service": "AWS Auto Scaling", "Time": "2026-11-23T14:00:00.123Z",
              "RequestId": "req-1", "AccountId": "123456789012"}
    notice = parse_message(json.dumps(direct))
    assert isinstance(notice, Notice) and (notice.kind, notice.hook, notice.token) == ("lifecycle", "drain", "tok-1")
    assert notice.time == pytest.approx(T_S + 0.123)
    test = {"Event": "autoscaling:TEST_NOTIFICATION", "AutoScalingGroupName": "gpus", "Service": "AWS Auto Scaling"}
    assert parse_message(json.dumps(test)).kind == "test notification"


def test_an_sns_envelope_is_unwrapped_once():
    inner = eventbridge("EC2 Instance Rebalance Recommendation", {"instance-id": I})
    assert parse_message(json.dumps({"Type": "Notification", "Message": inner})).kind == "rebalance"


def test_a_time_with_an_offset_is_the_same_instant():
    body = eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": I}, time="2026-11-23T16:00:00+02:00")
    assert parse_message(body).deadline == T_S + 120


@pytest.mark.parametrize(("body", "kind"), [
    ("", "not JSON"),
    ("{not json", "not JSON"),
    (b'{"bytes": 1}', "not JSON"),
    ("x" * 300_000, "not JSON"),
    ("[" * 100_000 + "]" * 100_000, "not JSON"),  # under the size limit, too deep for the parser
    (json.dumps({"Type": "Notification", "Message": json.dumps({"Type": "Notification", "Message": "{}"})}),
     "wrong shape"),
    ("[]", "wrong shape"),
    ('"a string"', "wrong shape"),
    ("{}", "wrong shape"),
    (eventbridge("EC2 Spot Instance Interruption Warning", "nope"), "wrong shape"),
    (eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": 7}), "wrong shape"),
    (eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": "sir-123"}), "wrong shape"),
    (eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": I}, time="soon"), "wrong shape"),
    (eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": I}, time=None), "wrong shape"),
    (eventbridge("EC2 Instance-terminate Lifecycle Action", {**LIFECYCLE_DETAIL, "LifecycleHookName": ""}),
     "wrong shape"),
    (eventbridge("EC2 Instance-terminate Lifecycle Action",
                 {**LIFECYCLE_DETAIL, "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING"}), "other event"),
    (eventbridge("EC2 Instance State-change Notification", {"instance-id": I, "state": "running"}), "other event"),
])
def test_anything_else_is_ignored_with_a_reason_and_never_raises(body, kind):
    parsed = parse_message(body)
    assert isinstance(parsed, Ignored) and parsed.kind == kind
    assert len(parsed.detail) <= 120 and "\n" not in parsed.detail


def test_the_book_keeps_one_notice_per_kind_and_instance_until_it_leaves():
    book = NoticeBook("test group", "gpus")
    spot = parse_message(eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": I}))
    later = parse_message(eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": I},
                                      time="2026-11-23T14:00:30Z", event_id="ev-2"))
    rebalance = parse_message(eventbridge("EC2 Instance Rebalance Recommendation", {"instance-id": I},
                                          event_id="ev-3"))
    assert book.take(spot, [I]) == "recorded"
    assert book.take(spot, [I]) == "duplicate"  # the same event delivered twice
    assert book.take(later, [I]) == "duplicate"  # a second warning does not move the first deadline
    assert book.take(rebalance, [I]) == "recorded"
    assert book.of(I) == {"spot": spot, "rebalance": rebalance}
    book.forget([I])
    assert book.instances() == [I]
    book.forget([])
    assert book.of(I) == {} and book.instances() == []


def test_the_book_ignores_other_instances_other_groups_and_garbage():
    book = NoticeBook("test group", "gpus")
    other_group = parse_message(eventbridge("EC2 Instance-terminate Lifecycle Action",
                                            {**LIFECYCLE_DETAIL, "AutoScalingGroupName": "cpus"}))
    assert book.take(other_group, [I]) == "other group"
    spot = parse_message(eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": I}))
    assert book.take(spot, ["i-0ther"]) == "other instance"
    assert book.take(parse_message("garbage"), [I]) == "not JSON"
    assert book.instances() == []


@pytest.mark.parametrize(("gpus", "devices"), [
    ({}, 0),
    ({"Gpus": [{"Count": 4, "LogicalGpuCount": 4, "GpuPartitionSize": 1.0}]}, 4),
    ({"Gpus": [{"Count": 0, "LogicalGpuCount": 1, "GpuPartitionSize": 0.125}]}, 1),  # g6f.large
    ({"Gpus": [{"Count": 8}]}, 8),  # older answers without LogicalGpuCount
    ({"Gpus": [{"Count": 1, "LogicalGpuCount": 1}, {"Count": 2}]}, 3),
])
def test_slots_count_the_gpu_devices_an_instance_sees(gpus, devices):
    assert gpu_devices(gpus) == devices


def test_launch_order_compares_instants_not_notations():
    utc = datetime(2026, 11, 23, 13, 0, tzinfo=timezone.utc)
    earlier_with_offset = datetime(2026, 11, 23, 14, 30, tzinfo=timezone(timedelta(hours=2)))
    assert launch_order(earlier_with_offset) < launch_order(utc) < launch_order(utc + timedelta(microseconds=1))
    assert launch_order("2026-11-23T14:30:00+02:00") == launch_order(earlier_with_offset)
    assert launch_order(utc) < launch_order(None) == launch_order("garbage")  # unknown sorts last


def _build(*argv: str):
    return build_discovery(parse_discovery_args(list(argv)))


def test_the_notice_queue_flag_and_options_reach_the_provider():
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/gpus-notices"
    provider = _build("--aws-asg", "gpus", "--aws-notice-queue", url, "-o", "drain_on_rebalance=yes",
                      "-o", "lifecycle_hook=drain")
    assert isinstance(provider, AWSAutoScalingGroup)
    assert (provider.notice_queue, provider.drain_on_rebalance) == (url, True)
    plain = _build("--aws-asg", "gpus")
    assert (plain.notice_queue, plain.drain_on_rebalance, dict(plain.soft_notices)) == (None, False, {})


@pytest.mark.parametrize(("argv", "message"), [
    (["--aws-asg", "g", "--aws-notice-queue", "gpus-notices"], "option 'notice_queue' must be an http(s) URL"),
    (["--aws-asg", "g", "-o", "drain_on_rebalance=sometimes"], "option 'drain_on_rebalance' must be true or false"),
    (["--gcp-mig", "m", "--gcp-project", "p", "--gcp-zone", "z", "--aws-notice-queue", "https://q"],
     "--aws-notice-queue needs --aws-asg"),
])
def test_bad_notice_options_are_one_line_config_errors(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _build(*argv)


@pytest.mark.parametrize("action", ["reboot\nERROR forged line " + "x" * 5000, {"nested": ["x" * 500]}, 7])
def test_a_spot_warning_with_an_unknown_action_drains_with_a_short_one_line_reason(action):
    """The event's type says EC2 takes the instance in two minutes: drained, but the action is the sender's text."""
    parsed = parse_message(eventbridge("EC2 Spot Instance Interruption Warning",
                                       {"instance-id": I, "instance-action": action}))
    assert isinstance(parsed, Notice) and (parsed.kind, parsed.deadline) == ("spot", T_S + 120)
    assert parsed.reason.startswith("spot interruption notice: unknown action ")
    assert parsed.reason.endswith(" (aws-sqs)") and "\n" not in parsed.reason and len(parsed.reason) <= 100


def test_the_book_forgets_the_oldest_foreign_instances_it_logged_so_its_memory_stays_bounded():
    """The queue sees every Spot warning of the account and region: one key each, for ever, was a leak."""
    import tracemalloc

    book = NoticeBook("test group", "gpus")

    def foreign(start: int, count: int) -> None:
        for n in range(start, start + count):
            spot = Notice("spot", f"i-{n:017x}", T_S, T_S + 120, "spot interruption notice (aws-sqs)", f"ev-{n}")
            assert book.take(spot, [I]) == "other instance"

    tracemalloc.start()
    try:
        foreign(0, 10_000)  # past the bound: from here on, each new key pushes out the oldest
        before = tracemalloc.get_traced_memory()[0]
        foreign(10_000, 20_000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 256 * 1024, f"{grown} bytes more after 20,000 more instances"  # unbounded: about 2.5 MB
    spot = parse_message(eventbridge("EC2 Spot Instance Interruption Warning", {"instance-id": I}))
    assert book.take(spot, [I]) == "recorded"
