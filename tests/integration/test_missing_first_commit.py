"""A host dropped from discovery with no notice before any commit, with ``-np 1``, end to end.

Found by review: once the replacement on the new host waited at rendezvous, the dropped host was removed (no commit,
so its worker held "nothing"), the replacement formed a round of its own from step 0 beside the member still
training, and nothing said the job started over. The member is the prospective holder of the first commit: its host
is kept (``driver/job/discovery_edge.py``), the replacement joins it at that commit and receives its state, and only
then does it leave.
"""

from __future__ import annotations

import pytest

from tests.integration.events_check import of, read_events
from tests.integration.harness import HostsFile, probe_cmd
from tests.integration.test_spares import entered

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_a_host_dropped_before_the_first_commit_hands_its_state_to_the_replacement_instead_of_starting_over(
        jobs, tmp_path):
    path, gate, stop = tmp_path / "events.jsonl", tmp_path / "gate", tmp_path / "stop"
    hosts = HostsFile(tmp_path, ["127.0.0.1:1"])
    job = jobs(["run", "-np", "1", "--host-discovery-script", str(hosts.script), "--discovery-interval", "0.2",
                "--host-missing-grace", "0.5", "--events-file", str(path),
                *probe_cmd("--steps", "20", "--commit-every", "10", "--start-when", str(gate), "--stop-when",
                           str(stop), "--entry-events")])
    [member] = entered(job, 1, 1)  # in round 1, held at the gate: no commit yet
    hosts.set(["127.0.0.2:1"])  # 127.0.0.1 leaves the group without a notice; a replacement starts on 127.0.0.2
    job.wait_for(lambda j: any("new worker ready" in line for line in j.lines), 60, "the replacement waiting")
    gate.touch()
    formed = job.wait_for(lambda j: next((line for line in j.lines if "round 2 formed" in line), None), 60, "round 2")
    assert "round 2 formed with 2 worker(s)" in formed, job.output()  # not the replacement alone, from step 0
    after = entered(job, 2, 2)
    job.wait_for(lambda j: next((line for line in j.lines if "round 3 formed" in line), None), 60, "round 3")
    stop.touch()
    assert job.finish(timeout=60) == 0, job.output()
    # Round 2 continues from the member's first commit, the same parameters on both; round 3 is the replacement.
    assert {e["worker"].split("[")[0] for e in after} == {"127.0.0.1", "127.0.0.2"}, after
    assert len({(e["step"], e["checksum"]) for e in after}) == 1 and after[0]["step"] == 10, after
    rounds = of(read_events(path), "round_formed")
    assert [f["size"] for f in rounds] == [1, 2, 1] and all(f["step"] for f in rounds[1:]), rounds
    assert member["worker"] in rounds[1]["workers"], (member, rounds)
