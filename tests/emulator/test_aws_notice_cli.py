"""``--aws-notice-queue`` through the real CLI: ``cloud-elastic discover`` against moto's SQS."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from tests.emulator.moto_env import event, make_group, sqs_client
from tests.integration.harness import REPO

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def _discover(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "discover", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_discover_with_a_notice_queue_shows_the_spot_deadline_and_consumes_the_message(aws):
    members = make_group(aws.url, "cli-notices", size=2, cidr="10.50.1.0/24")
    sqs = sqs_client(aws.url)
    url = sqs.create_queue(QueueName="cli-notices")["QueueUrl"]
    sent = datetime(2026, 11, 23, 14, 0, tzinfo=timezone.utc)
    sqs.send_message(QueueUrl=url, MessageBody=event(
        "EC2 Spot Instance Interruption Warning", {"instance-id": members[0]["id"], "instance-action": "terminate"},
        time=sent.strftime("%Y-%m-%dT%H:%M:%SZ")))
    flags = ["--aws-asg", "cli-notices", "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url,
             "--aws-notice-queue", url]

    result = _discover(*flags, "--json")
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["ready"] == {members[1]["ip"]: 4}
    assert snapshot["draining"] == {members[0]["ip"]: {"reason": "spot interruption notice (aws-sqs)",
                                                        "deadline": sent.timestamp() + 120}}
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []


def test_discover_with_a_missing_notice_queue_exits_1_with_one_line(aws):
    make_group(aws.url, "cli-no-queue", size=1, cidr="10.50.2.0/24")
    url = sqs_client(aws.url).create_queue(QueueName="cli-exists")["QueueUrl"].rsplit("/", 1)[0] + "/missing"
    result = _discover("--aws-asg", "cli-no-queue", "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url,
                       "--aws-notice-queue", url)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cloud-elastic discover: error: AWS Auto Scaling group "
                                                   "'cli-no-queue': notice queue ") and "missing" in lines[0]
