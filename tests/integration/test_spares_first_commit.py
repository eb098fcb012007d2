"""A spot notice before the driver has heard of any commit, with ``-np 1 --spares 1``, end to end.

Found by review: the noticed member was sent away at once, the spare formed a round of its own from
step 0 beside it (two rounds training at the same time), the member's work up to the commit it left
at was thrown away, and the driver logged "0 steps lost". The member is the prospective holder of the
first commit: it trains on, the spare joins next to it at its next commit and receives that state,
and only then does it leave (see ``driver/job/leaving.py:Leavers.mark``).
"""

from __future__ import annotations

import time

import pytest

from tests.emulator.fake_metadata import FakeAWSMetadata, per_host
from tests.integration.events_check import of, read_events
from tests.integration.harness import HostsFile, probe_cmd
from tests.integration.test_spares import entered, host_of, spares_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HOSTS = [f"127.0.0.{i}" for i in range(1, 4)]


def test_a_notice_before_the_first_commit_hands_the_members_state_to_the_spare_instead_of_starting_over(
        jobs, tmp_path):
    path, stop = tmp_path / "events.jsonl", tmp_path / "stop"
    script = HostsFile(tmp_path, [f"{h}:1" for h in HOSTS]).script
    args = ["run", "-np", "1", "--min-np", "1", "--spares", "1", "--host-discovery-script", str(script),
            "--discovery-interval", "0.3", "--notice-watcher", "aws", "--events-file", str(path),
            *probe_cmd("--steps", "20", "--stop-when", str(stop), "--entry-events", "--commit-every", "10")]
    with per_host(FakeAWSMetadata, HOSTS) as fakes:
        endpoint = f"http://{{host}}:{fakes[HOSTS[0]].port}"  # each worker's host serves its own metadata
        job = jobs(args, env={"AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint, "AWS_EC2_METADATA_DISABLED": "false"})
        [spare] = spares_ready(job)
        member = job.wait_event("entered", rank=0)
        fakes[host_of(member["worker"])].set_spot_action("terminate", time.time() + 90)  # before its first commit
        formed = job.wait_for(lambda j: next((line for line in j.lines if "round 2 formed" in line), None), 60,
                              "round 2")
        assert "round 2 formed with 2 worker(s)" in formed, job.output()  # not the spare alone, from step 0
        after = entered(job, 2, 2)
        stop.touch()
        assert job.finish(timeout=60) == 0, job.output()
    # Round 2 has the member and the spare at the member's first commit, the same parameters on both.
    assert {e["worker"] for e in after} == {member["worker"], spare}, after
    assert len({(e["step"], e["checksum"]) for e in after}) == 1 and after[0]["step"] > 0, after
    rounds = of(read_events(path), "round_formed")
    assert [f["size"] for f in rounds[:2]] == [1, 2] and all(f["step"] is not None for f in rounds[1:]), rounds
    # The drained host's release line: the member left at a commit with 0 steps lost once the spare continued from
    # it, or (slow machine: the job was stopped before the member's next commit) it ran to the end with the job.
    assert ("its workers left at a commit; 0 steps lost" in job.output()
            or "its 1 worker(s) ran to the end of the script with the job, which completed" in job.output()), job.output()
