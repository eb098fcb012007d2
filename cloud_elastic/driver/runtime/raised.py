"""The host groups ``--manage-capacity`` raised: carried across a driver crash, set back to 0 when the job ends;
and the job's cost so far, carried across a driver crash the same way.

A fallback group the job raised is paid for as long as its instances run. The job's core sets it back to 0 once no
fallback slot is wanted (``driver.job.sourcing``); two ends of a driver's life are the runtime's:

* **The job ends** with a group still raised: once every worker has stopped, :func:`lower` sets each such group
  back to 0, tries a failed call again a few times, and says in one line which group stays raised if the cloud
  keeps refusing. A ``capacity`` event (reason "the job is over") records each change.
* **The driver crashes**: its sign of life beside the checkpoints (``checkpoint.alive``, refreshed every 5 s,
  and at once when a group is raised) carries what it raised (:func:`remember`: a raise its provider sent or
  took over, not one held back or skipped, an operator's group, until the cloud has taken its 0; a raise call
  is written there before it is sent, :func:`write_ahead`), and the driver restarted for the job takes it over
  (:func:`inherit`): it sets those groups back to 0 by the same rule. It takes them over only once it runs the job:
  while it waits out its predecessor's workers (which may still train on those
  groups) it only carries them in its own sign of life (:func:`carried`), so a
  driver stopped in that wait lowers nothing and leaves them to the next one.
  Without ``--checkpoint-dir`` there is no such record, and a crashed driver's
  raised group stays as it was.

The sign of life also carries what the job has cost so far (``cloud_elastic.cost``),
which the driver that takes the job over goes on from (:func:`inherit_cost`), and a
driver stopped before it does carries forward (:func:`remember`), as for raised groups.

Each of those two parts of the sign of life is read alone: one out of bounds (a bug, a hand edit) is refused in one
WARNING naming the file (:func:`carried`, :func:`carried_cost`), and the other is still taken over. A group refused is
set back by no driver: which groups the job raised is not known for sure, and the line asks the operator to.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from cloud_elastic.cost import CostSoFar, format_dollars

__all__ = ["carried", "carried_cost", "discovered", "inherit", "inherit_cost", "remember", "share", "lower",
           "write_ahead", "LOWER_TRIES"]

log = logging.getLogger(__name__)

#: Calls made to set a group back to 0 at the end of the job, a second apart, before giving up on it.
LOWER_TRIES = 3


def _sourcing(job: Any) -> Any:
    sourcing = job.capacity.sourcing
    return sourcing if sourcing is not None and sourcing.active else None


def carried(previous_alive: Any) -> dict[str, int]:
    """What a crashed predecessor raised (``StartPlan.previous_alive``), not yet taken over. Where its sign of life
    said groups this driver refused (``DriverAlive.refused``: not a mapping, or a capacity out of bounds), one
    WARNING names the file: those groups stay as they are, for the operator to set back to 0."""
    for why in _refused(previous_alive, "raised"):
        log.warning("job %s: which host groups the previous driver raised is refused: %s; each such group stays at "
                    "the desired capacity it had (paid for): set it to 0 yourself once nothing needs it",
                    previous_alive.job_id, why)
    return dict(getattr(previous_alive, "raised", ()) or ())


def carried_cost(previous_alive: Any) -> CostSoFar | None:
    """What the job had cost under a crashed predecessor, up to its last sign of life; not yet taken over. A cost
    its sign of life gave out of bounds (``DriverAlive.refused``) is said in one WARNING, and none is carried."""
    for why in _refused(previous_alive, "cost"):
        log.warning("job %s: the previous driver's cost so far is refused: %s; the job's cost is counted again from "
                    "$0 by this driver", previous_alive.job_id, why)
    return getattr(previous_alive, "cost", None)


def _refused(previous_alive: Any, part: str) -> list[str]:
    return [why for name, why in getattr(previous_alive, "refused", ()) if name == part]


def inherit(job: Any, raised: dict[str, int]) -> None:
    """Take over the groups a crashed predecessor raised, once this driver runs the job (with the job's lock)."""
    if not raised:
        return
    sourcing = _sourcing(job)
    if sourcing is None:
        log.warning("job %s: the previous driver raised host source(s) %s, which this command does not manage: "
                    "they are left as they are", job.job_id, ", ".join(f"{n!r} to {h}" for n, h in raised.items()))
        return
    sourcing.inherit(raised)


def inherit_cost(job: Any, cost: CostSoFar | None, previous_alive: Any) -> None:
    """Go on from what the job cost under a crashed predecessor, once this driver runs the job (with the job's
    lock), and say so in one line.

    The predecessor's figures are those of its last sign of life (``previous_alive.alive``, refreshed every
    5 s): the time from then until this driver takes the job over is metered by no driver, and is not in the
    job's cost (its workers may have trained on through it, for up to their ``--driver-grace``).
    """
    if cost is None:
        return
    sourcing = _sourcing(job)
    if sourcing is None:
        log.info("job %s: the previous driver's cost so far (%s) is not reported: this command has a single host "
                 "source", job.job_id, format_dollars(cost.dollars))
        return
    sourcing.carry_cost(cost)
    alive = previous_alive.alive
    idle = (f" ({cost.idle_slot_hours:.3f} of them on hosts of a fallback group the job raised that ran no worker "
            "there)") if round(cost.idle_slot_hours, 3) > 0 else ""
    log.info("job %s: cost so far carried from the previous driver: %s for %.3f slot-hour(s)%s, up to its last "
             "sign of life at %s (%.0fs ago; the time since is not counted)", job.job_id,
             format_dollars(cost.dollars), cost.slot_hours, idle,
             time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(alive)), max(0.0, time.time() - alive))


def remember(job: Any, refresher: Any, carry: dict[str, int], carry_cost: CostSoFar | None = None) -> None:
    """Have the sign of life say what the job has raised now and what it has cost so far, with what it carries
    for a predecessor not yet taken over (with the job's lock; the driver calls it at each tick)."""
    sourcing = _sourcing(job)
    if refresher is not None:
        # Only the groups the job set: a raise held back or skipped (an operator's group) would get a 0 from the
        # driver restarted after a crash; each until the cloud has taken its 0 (a 0 asked may be throttled).
        refresher.set_raised({**carry, **(sourcing.raised(sent=True) if sourcing is not None else {})})
        own = sourcing.cost.so_far() if sourcing is not None else None
        if carry_cost is not None:
            own = carry_cost if own is None else carry_cost.plus(own)
        refresher.set_cost(own)


def write_ahead(discovery: Any, refresher: Any) -> None:
    """Have each raise of a group recorded in the sign of life before its call is sent (``discovery.on_raise``,
    ``refresher.raising``): a call made counts as the job's whatever its answer, so a driver killed during or
    just after it must leave the group to its successor; one its provider proves the cloud refused (no attempt
    landed: ``HostDiscovery.capacity_refused``) is taken back out (``refresher.refused``). A provider without the
    hook, or no sign of life (no ``--checkpoint-dir``): nothing."""
    on_raise = getattr(discovery, "on_raise", None)
    if on_raise is not None and refresher is not None:
        on_raise(refresher.raising, refresher.refused)


def share(job: Any, discovery: Any) -> None:
    """Tell the job what each fallback group can give and whether it set it (``discovery.can_give``: the next is
    asked for the rest), and the provider which groups a crashed predecessor raised (``discovery.adopt``).
    With the job's lock, before each tick and discovery answer; no cloud call."""
    sourcing = _sourcing(job)
    if sourcing is None:
        return
    can_give, adopt = getattr(discovery, "can_give", None), getattr(discovery, "adopt", None)
    for name, hosts in sourcing.inherited.items() if adopt is not None else ():
        adopt(name, hosts)
    if can_give is not None:
        sourcing.can_give = {name: room for name in sourcing.fallbacks if (room := can_give(name)) is not None}


def discovered(job: Any, discovery: Any, hosts: Any, now: float) -> None:
    """Hand a discovery answer to the job (with its lock), :func:`share` first: a raise sent in this answer's find()
    is the job's, and a 0 it asks on this answer has its ``capacity`` event (not dropped as never sent)."""
    share(job, discovery)
    job.discovered(hosts, now)


def lower(job: Any, discovery: Any, lock: threading.Condition, poller: Any, *, pause_s: float = 1.0,
          join_s: float = 10.0) -> None:
    """Set every group the job still holds raised back to 0 (its workers have all stopped): those it asked for
    and has not set back, and those whose last change, to 0, the closed discovery thread never made. A job that
    never raised one returns at once; one that did waits up to ``join_s`` for a discovery call under way (the
    provider takes one call at a time): with several sources, only for the call to that group's own source (one
    that hangs holds up no other's group). It then says which group stays raised; a raise the cloud never made
    (held back, refused) is not called one."""
    capacity_of = getattr(discovery, "capacity_of", lambda _source: None)
    with lock:
        sourcing = _sourcing(job)
        if sourcing is None:
            return
        share(job, discovery)  # a predecessor's raise taken over since the last tick is the job's own too
        raised = sourcing.raised()
        asked = list(sourcing.requested)
    if not raised and not asked:
        return  # nothing was ever raised: no wait for the discovery thread
    deadline = time.monotonic() + join_s
    if poller is not None and not poller.join(join_s):
        wait_for = getattr(discovery, "wait_for", None)
        ended = {s for s in {*raised, *asked} if wait_for is not None and
                 wait_for(s, deadline - time.monotonic())}  # that source's own call: the merged one may hang on
        for source, hosts in raised.items():
            if source not in ended and capacity_of(source) is None and wait_for is not None:
                log.info("job %s: host source %r: the raise to %d this driver asked was never made", job.job_id,
                         source, hosts)
            elif source not in ended:
                log.warning("job %s: host source %r stays at the desired capacity %d this job gave it: the "
                            "discovery call under way did not end within %.0fs; set it to 0 yourself", job.job_id,
                            source, capacity_of(source) or hosts, join_s)
        raised = {s: h for s, h in raised.items() if s in ended}
        asked = [s for s in asked if s in ended]
    for source in asked:  # a change to 0 queued for the discovery thread and never made
        if source not in raised and (capacity_of(source) or 0) > 0:
            raised[source] = capacity_of(source)
    for source, hosts in raised.items():
        for attempt in range(LOWER_TRIES):
            if attempt:
                time.sleep(pause_s)
            try:
                discovery.set_capacity(0, source=source)  # a multi-source provider logs its own failures
            except Exception as exc:  # noqa: BLE001 (tried again; the last failure is said below)
                log.warning("could not set the desired capacity of host source %r to 0: %s", source, exc)
                continue
            if capacity_of(source) in (0, None):
                break
        else:
            log.warning("job %s: host source %r stays at the desired capacity %d this job gave it: set it to 0 "
                        "yourself once nothing needs it", job.job_id, source, hosts)
            continue
        made = capacity_of(source) is not None or not hasattr(discovery, "capacity_of")
        with lock:
            sourcing.lowered(source, made=made)
            share(job, discovery)  # its 0 taken: the last sign of life no longer carries it
        # The provider sent no 0: the job never set the group (held back, refused) or an operator's value replaced
        # the job's (its earlier 0 included: capacity_of() then says None, not that 0).
        if not made:
            log.info("job %s: --manage-capacity: host source %r is left as it is: this job never set its desired "
                     "capacity", job.job_id, source)
            continue
        # "0" is what the job asked: a group whose MinSize is above it was held there (providers/multi.py).
        log.info("job %s: --manage-capacity: desired capacity of host source %r set back to 0 (or its group's "
                 "minimum size): the job is over", job.job_id, source)
