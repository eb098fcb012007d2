"""``--aws-notice-queue`` through the real CLI against moto's SQS: ``discover``, and ``run`` with real
workers (moto's subnet mapped onto loopback, as in test_cli.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from tests.emulator.moto_env import event, make_group, sqs_client
from tests.integration.harness import REPO, Job, probe_cmd

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(150)]


def _discover(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "discover", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_discover_with_a_notice_queue_shows_the_spot_deadline_and_consumes_the_message(aws):
    members = make_group(aws.url, "cli-notices", size=2, cidr="10.50.1.0/24")
    sqs = sqs_client(aws.url)
    url = sqs.create_queue(QueueName="cli-notices")["QueueUrl"]
    sent = datetime.now(timezone.utc).replace(microsecond=0)  # an old warning would have lapsed (docs/notices.md)
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


@pytest.mark.parametrize("notice", ["spot", "rebalance"])
def test_run_drains_the_host_a_spot_warning_names_and_the_others_go_on_without_rolling_back(aws, notice):
    """Queue mode end to end: the notice wakes the driver (a discovery interval of a minute would be too late),
    the host's worker leaves at a commit (one every 5 steps: a rollback would show as steps executed twice),
    and ``--drain-on-rebalance`` makes a rebalance recommendation drain the host too."""
    group = f"run-{notice}"
    net = {"spot": 82, "rebalance": 85}[notice]
    members = make_group(aws.url, group, size=3, instance_type="g4dn.xlarge", cidr=f"10.{net}.1.0/24")
    hosts = [f"127.0.{net}.{m['ip'].rsplit('.', 1)[1]}" for m in members]
    sqs = sqs_client(aws.url)
    url = sqs.create_queue(QueueName=group)["QueueUrl"]
    job = Job([
        "run", "-np", "3", "--min-np", "1", "--discovery-interval", "60",
        *(["--drain-on-rebalance"] if notice == "rebalance" else []),
        "--aws-asg", group, "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url,
        "--aws-notice-queue", url, "--address-map", f"10.{net}.1.0/24=127.0.{net}.0/24",
        # --min-resets 1: it trains on past step 80 until the drain has happened, however slow the notice.
        *probe_cmd("--steps", "80", "--commit-every", "5", "--min-resets", "1"),
    ])
    try:
        job.wait_event("commit", rank=0, step=10, timeout=90)
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        kind, detail = {
            "spot": ("EC2 Spot Instance Interruption Warning",
                     {"instance-id": members[1]["id"], "instance-action": "terminate"}),
            "rebalance": ("EC2 Instance Rebalance Recommendation", {"instance-id": members[1]["id"]}),
        }[notice]
        sqs.send_message(QueueUrl=url, MessageBody=event(kind, detail, time=now))
        job.wait_event("commit", size=2, timeout=20)
        assert job.finish() == 0, job.output()
    finally:
        if job.proc.poll() is None:
            job.kill()

    reason = {"spot": "spot interruption notice", "rebalance": "rebalance recommendation"}[notice]
    assert f"host {hosts[1]} is draining ({reason} (aws-sqs))" in job.output()
    resets = job.of("reset")
    assert resets and all(r["size"] == 2 for r in resets), resets
    assert all(r["executed"] == r["step"] for r in resets), f"survivors rolled back: {resets}"
    assert all(r["step"] % 5 == 0 for r in resets), resets  # they re-formed exactly at a commit
    assert "aborted" not in job.output()
    done = job.of("done")
    assert len(done) == 2 and len({e["step"] for e in done}) == 1 and done[0]["step"] >= 80, done
    assert len({e["checksum"] for e in done}) == 1


def test_run_drains_an_instance_a_lifecycle_hook_holds_and_completes_the_action_exactly_once(aws):
    """Scale-in with a termination hook: Terminating:Wait drains the host; once its worker has left, the
    driver lets AWS proceed (CompleteLifecycleAction, once) instead of waiting out the hook's timeout."""
    from tests.emulator.moto_env import clients, hold

    members = make_group(aws.url, "run-hook", size=3, instance_type="g4dn.xlarge", cidr="10.83.1.0/24")
    autoscaling, _ = clients(aws.url)
    autoscaling.put_lifecycle_hook(AutoScalingGroupName="run-hook", LifecycleHookName="drain", HeartbeatTimeout=600,
                                   LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
                                   DefaultResult="CONTINUE")
    leaving = members[2]
    job = Job([
        "run", "-np", "3", "--min-np", "1", "--discovery-interval", "0.3",
        "--aws-asg", "run-hook", "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url,
        "--address-map", "10.83.1.0/24=127.0.83.0/24",
        # --min-resets 1: it trains on past step 80 until the drain has happened, however slow the notice.
        *probe_cmd("--steps", "80", "--commit-every", "4", "--min-resets", "1"),
    ])
    try:
        job.wait_event("commit", rank=0, step=8, timeout=90)
        hold(aws, "run-hook", leaving["id"], "drain")
        job.wait_event("commit", size=2, timeout=60)
        assert job.finish() == 0, job.output()
    finally:
        if job.proc.poll() is None:
            job.kill()

    host = f"127.0.83.{leaving['ip'].rsplit('.', 1)[1]}"
    assert f"host {host} is draining" in job.output()
    completions = [c for c in aws.lifecycle_calls if c["Action"] == "CompleteLifecycleAction"]
    assert len(completions) == 1, aws.lifecycle_calls
    assert completions[0]["LifecycleActionResult"] == "CONTINUE"
    assert completions[0].get("InstanceId", leaving["id"]) == leaving["id"]
    resets = job.of("reset")
    assert resets and all(r["executed"] == r["step"] for r in resets), f"survivors rolled back: {resets}"
    done = job.of("done")
    assert len(done) == 2 and len({e["step"] for e in done}) == 1 and done[0]["step"] >= 80, done
    assert len({e["checksum"] for e in done}) == 1
