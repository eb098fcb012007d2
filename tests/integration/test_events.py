"""The events file of real jobs: each kind's fields checked against what the workers did.

Three runs: a worker killed with SIGKILL (failure, rollback, smaller round), a
host added by discovery (scale-up), and a spot notice from a fake instance
metadata service (graceful drain). ``checkpoint_saved`` / ``checkpoint_loaded``
are covered where durable checkpoints are wired, not here.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from cloud_elastic.events import SCHEMA, validate
from tests.emulator.fake_metadata import FakeAWSMetadata, per_host
from tests.integration.harness import HostsFile, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def read_events(path: Path) -> list[dict]:
    """Every line of the events file, each checked against the schema it claims."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    for e in events:
        assert e["v"] == 1 and isinstance(e["ts"], float) and isinstance(e["job"], str)
        validate(e["event"], {k: v for k, v in e.items() if k not in ("v", "ts", "event", "job")})
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events), "events out of order"
    return events


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


def only(events: list[dict], kind: str) -> dict:
    found = of(events, kind)
    assert len(found) == 1, f"expected one {kind}, got {found}"
    return found[0]


def check_lifecycle(events: list[dict], job) -> None:
    """What every run shows: one job, started and finished; each worker started, then ready."""
    assert events[0]["event"] == "job_started" and events[-1]["event"] == "job_finished"
    assert {e["job"] for e in events} == {job.job_id()}
    started = {e["worker"]: e for e in of(events, "worker_started")}
    ready = {e["worker"]: e for e in of(events, "worker_ready")}
    hello = {e["worker"] for e in job.of("hello")}
    assert hello <= set(ready) <= set(started), (hello, ready, started)
    for worker, e in ready.items():
        host, slot = worker.split("[")[0], int(worker.split("[")[1].split("]")[0])
        assert (e["host"], e["slot"]) == (host, slot) == (started[worker]["host"], started[worker]["slot"])
        assert started[worker]["ts"] <= e["ts"]


def test_a_killed_worker_is_recorded_as_failure_rollback_and_smaller_round(jobs, tmp_path):
    path = tmp_path / "events.jsonl"
    job = jobs(["run", "-np", "3", "--min-np", "2", "-H", "127.0.0.1:2,127.0.0.2:1",
                "--blacklist-cooldown-range", "600", "600", "--events-file", str(path),
                *probe_cmd("--steps", "40")])
    victim = job.wait_event("hello", rank=2)
    job.wait_event("commit", rank=0, step=8)
    os.kill(victim["pid"], signal.SIGKILL)
    assert job.finish() == 0, job.output()
    events = read_events(path)
    check_lifecycle(events, job)

    started = only(events, "job_started")
    assert (started["num_proc"], started["min_np"], started["max_np"], started["provider"]) == (3, 2, 3, "static")
    assert started["command"][-2:] == ["--steps", "40"]
    hosts = of(events, "hosts_changed")[0]
    assert hosts["added"] == [{"host": "127.0.0.1", "slots": 2}, {"host": "127.0.0.2", "slots": 1}]
    assert hosts["removed"] == [] and hosts["draining"] == []

    first, second = of(events, "round_formed")
    assert (first["round"], first["size"], first["synced"], first["step"]) == (1, 3, True, None)
    assert first["ranks"] == {"127.0.0.1": [0, 1], "127.0.0.2": [2]}
    failed = only(events, "worker_failed")
    assert (failed["worker"], failed["host"], failed["slot"], failed["rank"], failed["round"]) == (
        victim["worker"], "127.0.0.2", 0, 2, 1)
    assert (failed["exit_code"], failed["signal"], failed["blacklisted_s"], failed["whole_host"]) == (
        None, "SIGKILL", 600.0, False)
    # The survivors went back to their last commit: the step they resumed from, and what they undid.
    resets = job.of("reset")
    assert {r["size"] for r in resets} == {2} and len({r["step"] for r in resets}) == 1
    rollback = only(events, "rollback")
    assert rollback["round"] == 1 and rollback["commit_step"] == resets[0]["step"]
    assert rollback["steps_lost"] == max(r["executed"] - r["step"] for r in resets)
    assert (second["round"], second["size"], second["step"]) == (2, 2, resets[0]["step"])
    assert second["ranks"] == {"127.0.0.1": [0, 1]}
    assert failed["ts"] <= rollback["ts"] <= second["ts"]

    finished = only(events, "job_finished")
    assert (finished["outcome"], finished["exit_code"], finished["resets"]) == ("succeeded", 0, 1)
    assert 0 < finished["wall_s"] <= events[-1]["ts"] - events[0]["ts"] + 1
    assert "training completed on 2 worker(s)" in finished["reason"]


def test_scale_up_and_scale_in_by_discovery_are_recorded_as_hosts_changed_and_new_rounds(jobs, tmp_path):
    path = tmp_path / "events.jsonl"
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    job = jobs(["run", "-np", "2", "--min-np", "1", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", "--host-missing-grace", "1", "--events-file", str(path),
                *probe_cmd("--steps", "60", "--min-resets", "2")])
    job.wait_event("commit", rank=0, step=5)
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    job.wait_event("commit", rank=0, size=3)
    hosts.set(["127.0.0.1", "127.0.0.3"])  # 127.0.0.2 is scaled in: it vanishes from the group
    assert job.finish() == 0, job.output()
    events = read_events(path)
    check_lifecycle(events, job)

    assert only(events, "job_started")["provider"] == "script"
    first, grew, missing, removed = of(events, "hosts_changed")
    assert first["added"] == [{"host": "127.0.0.1", "slots": 1}, {"host": "127.0.0.2", "slots": 1}]
    assert (grew["added"], grew["removed"], grew["draining"]) == ([{"host": "127.0.0.3", "slots": 1}], [], [])
    assert (missing["added"], missing["removed"], missing["missing"]) == ([], [], ["127.0.0.2"])
    assert [r["host"] for r in removed["removed"]] == ["127.0.0.2"]
    assert "--host-missing-grace" in removed["removed"][0]["reason"]
    # Not before the grace (1 s) was over. Events are stamped when the driver's loop writes them,
    # which can be a tick (50 ms) or a busy moment after the decision, hence the margin.
    assert removed["ts"] - missing["ts"] >= 0.7
    newcomer = [e for e in of(events, "worker_started") if e["host"] == "127.0.0.3"]
    assert len(newcomer) == 1 and newcomer[0]["ts"] >= grew["ts"]

    rounds = of(events, "round_formed")
    assert [(r["round"], r["size"]) for r in rounds] == [(1, 2), (2, 3), (3, 2)]
    # The newcomer took the last rank, state was broadcast to it, and training went on from the
    # step the members had committed: nobody rolled back.
    grown, shrunk = rounds[1], rounds[2]
    assert grown["ranks"] == {"127.0.0.1": [0], "127.0.0.2": [1], "127.0.0.3": [2]} and grown["synced"] is True
    resumed = [r for r in job.of("reset") if r["size"] == 3 and not r["worker"].startswith("127.0.0.3")]
    assert {r["step"] for r in resumed} == {grown["step"]} and grown["step"] >= 5
    # The removed host's worker left at a commit; the others re-formed without a sync or a rollback.
    left = only(events, "worker_left")
    assert (left["host"], left["slot"], left["round"]) == ("127.0.0.2", 0, 2) and "left the group" in left["reason"]
    assert left["ts"] >= removed["ts"]
    assert (shrunk["ranks"], shrunk["synced"]) == ({"127.0.0.1": [0], "127.0.0.3": [1]}, False)
    # (the newcomer's own count of executed steps starts after its sync, so only the old worker is compared)
    kept = [r for r in job.of("reset") if r["size"] == 2 and r["worker"].startswith("127.0.0.1")]
    assert kept and all(r["executed"] == r["step"] == shrunk["step"] for r in kept), kept
    assert of(events, "rollback") == [] and of(events, "worker_failed") == []
    assert only(events, "job_finished")["resets"] == 2


@pytest.mark.timeout(180)
def test_a_spot_notice_is_recorded_as_notice_drain_and_graceful_leave(jobs, tmp_path):
    path = tmp_path / "events.jsonl"
    with per_host(FakeAWSMetadata, ["127.0.0.1", "127.0.0.2"]) as fakes:
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{fakes['127.0.0.1'].port}",
               "AWS_EC2_METADATA_DISABLED": "false"}
        job = jobs(["run", "-np", "3", "--min-np", "1", "-H", "127.0.0.1:2,127.0.0.2:1", "--notice-watcher", "aws",
                    "--events-file", str(path), *probe_cmd("--steps", "60")], env=env)
        job.wait_event("commit", rank=0, step=5)
        deadline = time.time() + 120
        fakes["127.0.0.2"].set_spot_action("terminate", when=deadline)
        assert job.finish() == 0, job.output()
    events = read_events(path)
    check_lifecycle(events, job)

    notice = only(events, "notice")
    assert (notice["source"], notice["host"], notice["action"], notice["soft"]) == ("aws-imds", "127.0.0.2", "drain", False)
    assert abs(notice["deadline"] - deadline) < 1.0 and "spot" in notice["reason"].lower()
    left = only(events, "worker_left")
    assert (left["host"], left["slot"], left["round"]) == ("127.0.0.2", 0, 1) and "draining" in left["reason"]
    assert notice["ts"] <= left["ts"]
    # A graceful leave: no failure, no rollback, the others carry on from where they were.
    assert of(events, "worker_failed") == [] and of(events, "rollback") == []
    resets = job.of("reset")
    assert resets and all(r["executed"] == r["step"] for r in resets), resets
    shrunk = of(events, "round_formed")[-1]
    assert (shrunk["round"], shrunk["size"], shrunk["ranks"]) == (2, 2, {"127.0.0.1": [0, 1]})
    assert shrunk["step"] == resets[0]["step"]
    assert only(events, "job_finished")["outcome"] == "succeeded"


def test_every_event_kind_is_exercised_by_an_integration_test():
    """Guards the schema: a new kind must come with a run that shows it (or be named here as covered elsewhere)."""
    source = Path(__file__).read_text()
    # The durable-checkpoint tests own the checkpoint kinds, test_driver_adoption.py the adoption ones.
    elsewhere = {"checkpoint_saved", "checkpoint_loaded", "worker_adopted", "adoption_done"}
    missing = [k for k in SCHEMA if k not in elsewhere and f'"{k}"' not in source]
    assert missing == []
