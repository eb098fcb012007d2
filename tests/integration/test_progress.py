"""The driver says what it waits for during a long wait, instead of staying silent."""

from __future__ import annotations

import json
import re

import pytest

from tests.integration.harness import HostsFile, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_waiting_for_np_slots_prints_progress_then_fails_at_the_start_timeout(jobs, tmp_path):
    hosts = HostsFile(tmp_path, ["127.0.0.1:1", "127.0.0.2:1"])
    events = tmp_path / "events.jsonl"
    job = jobs(["run", "-np", "3", "--host-discovery-script", str(hosts.script), "--discovery-interval", "0.2",
                "--start-timeout", "20", "--events-file", str(events), *probe_cmd()])
    job.wait_for(lambda j: any("waiting for -np 3 slot(s)" in line for line in j.lines), what="a progress line")
    # Still two slots, now on one host: the wait goes on, and the change is recorded.
    hosts.set(["127.0.0.1:2"])
    assert job.finish() == 1, job.output()
    progress = [m for line in job.lines
                if (m := re.search(r"waiting for -np 3 slot\(s\): 2 available \(waiting for (\d+)s\)", line))]
    assert progress, job.output()
    assert int(progress[0].group(1)) >= 15  # the first line comes after one progress interval
    assert job.lines[-1].endswith("only 2 slot(s) available after 20s; -np 3 needed to start")
    assert not any("launched worker" in line for line in job.lines)  # nothing started while it waited

    recorded = [json.loads(line) for line in events.read_text().splitlines()]
    changes = [e for e in recorded if e["event"] == "hosts_changed"]
    assert len(changes) == 2
    assert (changes[1]["added"], changes[1]["resized"]) == ([], [{"host": "127.0.0.1", "slots": 2}])
    assert (changes[1]["removed"], changes[1]["missing"]) == ([], ["127.0.0.2"])  # within --host-missing-grace
    assert [e["event"] for e in recorded if e["event"].startswith("worker")] == []
    finished = recorded[-1]
    assert (finished["event"], finished["outcome"], finished["exit_code"], finished["resets"]) == (
        "job_finished", "failed", 1, 0)
    assert finished["reason"] == "only 2 slot(s) available after 20s; -np 3 needed to start"
