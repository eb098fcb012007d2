"""The job's cost as it runs and at its end: the meter's tick, the ``job_finished`` fields and the line printed.

Only for a job with several host sources (see :mod:`cloud_elastic.driver.job.sourcing`);
read under the driver's lock. The driver calls :func:`charge` at every tick, so the
meter and its ``cost`` events go on while nothing is launched (a fixed-size job's round,
a finishing job), and :func:`final_cost` with the time its workers had all stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cloud_elastic.cost import format_dollars
from cloud_elastic.driver.job.elastic_job import ElasticJob

__all__ = ["FinalCost", "final_cost", "charge"]


@dataclass(frozen=True)
class FinalCost:
    """``fields`` for ``job_finished``; ``line`` for the log (None: the job has no priced sources)."""

    fields: dict[str, Any] = field(default_factory=dict)
    line: str | None = None


def charge(job: ElasticJob, now: float) -> None:
    """Move the job's cost meter to ``now`` (a ``cost`` event when one is due)."""
    if job.capacity.sourcing is not None:
        job.capacity.sourcing.charge(now)


def stop_meter(job: ElasticJob, at: float) -> None:
    """Charge the job's cost meter up to ``at``, when shutdown had stopped the last worker, and nothing past it: a
    ``status`` asked while the raised groups are lowered afterwards would charge the stopped workers on."""
    if job.capacity.sourcing is not None:
        job.capacity.sourcing.charge(at)
        job.capacity.sourcing.cost.until = at


def final_cost(job: ElasticJob, now: float) -> FinalCost:
    """What the job cost, charged up to ``now``, and what the same slot-hours would have cost on the fallback."""
    sourcing = job.capacity.sourcing
    if sourcing is None:
        return FinalCost()
    s = sourcing.summary(now)
    per = sourcing.per_commit(s)  # commits (state.commit() calls): the optimizer steps are not known
    per_step = per.value
    fields = {"cost": round(s.dollars, 6), "cost_fallback_only": None if s.fallback_only is None
              else round(s.fallback_only, 6), "slot_hours": round(s.slot_hours, 6),
              "unpriced_slot_hours": round(s.unpriced_slot_hours, 6), "idle_slot_hours": round(s.idle_slot_hours, 6),
              "cost_per_step": None if per_step is None else round(per_step, 8)}
    line = f"job {job.job_id}: cost {format_dollars(s.dollars)} for {s.slot_hours:.3f} slot-hour(s)"
    if per_step is not None:
        line += f", {format_dollars(per_step)} per commit ({per.commits} commit(s)"
        if per.carried:
            line += f" for this driver's {format_dollars(per.dollars)}, not the cost carried from before it"
        line += ")"
    if round(s.idle_slot_hours, 3) > 0:
        line += (f"; {s.idle_slot_hours:.3f} of the slot-hour(s) were on hosts of a fallback group the job raised "
                 "that ran no worker there")
    if s.unpriced_slot_hours > 0:
        line += f"; {s.unpriced_slot_hours:.3f} slot-hour(s) had no known price and are not in it"
    if s.fallback_only is not None:
        priced = "priced " if s.unpriced_slot_hours > 0 else ""
        line += f"; the same {priced}slot-hours on the fallback alone: {format_dollars(s.fallback_only)}"
    if s.by_source:
        line += " (" + ", ".join(f"{k or '?'} {format_dollars(v)}" for k, v in sorted(s.by_source.items())) + ")"
    return FinalCost(fields, line)
