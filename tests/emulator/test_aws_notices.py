"""AWS queue mode and lifecycle hooks: the provider against moto's SQS and Auto Scaling over HTTP.

The lifecycle-action calls moto lacks are served by the proxy (see moto_env.py),
which accepts them only for an active action, like AWS. A scripted clock
drives the hook timeouts, so nothing here waits.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timezone

import pytest

from cloud_elastic.errors import FatalDiscoveryError
from cloud_elastic.providers.api import Drain
from cloud_elastic.providers.aws import AWSAutoScalingGroup
from tests.emulator.fixtures import aws_options
from tests.emulator.moto_env import THROTTLED, clients, event, hold, make_group, set_member, sqs_client

pytestmark = pytest.mark.emulator

T0 = datetime(2026, 11, 23, 14, 0, 0, tzinfo=timezone.utc).timestamp()
SPOT = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
LIFECYCLE = "EC2 Instance-terminate Lifecycle Action"
SQS_UNAVAILABLE = json.dumps({"__type": "com.amazonaws.sqs#ServiceUnavailable", "message": "try later"}).encode()


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def iso(seconds_after_t0: float) -> str:
    return datetime.fromtimestamp(T0 + seconds_after_t0, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def discovery(proxy, group: str, clock: Clock | None = None, **options: str) -> AWSAutoScalingGroup:
    """The provider from its options, as the CLI builds it; with ``clock``, the same options and scripted time."""
    built = AWSAutoScalingGroup.from_options(aws_options(proxy, group, **options))
    if clock is None:
        return built
    return AWSAutoScalingGroup(group, region=built.region, endpoint_url=built.endpoint_url,
                               max_attempts=built.max_attempts, notice_queue=built.notice_queue,
                               drain_on_rebalance=built.drain_on_rebalance,
                               lifecycle_hook=options.get("lifecycle_hook"),
                               clock=clock, queue_wait_s=1)


@pytest.fixture
def queue(aws, request):
    sqs = sqs_client(aws.url)
    url = sqs.create_queue(QueueName=f"notices-{request.node.name[:60]}")["QueueUrl"]
    yield sqs, url
    sqs.delete_queue(QueueUrl=url)


def waiting(sqs, url: str) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                                                         "ApproximateNumberOfMessagesNotVisible"])
    return sum(int(v) for v in attributes["Attributes"].values())


def put_hook(proxy, group: str, name: str = "drain", timeout: int = 300) -> None:
    autoscaling, _ = clients(proxy.url)
    autoscaling.put_lifecycle_hook(AutoScalingGroupName=group, LifecycleHookName=name, HeartbeatTimeout=timeout,
                                   LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
                                   DefaultResult="CONTINUE")


def test_a_spot_warning_drains_its_host_with_the_two_minute_deadline_until_the_instance_leaves(aws, queue):
    sqs, url = queue
    members = make_group(aws.url, "spot", size=3, cidr="10.40.1.0/24")
    ip = [m["ip"] for m in members]
    provider = discovery(aws, "spot", Clock(T0 + 5), notice_queue=url)
    assert set(provider.find().ready) == set(ip)

    sqs.send_message(QueueUrl=url, MessageBody=event(SPOT, {"instance-id": members[1]["id"],
                                                            "instance-action": "terminate"}, time=iso(0)))
    expected = Drain(T0 + 120, "spot interruption notice (aws-sqs)")
    first = provider.find()
    assert dict(first.draining) == {ip[1]: expected}
    assert list(first.ready) == [ip[0], ip[2]] and first.instances[ip[1]] == members[1]["id"]
    assert waiting(sqs, url) == 0  # handled, so deleted
    assert provider.find().draining == {ip[1]: expected}  # remembered, not read again

    autoscaling, _ = clients(aws.url)
    autoscaling.detach_instances(AutoScalingGroupName="spot", InstanceIds=[members[1]["id"]],
                                 ShouldDecrementDesiredCapacity=True)
    gone = provider.find()
    assert ip[1] not in gone.ready and ip[1] not in gone.draining


def test_a_lifecycle_action_drains_with_the_hook_deadline_and_release_completes_it_once_by_token(aws, queue):
    sqs, url = queue
    members = make_group(aws.url, "hooked", size=2, cidr="10.41.1.0/24")
    put_hook(aws, "hooked", "drain", timeout=300)
    leaving = members[0]
    clock = Clock(T0 + 5)
    provider = discovery(aws, "hooked", clock, notice_queue=url)
    token = hold(aws, "hooked", leaving["id"], "drain")
    sqs.send_message(QueueUrl=url, MessageBody=event(LIFECYCLE, {
        "LifecycleActionToken": token, "AutoScalingGroupName": "hooked", "LifecycleHookName": "drain",
        "EC2InstanceId": leaving["id"], "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
    }, time=iso(0), source="aws.autoscaling"))

    snapshot = provider.find()
    assert dict(snapshot.draining) == {leaving["ip"]: Drain(T0 + 300, "terminate lifecycle action (aws-sqs)")}
    assert aws.lifecycle_calls == []  # the job still needs it

    provider.release(leaving["ip"], leaving["id"])
    provider.release(leaving["ip"], leaving["id"])  # idempotent
    provider.find()
    provider.find()
    assert aws.lifecycle_calls == [{"Action": "CompleteLifecycleAction", "AutoScalingGroupName": "hooked",
                                    "LifecycleHookName": "drain", "LifecycleActionResult": "CONTINUE",
                                    "LifecycleActionToken": token}]
    assert provider.find().draining[leaving["ip"]].reason == "terminate lifecycle action (aws-sqs)"


def test_a_held_instance_gets_heartbeats_before_its_timeout_then_one_completion_by_instance_id(aws):
    # No queue: the group state alone shows the hold; the hook is found with DescribeLifecycleHooks. When the hold
    # began is unknown (the driver restarted, or discovery failed meanwhile): it may have begun long before T0.
    members = make_group(aws.url, "heartbeat", size=2, cidr="10.42.1.0/24")
    put_hook(aws, "heartbeat", "drain", timeout=300)
    leaving = members[1]
    hold(aws, "heartbeat", leaving["id"], "drain")
    clock = Clock()
    provider = discovery(aws, "heartbeat", clock)

    # Heartbeated at once, so AWS's timeout runs from now and the deadline the driver is told is AWS's own.
    assert provider.find().draining == {leaving["ip"]: Drain(T0 + 300, "Terminating:Wait (lifecycle hook drain)")}
    heartbeat = {"Action": "RecordLifecycleActionHeartbeat", "AutoScalingGroupName": "heartbeat",
                 "LifecycleHookName": "drain", "InstanceId": leaving["id"]}
    assert aws.lifecycle_calls == [heartbeat]
    clock.now = T0 + 150  # half the timeout left: nothing to do yet
    assert provider.find().draining[leaving["ip"]].deadline == T0 + 300
    assert aws.lifecycle_calls == [heartbeat]

    clock.now = T0 + 220  # under a third left: one heartbeat, deadline moved
    assert provider.find().draining[leaving["ip"]].deadline == T0 + 520
    clock.now = T0 + 221
    assert provider.find().draining[leaving["ip"]].deadline == T0 + 520
    assert aws.lifecycle_calls == [heartbeat, heartbeat]

    provider.release(leaving["ip"], None)  # the provider knows the instance from its snapshot
    clock.now = T0 + 500  # released: no more heartbeats
    after = provider.find()
    assert aws.lifecycle_calls == [heartbeat, heartbeat, {
        "Action": "CompleteLifecycleAction", "AutoScalingGroupName": "heartbeat", "LifecycleHookName": "drain",
        "LifecycleActionResult": "CONTINUE", "InstanceId": leaving["id"]}]
    assert after.draining == {leaving["ip"]: Drain(None, "Terminating:Proceed")}
    assert aws.count("DescribeLifecycleHooks") == 1  # cached


def test_a_hold_of_unknown_start_whose_first_heartbeat_fails_drains_by_the_earliest_time_it_can_end(aws, caplog):
    members = make_group(aws.url, "first-beat", size=2, cidr="10.42.2.0/24")
    put_hook(aws, "first-beat", "drain", timeout=300)
    leaving = members[0]
    hold(aws, "first-beat", leaving["id"], "drain")
    clock = Clock()
    provider = discovery(aws, "first-beat", clock, max_attempts="1")
    aws.fail("RecordLifecycleActionHeartbeat", 1, 500, b"<ErrorResponse><Error><Code>InternalFailure</Code>"
                                                       b"<Message>boom</Message></Error></ErrorResponse>")
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.providers.aws_hooks"):
        # It may have begun 300 s before T0, so AWS may let it go now: that is the deadline, not T0 + 300.
        assert provider.find().draining == {leaving["ip"]: Drain(T0, "Terminating:Wait (lifecycle hook drain)")}
    assert "RecordLifecycleActionHeartbeat for " + leaving["id"] + " failed" in caplog.text
    assert "until then its deadline is when it was first seen waiting, 0s ago" in caplog.text
    assert aws.lifecycle_calls == []  # the fault answered before the action was served

    clock.now = T0 + 10  # retried at the next discovery: AWS's timeout now runs from here
    assert provider.find().draining[leaving["ip"]].deadline == T0 + 310
    assert [c["Action"] for c in aws.lifecycle_calls] == ["RecordLifecycleActionHeartbeat"]


def test_an_action_completed_elsewhere_ends_the_hold_without_retrying_forever(aws):
    members = make_group(aws.url, "elsewhere", size=1, cidr="10.43.2.0/24")
    put_hook(aws, "elsewhere", "drain", timeout=300)
    leaving = members[0]
    token = hold(aws, "elsewhere", leaving["id"], "drain")
    clock = Clock()
    provider = discovery(aws, "elsewhere", clock)
    provider.find()
    autoscaling, _ = clients(aws.url)
    autoscaling.complete_lifecycle_action(AutoScalingGroupName="elsewhere", LifecycleHookName="drain",
                                          LifecycleActionToken=token, LifecycleActionResult="CONTINUE")
    # Terminating:Proceed now, but the group's answers are eventually consistent: it may still read Wait.
    set_member("elsewhere", leaving["id"], lifecycle="Terminating:Wait")
    clock.now = T0 + 250
    provider.find()  # heartbeat: "No active Lifecycle Action", so the hold is over
    clock.now = T0 + 280
    provider.find()
    provider.release(leaving["ip"], leaving["id"])
    assert [c["Action"] for c in aws.lifecycle_calls] == [
        "RecordLifecycleActionHeartbeat", "CompleteLifecycleAction", "RecordLifecycleActionHeartbeat"]


def test_a_failed_completion_is_logged_and_retried_at_the_next_discovery(aws, caplog):
    members = make_group(aws.url, "retry-complete", size=1, cidr="10.43.1.0/24")
    put_hook(aws, "retry-complete", "drain", timeout=300)
    hold(aws, "retry-complete", members[0]["id"], "drain")
    provider = discovery(aws, "retry-complete", Clock(), max_attempts="1")
    provider.find()
    aws.lifecycle_calls.clear()  # the heartbeat of a hold first seen
    aws.fail("CompleteLifecycleAction", 1, 500, b"<ErrorResponse><Error><Code>InternalFailure</Code>"
                                                b"<Message>boom</Message></Error></ErrorResponse>")
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.providers.aws_hooks"):
        provider.release(members[0]["ip"], members[0]["id"])  # does not raise
    assert "CompleteLifecycleAction for " + members[0]["id"] + " failed" in caplog.text
    assert aws.lifecycle_calls == []  # the fault answered before the action was served
    provider.find()
    provider.find()
    assert [c["Action"] for c in aws.lifecycle_calls] == ["CompleteLifecycleAction"]
    assert aws.count("CompleteLifecycleAction") == 2


def test_a_release_before_the_hold_completes_the_action_as_soon_as_the_hook_catches_the_instance(aws, queue):
    # The spot path: the notice drains the host, its workers leave, and only then does the group's
    # termination hook catch the instance. The job no longer needs it, so it is let go at once.
    sqs, url = queue
    members = make_group(aws.url, "spot-then-hook", size=2, cidr="10.48.1.0/24")
    put_hook(aws, "spot-then-hook", "drain", timeout=300)
    leaving = members[0]
    provider = discovery(aws, "spot-then-hook", Clock(), notice_queue=url)
    sqs.send_message(QueueUrl=url, MessageBody=event(SPOT, {"instance-id": leaving["id"]}, time=iso(0)))
    assert set(provider.find().draining) == {leaving["ip"]}
    provider.release(leaving["ip"], leaving["id"])
    assert aws.lifecycle_calls == []  # nothing holds it yet

    hold(aws, "spot-then-hook", leaving["id"], "drain")
    snapshot = provider.find()
    # The spot deadline is earlier than the hook's, and it is the one that counts.
    assert snapshot.draining == {leaving["ip"]: Drain(T0 + 120, "spot interruption notice (aws-sqs)")}
    assert [(c["Action"], c.get("InstanceId")) for c in aws.lifecycle_calls] == [
        ("CompleteLifecycleAction", leaving["id"])]
    provider.find()
    assert len(aws.lifecycle_calls) == 1


def test_with_several_termination_hooks_only_the_named_one_is_heartbeated_and_completed(aws, queue, caplog):
    sqs, url = queue
    members = make_group(aws.url, "two-hooks", size=1, cidr="10.49.1.0/24")
    put_hook(aws, "two-hooks", "drain", timeout=300)
    put_hook(aws, "two-hooks", "backup", timeout=600)  # another tool's hook
    leaving = members[0]
    hold(aws, "two-hooks", leaving["id"], "drain")
    backup_token = aws.start_action("two-hooks", "backup", leaving["id"])
    sqs.send_message(QueueUrl=url, MessageBody=event(LIFECYCLE, {
        "LifecycleActionToken": backup_token, "AutoScalingGroupName": "two-hooks", "LifecycleHookName": "backup",
        "EC2InstanceId": leaving["id"], "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
    }, time=iso(0), source="aws.autoscaling"))

    unnamed = discovery(aws, "two-hooks", Clock(), notice_queue=url)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.providers.aws_hooks"):
        assert unnamed.find().draining == {leaving["ip"]: Drain(None, "terminate lifecycle action (aws-sqs)")}
        unnamed.release(leaving["ip"], leaving["id"])
        unnamed.find()
    assert "-o lifecycle_hook=NAME" in caplog.text
    assert aws.lifecycle_calls == []  # not even the hook the notice named: guessing could cut another tool short

    clock = Clock()
    named = discovery(aws, "two-hooks", clock, lifecycle_hook="drain")
    assert named.find().draining == {leaving["ip"]: Drain(T0 + 300, "Terminating:Wait (lifecycle hook drain)")}
    clock.now = T0 + 250
    named.find()
    named.release(leaving["ip"], leaving["id"])
    assert [(c["Action"], c["LifecycleHookName"]) for c in aws.lifecycle_calls] == [
        ("RecordLifecycleActionHeartbeat", "drain"), ("RecordLifecycleActionHeartbeat", "drain"),
        ("CompleteLifecycleAction", "drain")]


def test_garbage_duplicates_and_other_instances_or_groups_are_ignored_and_deleted(aws, queue, caplog):
    sqs, url = queue
    members = make_group(aws.url, "noisy", size=2, cidr="10.44.1.0/24")
    ip = [m["ip"] for m in members]
    spot = event(SPOT, {"instance-id": members[0]["id"], "instance-action": "stop"}, time=iso(0), event_id="e-1")
    bodies = [
        "not json at all",
        "[1, 2, 3]",
        json.dumps({"detail-type": SPOT, "detail": "nope"}),
        event(SPOT, {"instance-id": members[0]["id"]}, time="yesterday"),
        event("EC2 Instance State-change Notification", {"instance-id": members[0]["id"], "state": "running"},
              time=iso(0)),
        event(SPOT, {"instance-id": "i-0000000000000dead", "instance-action": "terminate"}, time=iso(0)),
        event(LIFECYCLE, {"AutoScalingGroupName": "someone-else", "LifecycleHookName": "h",
                          "EC2InstanceId": members[1]["id"], "LifecycleActionToken": "t"},
              time=iso(0), source="aws.autoscaling"),
        spot,
        spot,  # EventBridge delivers at least once
        event(SPOT, {"instance-id": members[0]["id"], "instance-action": "terminate"}, time=iso(30)),
    ]
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=body)
    provider = discovery(aws, "noisy", Clock(T0 + 5), notice_queue=url)
    with caplog.at_level(logging.DEBUG, logger="cloud_elastic.providers"):
        snapshot = provider.find()
    assert dict(snapshot.draining) == {ip[0]: Drain(T0 + 120, "spot interruption notice: stop (aws-sqs)")}
    assert dict(snapshot.ready) == {ip[1]: 4}
    assert waiting(sqs, url) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all("ignoring a notice queue message" in w for w in warnings)
    assert {w.split("(")[1].split(")")[0] for w in warnings} == {"not JSON", "wrong shape", "other event"}
    assert "i-0000000000000dead, not in the group" in caplog.text
    assert "lifecycle action of group 'someone-else'" in caplog.text


def test_one_discovery_reads_at_most_ten_full_batches_and_leaves_the_rest_for_the_next(aws, queue):
    sqs, url = queue
    members = make_group(aws.url, "backlog", size=1, cidr="10.44.2.0/24")
    other = [event(REBALANCE, {"instance-id": f"i-{n:017x}"}, time=iso(0)) for n in range(104)]
    spot = event(SPOT, {"instance-id": members[0]["id"]}, time=iso(0))
    for start in range(0, len(other), 10):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": body}
                                                      for n, body in enumerate(other[start:start + 10])])
    sqs.send_message(QueueUrl=url, MessageBody=spot)
    provider = discovery(aws, "backlog", Clock(T0 + 5), notice_queue=url)
    aws.reset()
    provider.find()
    assert aws.count("AmazonSQS.ReceiveMessage") == 10 and waiting(sqs, url) == 5
    aws.reset()
    assert set(provider.find().draining) == {members[0]["ip"]}  # the last message, at the next discovery
    assert aws.count("AmazonSQS.ReceiveMessage") == 1 and waiting(sqs, url) == 0


def test_a_rebalance_recommendation_is_a_soft_notice_unless_the_option_drains_on_it(aws, queue):
    sqs, url = queue
    members = make_group(aws.url, "rebalance", size=2, cidr="10.45.1.0/24")
    ip = [m["ip"] for m in members]
    body = event(REBALANCE, {"instance-id": members[1]["id"]}, time=iso(0))
    soft = discovery(aws, "rebalance", Clock(T0 + 5), notice_queue=url)
    sqs.send_message(QueueUrl=url, MessageBody=body)
    snapshot = soft.find()
    assert set(snapshot.ready) == set(ip) and snapshot.draining == {}
    assert dict(soft.soft_notices) == {ip[1]: "rebalance recommendation (aws-sqs)"}

    draining = discovery(aws, "rebalance", Clock(T0 + 5), notice_queue=url, drain_on_rebalance="true")
    sqs.send_message(QueueUrl=url, MessageBody=body)
    assert draining.find().draining == {ip[1]: Drain(None, "rebalance recommendation (aws-sqs)")}
    assert draining.soft_notices == {}


def test_an_unreadable_queue_leaves_the_group_state_in_charge_and_the_notice_comes_next_time(aws, queue, caplog):
    sqs, url = queue
    members = make_group(aws.url, "throttled-queue", size=2, cidr="10.46.1.0/24")
    provider = discovery(aws, "throttled-queue", Clock(T0 + 5), notice_queue=url, max_attempts="2")
    provider.find()
    sqs.send_message(QueueUrl=url, MessageBody=event(SPOT, {"instance-id": members[0]["id"]}, time=iso(0)))
    aws.reset()
    aws.fail("AmazonSQS.ReceiveMessage", 2, 503, SQS_UNAVAILABLE)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.providers.aws"):
        snapshot = provider.find()
    assert set(snapshot.ready) == {m["ip"] for m in members} and snapshot.draining == {}
    assert "cannot read notice queue" in caplog.text and "group state still used" in caplog.text
    assert aws.count("AmazonSQS.ReceiveMessage") == 2  # the SDK's retries, bounded by max_attempts
    assert set(provider.find().draining) == {members[0]["ip"]}


def test_throttling_by_sqs_is_not_an_error_either(aws, queue):
    sqs, url = queue
    members = make_group(aws.url, "sqs-throttle", size=1, cidr="10.46.2.0/24")
    provider = discovery(aws, "sqs-throttle", notice_queue=url, max_attempts="1")
    aws.fail("AmazonSQS.ReceiveMessage", 1, 400, THROTTLED)
    assert set(provider.find().ready) == {members[0]["ip"]}


def test_a_queue_that_does_not_exist_is_fatal_at_the_first_discovery(aws, queue):
    sqs, url = queue
    make_group(aws.url, "no-queue", size=1, cidr="10.47.1.0/24")
    missing = url.rsplit("/", 1)[0] + "/no-such-queue"
    with pytest.raises(FatalDiscoveryError, match="notice queue .*no-such-queue"):
        discovery(aws, "no-queue", notice_queue=missing).find()


def test_once_the_driver_asks_for_news_a_members_notice_wakes_it_at_once(aws, queue):
    """The receiver long-polls the queue: the notice reaches the next find() without waiting for the interval."""
    sqs, url = queue
    members = make_group(aws.url, "push", size=2, cidr="10.51.1.0/24")
    provider = discovery(aws, "push", Clock(T0 + 5), notice_queue=url)
    woken = threading.Event()
    try:
        provider.wake_on_news(woken.set)  # as the driver's poller does, after its first discovery
        assert set(provider.find().ready) == {m["ip"] for m in members}
        sqs.send_message(QueueUrl=url, MessageBody=event(SPOT, {"instance-id": members[0]["id"]}, time=iso(0)))
        assert woken.wait(10)
        assert provider.find().draining == {members[0]["ip"]: Drain(T0 + 120, "spot interruption notice (aws-sqs)")}
    finally:
        provider.close()


def _noticed(aws, queue, group: str, net: int, kind: str, **event_args):
    """A group of two, a provider on a scripted clock 5 s after T0, and a ``kind`` event for the first member
    (sent at T0) filed by a first find(). Returns the members, the clock, the provider and the message's body."""
    sqs, url = queue
    members = make_group(aws.url, group, size=2, cidr=f"10.{net}.1.0/24")
    clock = Clock(T0 + 5)
    provider = discovery(aws, group, clock, notice_queue=url)
    body = event(kind, {"instance-id": members[0]["id"]}, time=iso(0), **event_args)
    sqs.send_message(QueueUrl=url, MessageBody=body)
    provider.find()
    return members, clock, provider, body


def test_a_spot_notice_aws_did_not_follow_lapses_two_minutes_after_its_deadline(aws, queue, caplog):
    members, clock, provider, body = _noticed(aws, queue, "lapse", 52, SPOT, event_id="spot-1")
    clock.now = T0 + 239
    assert set(provider.find().draining) == {members[0]["ip"]}
    clock.now = T0 + 240  # the interruption was due at T0 + 120 and the instance is still in service
    with caplog.at_level(logging.INFO, logger="cloud_elastic.providers.aws"):
        snapshot = provider.find()
    assert snapshot.draining == {} and set(snapshot.ready) == {m["ip"] for m in members}
    assert "lapsed" in caplog.text
    queue[0].send_message(QueueUrl=queue[1], MessageBody=body)  # a late duplicate does not bring it back
    assert provider.find().draining == {}


def test_a_spot_notice_does_not_lapse_while_the_group_shows_the_instance_leaving(aws, queue):
    members, clock, provider, _ = _noticed(aws, queue, "no-lapse", 53, SPOT)
    set_member("no-lapse", members[0]["id"], lifecycle="Terminating")
    clock.now = T0 + 1000
    assert provider.find().draining == {members[0]["ip"]: Drain(T0 + 120, "spot interruption notice (aws-sqs)")}


def test_a_rebalance_recommendation_lapses_ten_minutes_after_it_was_sent(aws, queue):
    members, clock, provider, _ = _noticed(aws, queue, "soft-lapse", 54, REBALANCE)
    clock.now = T0 + 599
    assert provider.find().soft == {members[0]["ip"]: "rebalance recommendation (aws-sqs)"}
    clock.now = T0 + 600
    assert provider.find().soft == {}
