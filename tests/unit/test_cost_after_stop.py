"""A job's cost ends when shutdown has stopped its last worker, whoever asks later: a ``status`` answered while the
driver lowers the fallback groups it raised (seconds to a minute against a slow cloud API) charged the stopped
workers on at their old rate, and the final cost (``job_finished.cost``, the end line, the metric) came out higher
for a job someone watched with ``status`` than for the same job nobody watched (review h28: $0.048 against $0.014)."""

from __future__ import annotations

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.cost import CostMeter
from cloud_elastic.driver.job.status_reply import status_reply
from cloud_elastic.driver.runtime.costs import charge, final_cost, stop_meter
from cloud_elastic.status import StatusReply
from tests.unit.test_job_sourcing import Sourced

pytestmark = pytest.mark.timeout(30)

CONFIG = JobConfig(command=("python", "t.py"), num_proc=2, min_np=2, max_np=2)


def _shut_down(watched: bool) -> tuple[float, float | None]:
    """A job of two workers ($1.00/h and $1.20/h) run for an hour, then shut down as the driver does: its workers
    stopped, the meter stopped there, the raised groups lowered for 10 minutes (a status asked meanwhile when
    ``watched``), the last charge, the final cost. (final cost, the status's cost or None)."""
    sim = Sourced(2, progress_timeout_s=0)
    sim.groups(a=1, b=1, od=1)
    sim.join("a0[0]", "b0[0]")
    sim.advance(3600)
    stopped_at = sim.now
    stop_meter(sim.job, stopped_at)  # Driver._shutdown, once its processes are closed
    for slot in ("a0[0]", "b0[0]"):
        sim.exit(slot)
    seen = None
    if watched:
        reply = StatusReply.from_json(status_reply(sim.job, CONFIG, provider="aws", now=stopped_at + 600,
                                                   wall_now=stopped_at + 600, uptime_s=4200).to_json())
        seen = reply.cost
    charge(sim.job, stopped_at)
    return final_cost(sim.job, stopped_at).fields["cost"], seen


def test_a_status_asked_after_the_workers_stopped_does_not_raise_the_final_cost():
    unwatched, _ = _shut_down(watched=False)
    watched, seen = _shut_down(watched=True)
    assert unwatched == pytest.approx(2.2, rel=1e-3)  # an hour of $2.20/h
    assert watched == pytest.approx(unwatched) and seen == pytest.approx(unwatched)


def test_a_stopped_meter_charges_nothing_past_its_stop_but_up_to_it():
    meter = CostMeter()
    meter.advance(0.0, {"spot": (2, 3.0, 0)})
    meter.until = 1800.0
    meter.advance(7200.0, {"spot": (2, 3.0, 0)})
    assert meter.dollars == pytest.approx(1.5) and meter.slot_hours == pytest.approx(1.0)
