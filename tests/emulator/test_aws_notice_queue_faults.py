"""AWS queue mode against moto's SQS: messages that once kept a host drained for ever, or were lost.

A scripted clock drives the lapses, so nothing here waits for them; the
receiver's thread is waited on with a bound.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from cloud_elastic.providers.api import Drain
from cloud_elastic.providers.aws_notices import QueueReceiver
from tests.emulator.moto_env import event, make_group, sqs_client
from tests.emulator.test_aws_notices import REBALANCE, SPOT, T0, Clock, discovery, iso, queue, waiting  # noqa: F401

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]

FAR = "9999-12-31T00:00:00Z"  # a garbled event time


def test_a_spot_warning_with_a_far_future_time_lapses_an_hour_after_it_arrived(aws, queue):
    """docs/notices.md: a deadline more than an hour ahead counts as an hour, in queue mode too."""
    sqs, url = queue
    members = make_group(aws.url, "far", size=2, cidr="10.90.1.0/24")
    ip = [m["ip"] for m in members]
    clock = Clock(T0 + 5)
    provider = discovery(aws, "far", clock, notice_queue=url)
    sqs.send_message(QueueUrl=url, MessageBody=event(SPOT, {"instance-id": members[0]["id"]}, time=FAR))
    assert set(provider.find().draining) == {ip[0]}
    clock.now = T0 + 5 + 3600 + 119  # an hour's lead, then the two minutes' grace every hard notice gets
    assert set(provider.find().draining) == {ip[0]}
    clock.now = T0 + 5 + 3600 + 120
    snapshot = provider.find()
    assert snapshot.draining == {} and set(snapshot.ready) == set(ip)


def test_a_rebalance_recommendation_with_a_far_future_time_lapses_ten_minutes_after_it_arrived(aws, queue):
    sqs, url = queue
    members = make_group(aws.url, "far-soft", size=1, cidr="10.90.2.0/24")
    clock = Clock(T0 + 5)
    provider = discovery(aws, "far-soft", clock, notice_queue=url)
    sqs.send_message(QueueUrl=url, MessageBody=event(REBALANCE, {"instance-id": members[0]["id"]}, time=FAR))
    assert provider.find().soft == {members[0]["ip"]: "rebalance recommendation (aws-sqs)"}
    clock.now = T0 + 5 + 600
    assert provider.find().soft == {}


def test_a_spot_warning_on_time_keeps_its_two_minute_deadline(aws, queue):
    """The cap changes nothing for a real warning: it lapses two minutes after its deadline, as before."""
    sqs, url = queue
    members = make_group(aws.url, "on-time", size=1, cidr="10.90.3.0/24")
    clock = Clock(T0 + 5)
    provider = discovery(aws, "on-time", clock, notice_queue=url)
    sqs.send_message(QueueUrl=url, MessageBody=event(SPOT, {"instance-id": members[0]["id"]}, time=iso(0)))
    assert provider.find().draining == {members[0]["ip"]: Drain(T0 + 120, "spot interruption notice (aws-sqs)")}
    clock.now = T0 + 239
    assert set(provider.find().draining) == {members[0]["ip"]}
    clock.now = T0 + 240
    assert provider.find().draining == {}


def test_a_full_receiver_leaves_the_rest_in_the_queue_until_find_takes_what_it_holds(aws, queue, caplog):
    """While find() does not run (discovery failing), the oldest bodies were dropped after SQS had deleted them."""
    caplog.set_level(logging.INFO, logger="cloud_elastic.providers.aws_notices")
    sqs, url = queue
    bodies = [event(REBALANCE, {"instance-id": f"i-{n:017x}"}, time=iso(0)) for n in range(30)]
    for start in range(0, len(bodies), 10):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": body}
                                                       for n, body in enumerate(bodies[start:start + 10])])
    errors: list[Exception] = []
    receiver = QueueReceiver(sqs_client(aws.url), url, wake=lambda: None, urgent=lambda body: False,
                             trouble=errors.append, wait_s=1, max_waiting=12)
    receiver.start()
    try:
        deadline = time.monotonic() + 20
        while "receiving paused" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "receiving paused" in caplog.text
        assert waiting(sqs, url) == 18  # received and deleted: only what the receiver holds
        got = receiver.take()
        assert len(got) == 12
        while len(got) < len(bodies) and time.monotonic() < deadline:  # room again: it receives the rest
            time.sleep(0.05)
            got += receiver.take()
    finally:
        receiver.close()
    assert sorted(got) == sorted(bodies) and errors == []  # nothing lost
    pauses = [r for r in caplog.records if "receiving paused" in r.getMessage()]
    assert [r.levelno for r in pauses] == [logging.WARNING] and "\n" not in pauses[0].getMessage()


def test_close_ends_a_paused_receiver(aws, queue):
    sqs, url = queue
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": f"body {n}"} for n in range(3)])
    receiver = QueueReceiver(sqs_client(aws.url), url, wake=lambda: None, urgent=lambda body: False,
                             trouble=lambda exc: None, wait_s=1, max_waiting=2)
    receiver.start()
    deadline = time.monotonic() + 20
    while waiting(sqs, url) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    receiver.close()
    threads = [t for t in threading.enumerate() if t.name == "notice-queue"]  # this one, and any closed before
    for thread in threads:
        thread.join(5)
    assert not any(t.is_alive() for t in threads)
    assert waiting(sqs, url) == 1 and len(receiver.take()) == 2
