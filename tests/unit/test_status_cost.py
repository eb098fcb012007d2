"""`cloud-elastic status` of a job with several host sources: each host's source and price, and the cost line."""

from __future__ import annotations

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.status_reply import status_reply
from cloud_elastic.status import StatusReply, render_status
from tests.unit.test_job_sourcing import Sourced

pytestmark = pytest.mark.timeout(30)  # the first test of a run may import torch (conftest)


def test_status_shows_each_hosts_source_and_price_and_what_the_job_has_cost():
    sim = Sourced(2, progress_timeout_s=0)
    sim.groups(a=1, b=1, od=1)
    sim.join("a0[0]", "b0[0]")
    sim.advance(360)
    config = JobConfig(command=("python", "t.py"), num_proc=2, min_np=2, max_np=2)
    reply = status_reply(sim.job, config, provider="aws", now=sim.now, wall_now=sim.now, uptime_s=360)
    reply = StatusReply.from_json(reply.to_json())  # as it comes over the wire
    text = render_status(reply, now=sim.now)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:2] in ("a0", "b0", "od")}
    assert rows["a0"][3:5] == ["spot-a", "1"] and rows["b0"][3:5] == ["spot-b", "1.2"]
    assert rows["od0"][3:6] == ["od", "4", "-"]  # a fallback host no worker uses
    assert "cost $0.22 so far, $2.20/h now" in text
    assert "on the fallback alone: $0.80" in text


def test_status_says_what_slot_hours_had_no_known_price_instead_of_calling_them_free():
    """Multi-source review: slots with no known price (no DescribeSpotPriceHistory permission) showed as "cost
    $0.00 so far" with nothing more; the end line alone said they were not in it."""
    from cloud_elastic.providers.sources import SourceSpec
    from cloud_elastic.providers.api import DiscoveredHosts
    from tests.unit.test_job_sourcing import OD

    sim = Sourced(2, sources=(SourceSpec("spot-a", "aws"), OD), progress_timeout_s=0)  # spot-a's price unknown
    sim.job.discovered(DiscoveredHosts(ready={"a0": 1, "a1": 1}, sources={"a0": "spot-a", "a1": "spot-a"}),
                       sim.now)
    sim._collect()
    sim.join(*sim.slots_launched())
    sim.advance(360)
    config = JobConfig(command=("python", "t.py"), num_proc=2, min_np=2, max_np=2)
    reply = StatusReply.from_json(status_reply(sim.job, config, provider="aws", now=sim.now, wall_now=sim.now,
                                               uptime_s=360).to_json())
    assert reply.cost_unpriced_slot_hours == pytest.approx(0.2)
    assert "cost $0.00 so far, $0.00/h now (0.2 slot-hour(s) with no known price not in it)" in render_status(
        reply, now=sim.now)


def test_a_worker_that_connected_and_sets_up_is_told_apart_from_one_still_starting():
    """A worker joining a running job runs its script up to its first hvd.rank() before it joins (worker.context):
    for up to --start-timeout, which `status` must not show as a launch that hangs."""
    from tests.unit.test_job import Sim

    sim = Sim(2, max_np=3)
    sim.start({"a": 2})
    sim.discover({"a": 2, "b": 1})
    assert sim.job.registered(sim.id("b[0]"), sim.now)  # connected, its set-up runs: not at rendezvous yet
    config = JobConfig(command=("python", "t.py"), num_proc=2, min_np=2, max_np=3)
    reply = StatusReply.from_json(status_reply(sim.job, config, provider="static", now=sim.now, wall_now=sim.now,
                                               uptime_s=10).to_json())
    assert "[0] setting up" in render_status(reply, now=sim.now)


def test_status_says_how_many_of_the_slot_hours_were_free_slots_of_the_fallback_hosts_the_job_raised():
    """fixI: the dollars of ``status`` held the idle raised hosts (driver.job.paid), but neither its JSON nor its
    line said so, as the end line and the events do."""
    from tests.unit.test_raised_idle_cost import started_with_idle_fallback_hosts

    sim = started_with_idle_fallback_hosts()
    sim.advance(360)  # od1 and od2 idle for a tenth of an hour, 6 slots in all
    config = JobConfig(command=("python", "t.py"), num_proc=4, min_np=2, max_np=4)
    reply = StatusReply.from_json(status_reply(sim.job, config, provider="aws", now=sim.now, wall_now=sim.now,
                                               uptime_s=360).to_json())
    assert reply.cost_slot_hours == pytest.approx(0.6, rel=1e-3)
    assert reply.cost_idle_slot_hours == pytest.approx(0.2, rel=1e-3)
    assert "cost $1.50 so far, $15.00/h now; 0.2 of its 0.6 slot-hour(s) on hosts of a fallback group the job " \
           "raised that ran no worker there" in render_status(reply, now=sim.now)
