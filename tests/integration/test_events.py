"""The events file of real jobs: each kind's fields checked against what the workers did.

Three runs: a worker killed with SIGKILL (failure, rollback, smaller round), a
host added and removed by discovery (scale-up, scale-in), and a spot notice from a
fake instance metadata service (graceful drain) followed by a host the discovery
provider itself reports draining. ``checkpoint_saved`` / ``checkpoint_loaded``
are checked by test_durable.py, the adoption kinds by test_driver_adoption.py;
events_check.OWNERS says which test checks which kind, and fails a test that
stops checking what it owns.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import time

import pytest

from cloud_elastic.events import SCHEMA
from tests.emulator.fake_metadata import FakeAWSMetadata, per_host
from tests.integration.events_check import OWNERS, of, only, read_events
from tests.integration.harness import HostsFile, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


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
    # A gradient allreduce may complete on one survivor and fail on the other as the victim dies mid-way:
    # their commits then differ by one step, and the round continues from the newer (its holder is rank 0
    # and syncs the other; seen once in a loaded fresh-clone run).
    resets = job.of("reset")
    steps = {r["step"] for r in resets}
    assert {r["size"] for r in resets} == {2} and max(steps) - min(steps) <= 1, resets
    rollback = only(events, "rollback")
    assert rollback["round"] == 1 and rollback["commit_step"] == max(steps)
    assert rollback["steps_lost"] == max(r["executed"] - r["step"] for r in resets)
    assert (second["round"], second["size"], second["step"]) == (2, 2, max(steps))
    done = job.of("done")
    assert len({e["checksum"] for e in done}) == 1 and {e["step"] for e in done} == {40}, done
    assert second["ranks"] == {"127.0.0.1": [0, 1]}
    assert failed["ts"] <= rollback["ts"] <= second["ts"]

    finished = only(events, "job_finished")
    assert (finished["outcome"], finished["exit_code"], finished["resets"]) == ("succeeded", 0, 1)
    assert 0 < finished["wall_s"] <= events[-1]["ts"] - events[0]["ts"] + 1
    assert "training completed on 2 worker(s)" in finished["reason"]


def test_scale_up_and_scale_in_by_discovery_are_recorded_as_hosts_changed_and_new_rounds(jobs, tmp_path):
    """A host added by discovery is admitted without a rollback, as the youngest worker; a host removed
    from discovery leaves at a commit after the missing-host grace, and the others go on without a
    rollback. (Once test_membership.py's scale-up and scale-in tests: their assertions are here.)"""
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
    # The newcomer took the last rank, received the state (following, by default, or in the sync), and
    # training went on from the step the members had committed: nobody rolled back.
    grown, shrunk = rounds[1], rounds[2]
    assert grown["ranks"] == {"127.0.0.1": [0], "127.0.0.2": [1], "127.0.0.3": [2]} and grown["synced"] is True
    assert [e["rank"] for e in job.of("hello") if e["worker"].startswith("127.0.0.3")] == [2]
    resumed = [r for r in job.of("reset") if r["size"] == 3 and not r["worker"].startswith("127.0.0.3")]
    assert {r["step"] for r in resumed} == {grown["step"]} and grown["step"] >= 5
    # (the newcomer's own count of executed steps starts after its sync, so its first reset is left out)
    assert all(r["executed"] == r["step"] for r in job.of("reset") if not r["worker"].startswith("127.0.0.3"))
    # The removed host's worker left at a commit; the others re-formed without a sync or a rollback.
    left = only(events, "worker_left")
    assert (left["host"], left["slot"], left["round"]) == ("127.0.0.2", 0, 2) and "left the group" in left["reason"]
    assert left["ts"] >= removed["ts"]
    assert "left the group" in job.output()
    assert not re.search(r"round \d+ aborted", job.output()), job.output()
    assert (shrunk["ranks"], shrunk["synced"]) == ({"127.0.0.1": [0], "127.0.0.3": [1]}, False)
    shrunk_resets = [r for r in job.of("reset") if r["size"] == 2]
    assert {r["worker"].split("[")[0] for r in shrunk_resets} == {"127.0.0.1", "127.0.0.3"}
    assert {r["step"] for r in shrunk_resets} == {shrunk["step"]}, shrunk_resets
    # (the newcomer's own count of executed steps starts after its sync, so only the old worker is compared)
    kept = [r for r in shrunk_resets if r["worker"].startswith("127.0.0.1")]
    assert kept and all(r["executed"] == r["step"] == shrunk["step"] for r in kept), kept
    assert of(events, "rollback") == [] and of(events, "worker_failed") == []
    assert only(events, "job_finished")["resets"] == 2
    # Both finished at the same step with the same parameters, the newcomer too: it holds the whole state.
    done = job.of("done")
    assert sorted(e["worker"].split("[")[0] for e in done) == ["127.0.0.1", "127.0.0.3"], job.output()
    assert {e["size"] for e in done} == {2} and len({e["checksum"] for e in done}) == 1
    assert len({e["step"] for e in done}) == 1 and done[0]["step"] >= 60
    # The removed worker's exit is not what made the job succeed: two workers finished.
    assert "training completed on 2 worker(s)" in job.lines[-1]


@pytest.mark.timeout(180)
def test_a_spot_notice_and_a_host_the_provider_reports_draining_are_recorded_as_graceful_leaves(jobs, tmp_path):
    """Two drains, one after the other: a spot notice from 127.0.0.2's fake instance metadata service (a
    ``notice`` with its deadline), then 127.0.0.3 reported draining by the discovery provider itself (a
    ``hosts_changed`` with the provider's reason and deadline, as a cloud group's own state or AWS queue mode
    gives it). The example ``hostsfile`` plugin (examples/plugin, installed by ./dev) stands in for a
    cloud: a discovery script cannot say "draining". Each worker leaves at a commit, saying why; the
    others go on without a rollback."""
    path, hosts = tmp_path / "events.jsonl", tmp_path / "hosts.json"

    def publish(document: dict) -> None:
        hosts.with_suffix(".tmp").write_text(json.dumps(document))
        hosts.with_suffix(".tmp").replace(hosts)

    publish({"ready": {"127.0.0.1": 2, "127.0.0.2": 1, "127.0.0.3": 1}})
    with per_host(FakeAWSMetadata, ["127.0.0.1", "127.0.0.2", "127.0.0.3"]) as fakes:
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{fakes['127.0.0.1'].port}",
               "AWS_EC2_METADATA_DISABLED": "false"}
        job = jobs(["run", "-np", "4", "--min-np", "1", "--provider", "hostsfile", "-o", f"path={hosts}",
                    "--discovery-interval", "0.2", "--notice-watcher", "aws", "--events-file", str(path),
                    *probe_cmd("--steps", "60", "--min-resets", "2")], env=env)
        job.wait_event("commit", rank=0, step=5)
        notice_deadline = time.time() + 120
        fakes["127.0.0.2"].set_spot_action("terminate", when=notice_deadline)
        job.wait_event("commit", rank=0, size=3)
        deadline = float(int(time.time()) + 300)
        publish({"ready": {"127.0.0.1": 2, "127.0.0.2": 1},
                 "draining": {"127.0.0.3": {"reason": "maintenance window", "deadline": deadline}}})
        assert job.finish() == 0, job.output()
    events = read_events(path)
    check_lifecycle(events, job)
    assert only(events, "job_started")["provider"] == "hostsfile"
    # A graceful leave each: no failure, no rollback, the others carry on from where they were.
    assert of(events, "worker_failed") == [] and of(events, "rollback") == []
    resets = job.of("reset")
    assert resets and all(r["executed"] == r["step"] for r in resets), resets
    left = {e["host"]: e for e in of(events, "worker_left")}
    assert sorted(left) == ["127.0.0.2", "127.0.0.3"], left
    start, after_notice, after_drain = of(events, "round_formed")
    assert (start["round"], start["size"]) == (1, 4)

    # The spot notice.
    notice = only(events, "notice")
    assert (notice["source"], notice["host"], notice["action"], notice["soft"]) == ("aws-imds", "127.0.0.2", "drain", False)
    assert abs(notice["deadline"] - notice_deadline) < 1.0 and "spot" in notice["reason"].lower()
    spot = left["127.0.0.2"]
    assert (spot["slot"], spot["round"]) == (0, 1) and "draining" in spot["reason"]
    assert notice["ts"] <= spot["ts"]
    assert (after_notice["round"], after_notice["size"]) == (2, 3)
    assert after_notice["ranks"] == {"127.0.0.1": [0, 1], "127.0.0.3": [2]}
    assert {r["step"] for r in resets if r["size"] == 3} == {after_notice["step"]}

    # The provider's drain.
    first = of(events, "hosts_changed")[0]
    assert first["added"] == [{"host": "127.0.0.1", "slots": 2}, {"host": "127.0.0.2", "slots": 1},
                              {"host": "127.0.0.3", "slots": 1}]
    [drained] = [h for h in of(events, "hosts_changed") if h["draining"]]
    assert drained["draining"] == [{"host": "127.0.0.3", "reason": "maintenance window", "deadline": deadline}]
    assert (drained["added"], drained["removed"], drained["missing"]) == ([], [], [])
    provider = left["127.0.0.3"]
    assert (provider["slot"], provider["round"]) == (0, 2)
    assert provider["reason"] == "host 127.0.0.3 is draining (maintenance window)" and provider["ts"] >= drained["ts"]
    assert (after_drain["round"], after_drain["size"], after_drain["ranks"], after_drain["synced"]) == (
        3, 2, {"127.0.0.1": [0, 1]}, False)
    assert {r["step"] for r in resets if r["size"] == 2} == {after_drain["step"]}
    assert only(events, "job_finished")["outcome"] == "succeeded"


def test_every_event_kind_has_an_integration_test_that_checks_it():
    """The table of owners (events_check.OWNERS) covers every kind of the schema, names only fields the
    schema has, and each owner is an integration test that exists. (That each owner really checks
    its kinds is enforced when it runs: tests/integration/conftest.py fails it otherwise.)"""
    owned = {facet.partition(".")[0] for facets in OWNERS.values() for facet in facets}
    assert sorted(set(SCHEMA) - owned) == [], "event kinds no integration test checks"
    assert sorted(owned - set(SCHEMA)) == [], "OWNERS names kinds the schema does not have"
    for facets in OWNERS.values():
        for facet in facets:
            kind, _, field = facet.partition(".")
            assert not field or field in {**SCHEMA[kind].required, **SCHEMA[kind].optional}, facet
    for owner in OWNERS:
        path, name = owner.split("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert callable(getattr(module, name, None)), f"{owner} does not exist"
        marks = module.pytestmark if isinstance(module.pytestmark, list) else [module.pytestmark]
        assert {"integration", "emulator"} & {m.name for m in marks}, f"{path} is not an integration or emulator test module"
