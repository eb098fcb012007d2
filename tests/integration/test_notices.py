"""Spot and preemption notices read from instance metadata on the worker hosts, end to end.

Three loopback "hosts" (127.0.0.1-3), each with its own fake metadata service on
one shared port (``{host}`` in the endpoint override), real worker processes, and
a commit every 5 steps so a rollback would be visible as steps executed twice.
"""

from __future__ import annotations

import time

import pytest

from tests.emulator.fake_metadata import FakeAWSMetadata, FakeAzureMetadata, FakeGCPMetadata, per_host
from tests.integration.harness import HostsFile, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
LEAVING = "127.0.0.3"
COMMIT_EVERY = 5


def _env(cloud: str, port: int) -> dict[str, str]:
    return {
        "aws": {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{port}", "AWS_EC2_METADATA_DISABLED": "false"},
        "gcp": {"GCE_METADATA_HOST": f"{{host}}:{port}"},
        "azure": {"CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT": f"http://{{host}}:{port}"},
    }[cloud]


def _job(jobs, tmp_path, cloud: str, port: int, *probe: str, extra: tuple[str, ...] = ()):
    hosts = HostsFile(tmp_path, HOSTS)
    return jobs(
        ["run", "-np", "3", "--min-np", "1", "--host-discovery-script", str(hosts.script),
         "--notice-watcher", cloud, "--discovery-interval", "0.3", *extra, *probe_cmd(*probe)],
        env=_env(cloud, port),
    )


def _assert_left_gracefully(job) -> None:
    """The leaving host's worker left at a commit; the others went on at two without rolling back."""
    resets = job.of("reset")
    assert resets and all(r["size"] == 2 for r in resets), resets
    assert all(r["executed"] == r["step"] for r in resets), f"survivors rolled back: {resets}"
    assert all(r["step"] % COMMIT_EVERY == 0 for r in resets), resets  # they left exactly at a commit
    done = job.of("done")
    assert len(done) == 2 and len({e["checksum"] for e in done}) == 1, job.output()
    assert "round 1 aborted" not in job.output()
    assert "training completed on 2 worker(s)" in job.lines[-1]
    # The leaver exited by itself; it did not hang until the driver gave up on it.
    assert not any("stopped answering heartbeats" in line or "did not exit in time" in line for line in job.lines), \
        job.output()


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_notice_on_one_host_drains_it_at_the_next_commit_with_zero_rollback(jobs, tmp_path, cloud):
    factory = {"aws": FakeAWSMetadata, "gcp": FakeGCPMetadata, "azure": FakeAzureMetadata}[cloud]
    with per_host(factory, HOSTS) as fakes:
        port = fakes[HOSTS[0]].port
        # --min-resets 1: the job trains on (committing every 5 steps) until the drain has happened.
        job = _job(jobs, tmp_path, cloud, port, "--steps", "30", "--commit-every", str(COMMIT_EVERY),
                   "--min-resets", "1")
        job.wait_event("commit", rank=0, step=10)
        fake = fakes[LEAVING]
        if cloud == "aws":
            fake.set_spot_action("terminate", time.time() + 120)
        elif cloud == "gcp":
            fake.set_preempted(True)
        else:
            event_id = fake.add_event("Preempt", not_before=time.time() + 60)
        assert job.finish(timeout=120) == 0, job.output()
        _assert_left_gracefully(job)
        assert f"notice from" in job.output() and f"for host {LEAVING}" in job.output()
        if cloud == "azure":
            # Acknowledged once the host's worker had left, so Azure may go ahead at once.
            assert fake.wait_for(lambda: fake.acks == [event_id], timeout=10), fake.acks
        for host in HOSTS[:2]:  # the other hosts' watchers saw nothing
            assert "notice" not in " ".join(
                line for line in job.lines if f"for host {host}" in line and "notice from" in line)


def test_a_deadline_before_the_next_commit_removes_the_host_by_force_and_survivors_roll_back(jobs, tmp_path):
    with per_host(FakeAWSMetadata, HOSTS) as fakes:
        port = fakes[HOSTS[0]].port
        # A commit every 20 steps, and the leaver stuck inside step 22 (so is its round): the notice's
        # deadline comes before its next commit.
        job = _job(jobs, tmp_path, "aws", port, "--steps", "40", "--commit-every", "20", "--block-at-step", "22",
                   "--only-slot", LEAVING)
        job.wait_event("commit", rank=0, step=20, timeout=120)
        # The driver acts 5 s before, but no sooner than 5 s after the notice reached it.
        fakes[LEAVING].set_spot_action("terminate", time.time() + 7)
        assert job.finish(timeout=120) == 0, job.output()
    out = job.output()
    assert "removed by force" in out, out
    resets = job.of("reset")
    assert resets and all(r["size"] == 2 for r in resets)
    assert any(r["executed"] > r["step"] for r in resets)  # rolled back to the commit at step 20
    assert all(r["step"] == 20 for r in resets)
    done = job.of("done")
    assert len(done) == 2 and {e["step"] for e in done} == {40} and len({e["checksum"] for e in done}) == 1
    # A drained host is not blacklisted: it did nothing wrong.
    assert "blacklisted" not in " ".join(line for line in job.lines if LEAVING in line)


def test_malformed_metadata_answers_leave_the_job_unharmed_and_one_watcher_runs_per_host(jobs, tmp_path):
    """Faults on one host's metadata service change nothing; a host with two slots runs one watcher."""
    stop = tmp_path / "stop"
    with per_host(FakeAWSMetadata, HOSTS) as fakes:
        files = HostsFile(tmp_path, ["127.0.0.1:2", *HOSTS[1:]])
        job = jobs(["run", "-np", "4", "--min-np", "1", "--host-discovery-script", str(files.script),
                    "--notice-watcher", "aws", "--discovery-interval", "0.3",
                    *probe_cmd("--steps", "5", "--stop-when", str(stop))], env=_env("aws", fakes[HOSTS[0]].port))
        job.wait_event("commit", rank=0, step=5)
        fake = fakes[LEAVING]
        path = "/latest/meta-data/spot/instance-action"
        served = fake.count(path)
        fake.fault(path, times=3, status=200, body=b"{not json")
        fake.fault(path, times=3, status=500)
        fake.fault(path, times=1, hang_s=8)
        fake.set_raw_spot_action(b'{"action": "terminate"}')  # no time: not a notice this watcher can trust
        # The 7 faults, then at least one read of the untrustworthy notice, all while the job trains.
        assert fake.wait_for(lambda: fake.count(path) >= served + 8, timeout=60), fake.count(path) - served
        # Meanwhile the healthy hosts were watched for a few seconds: time enough for a second watcher to show up.
        for host in HOSTS[:2]:
            assert fakes[host].wait_for(lambda f=fakes[host]: f.count(path) >= 4, timeout=90), job.output()
        assert job.proc.poll() is None, job.output()
        stop.touch()
        assert job.finish(timeout=120) == 0, job.output()
    assert job.of("reset") == []  # nobody left, nobody was lost
    assert len(job.of("done")) == 4
    # Each watcher takes its own IMDSv2 token (valid for 6 h) as it starts and reads with it: one token read with,
    # one watcher. (Not the tokens handed out: a clean-clone run under load took two on the two-slot host, a token
    # request past its 2 s bound being asked again, it seems; its output was not kept.)
    used = [len(fakes[h].used_tokens) for h in HOSTS[:2]]
    assert used == [1, 1], (used, [fakes[h].count("/latest/api/token", "PUT") for h in HOSTS[:2]], job.output())
