"""A job on an on-demand fallback group hands its training state to Spot workers, and the fallback starts a job
Spot alone cannot start (review s61 rvK findings 1 and 2), with real workers on three moto Auto Scaling groups.

1. The job runs wholly on the fallback; Spot comes back: the fallback worker trains on until a round with the
   Spot worker has synced the state to it, then leaves at a commit. Before, it left as soon as the Spot worker
   reached rendezvous, and the job failed: "training state lost" (rc 1). (Several fallback holders: the unit
   tests, tests/unit/test_fallback_handoff.py.)
2. Spot gives fewer slots than -np (but --min-np or more) at start-up, with --fallback-after equal to
   --start-timeout, as docs/multi-source.md's command has them: the fallback tops the job up at once and it starts.
   Before, it waited for -np until --start-timeout and failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.emulator.moto_env import clients, make_group
from tests.integration.conftest import jobs  # noqa: F401  (the fixture that kills what a test leaves running)
from tests.integration.harness import probe_cmd

pytestmark = [pytest.mark.emulator]


def desired(proxy, name: str) -> int:
    autoscaling, _ = clients(proxy.url)
    return autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0][
        "DesiredCapacity"]


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _on(prefix: str, e: dict) -> bool:
    return e["event"] == "round_formed" and all(h.startswith(prefix) for h in e["ranks"])


@pytest.mark.timeout(240)
def test_a_job_wholly_on_the_fallback_hands_its_state_to_the_spot_workers_and_loses_no_step(aws, jobs, tmp_path):
    autoscaling, _ = clients(aws.url)
    make_group(aws.url, "ho-spot", size=0, instance_type="g4dn.xlarge", cidr="10.71.1.0/24")
    make_group(aws.url, "ho-od", size=0, instance_type="g4dn.xlarge", cidr="10.71.2.0/24")
    for group in ("ho-spot", "ho-od"):
        autoscaling.update_auto_scaling_group(AutoScalingGroupName=group, MaxSize=1)
    events, stop = tmp_path / "events.jsonl", tmp_path / "stop"
    job = jobs([
        "run", "-np", "1", "--discovery-interval", "0.3",
        "--aws-asg", "ho-spot", "--aws-asg", "ho-od", "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url,
        "--source", "ho-spot:price=0.2", "--source", "ho-od:fallback,price=1.5", "--manage-capacity",
        "--events-file", str(events),
        *[a for n in (1, 2) for a in ("--address-map", f"10.71.{n}.0/24=127.71.{n}.0/24")],
        *probe_cmd("--steps", "30", "--step-sleep", "0.1", "--stop-when", str(stop), "--entry-events"),
    ])
    job.wait_event("commit", rank=0, step=10, timeout=120)
    assert desired(aws, "ho-od") == 1 and all(_on("127.71.2.", e) for e in _events(events)
                                               if e["event"] == "round_formed")  # wholly on the fallback

    autoscaling.set_desired_capacity(AutoScalingGroupName="ho-spot", DesiredCapacity=1)  # Spot is back
    job.wait_for(lambda j: any(_on("127.71.1.", e) for e in _events(events)), timeout=90, what="a round on Spot")
    job.wait_for(lambda j: desired(aws, "ho-od") == 0, timeout=60, what="the fallback group back at 0")
    stop.touch()
    assert job.finish() == 0, job.output()
    out = job.output()
    assert "training state lost" not in out and "were lost" not in out, out

    seen = _events(events)
    assert [e for e in seen if e["event"] == "rollback"] == [], "a fallback worker's leave rolled the job back"
    formed = [e for e in seen if e["event"] == "round_formed"]
    assert not any(e["from_checkpoint"] for e in formed)
    handover = next(e for e in formed if any(h.startswith("127.71.1.") for h in e["ranks"]))
    assert handover["synced"] and handover["step"] >= 10  # the Spot workers took the trained state, not step 0
    left = [e for e in seen if e["event"] == "worker_left" and e["host"].startswith("127.71.2.")]
    assert len(left) == 1 and "cheaper slots are back" in left[0]["reason"]
    # Continuity, as the workers saw it: each round's members entered their training function at the step its
    # rank 0 held, with equal parameters, and every round went on from where the one before it stopped.
    entered: dict[int, list] = {}
    for e in job.of("entered"):
        entered.setdefault(e["round"], []).append(e)
    steps = []
    for r, members in sorted(entered.items()):
        assert len({(m["step"], m["checksum"]) for m in members}) == 1, (r, members)
        steps.append(members[0]["step"])
    by_round = {e["round"]: e for e in formed}
    assert all(steps[i] == by_round[r]["step"] for i, r in enumerate(sorted(entered)) if i), (steps, formed)
    assert steps == sorted(steps) and steps[-1] >= handover["step"]
    done = job.of("done")
    assert len(done) == 1 and done[0]["step"] >= 30


@pytest.mark.timeout(180)
def test_spot_between_min_np_and_np_at_start_up_starts_the_job_on_the_fallback_at_once(aws, jobs, tmp_path):
    make_group(aws.url, "st-spot", size=1, instance_type="g4dn.xlarge", cidr="10.72.1.0/24")
    make_group(aws.url, "st-od", size=0, instance_type="g4dn.xlarge", cidr="10.72.2.0/24")
    clients(aws.url)[0].update_auto_scaling_group(AutoScalingGroupName="st-od", MaxSize=1)
    events, stop = tmp_path / "events.jsonl", tmp_path / "stop"
    job = jobs([
        "run", "-np", "2", "--min-np", "1", "--discovery-interval", "0.3",
        "--start-timeout", "40", "--fallback-after", "40",  # the doc's ratio: --fallback-after = --start-timeout
        "--aws-asg", "st-spot", "--aws-asg", "st-od", "--aws-region", "us-east-1", "--aws-endpoint-url", aws.url,
        "--source", "st-spot:price=0.2", "--source", "st-od:fallback,price=1.5", "--manage-capacity",
        "--events-file", str(events),
        *[a for n in (1, 2) for a in ("--address-map", f"10.72.{n}.0/24=127.72.{n}.0/24")],
        *probe_cmd("--steps", "20", "--step-sleep", "0.1", "--stop-when", str(stop)),
    ])
    job.wait_event("commit", rank=0, step=5, size=2, timeout=60)
    first = next(e for e in _events(events) if e["event"] == "round_formed")
    assert first["size"] == 2 and {h.split(".")[2] for h in first["ranks"]} == {"1", "2"}  # Spot and fallback
    assert "before the job's first round (it cannot start with fewer)" in job.output()
    job.wait_event("commit", rank=0, step=60, timeout=60)  # past --fallback-after: the fallback worker trains on
    assert job.of("commit", rank=0)[-1]["size"] == 2 and desired(aws, "st-od") == 1
    stop.touch()
    assert job.finish() == 0, job.output()
    assert [e for e in _events(events) if e["event"] == "rollback"] == []
