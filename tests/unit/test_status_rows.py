"""``cloud-elastic status`` of a job of thousands of hosts: a bounded reply that says what it left out.

Every discovered host was a row (16,384 at most: 1.6 MB of JSON for the status command to print), and the worker
rows past 256 were cut without a word, in no particular order."""

from __future__ import annotations

import json

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.status_reply import MAX_ROWS, MAX_WORKER_ROWS, status_reply
from cloud_elastic.providers.api import MAX_HOSTS
from cloud_elastic.status import StatusReply, render_status
from tests.unit.test_job import started

pytestmark = pytest.mark.timeout(60)


def _status(sim, np: int) -> StatusReply:
    config = JobConfig(command=("python", "t.py"), num_proc=np, min_np=np, max_np=np)
    wire = status_reply(sim.job, config, provider="static", now=sim.now, wall_now=sim.now, uptime_s=60).to_json()
    assert len(json.dumps(wire)) < 200_000
    return StatusReply.from_json(json.loads(json.dumps(wire)))  # as it comes over the wire


def test_the_largest_discovery_is_answered_with_the_hosts_that_have_workers_first_and_a_count_of_the_rest():
    sim = started(2, {"a": 1, "b": 1})
    sim.discover({"a": 1, "b": 1, **{f"h{i}": 1 for i in range(MAX_HOSTS - 2)}})
    reply = _status(sim, 2)
    assert len(reply.hosts) == MAX_ROWS and reply.hosts_omitted == MAX_HOSTS - MAX_ROWS
    assert [h.host for h in reply.hosts[:2]] == ["a", "b"] and all(h.workers for h in reply.hosts[:2])
    text = render_status(reply, now=sim.now)
    assert f"... and {MAX_HOSTS - MAX_ROWS} more hosts, not listed" in text
    assert "worker" not in text.split("not listed", 1)[1]  # no worker was left out


def test_past_the_worker_rows_the_rounds_members_are_listed_by_rank_and_the_rest_counted():
    np = MAX_WORKER_ROWS + 4
    sim = started(np, {"a": np})
    reply = _status(sim, np)
    ranks = [w.rank for h in reply.hosts for w in h.workers]
    assert sorted(ranks) == list(range(MAX_WORKER_ROWS)) and reply.workers_omitted == 4
    assert "... and 4 more workers, not listed" in render_status(reply, now=sim.now)


def test_a_host_whose_workers_are_all_past_the_worker_rows_is_not_shown_idle():
    # Review s63 rvX F6: 300 one-slot hosts; the 44 hosts of the workers past the 256 rows were listed with "-"
    # among the idle ready hosts, although each ran a worker of the round.
    np = MAX_WORKER_ROWS + 44
    sim = started(np, {f"h{i:03d}": 1 for i in range(np)})
    reply = _status(sim, np)
    assert reply.workers_omitted == 44 and len(reply.hosts) == np
    cut = [h for h in reply.hosts if not h.workers]
    assert len(cut) == 44 and all(h.workers_unlisted == 1 for h in cut)
    text = render_status(reply, now=sim.now)
    rows = [line for line in text.splitlines() if line.startswith("h")]
    assert len(rows) == np and not [r for r in rows if r.rstrip().endswith("-")], rows
    assert sum("1 worker(s) not listed" in r for r in rows) == 44
