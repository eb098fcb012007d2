"""The driver's answer to ``cloud-elastic status``: a snapshot of the job, built from the pure job.

Pure: reads the :class:`~cloud_elastic.driver.job.elastic_job.ElasticJob` (under the
driver's lock) and returns a :class:`~cloud_elastic.status.StatusReply`.
"""

from __future__ import annotations

import statistics

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.elastic_job import ElasticJob, Phase
from cloud_elastic.driver.job.health import comm_share
from cloud_elastic.driver.job.spares import spare_slots
from cloud_elastic.driver.job.workers import WorkerState
from cloud_elastic.protocol_status import BlacklistedSlot, HostStatus, PendingNotice, StatusReply, WorkerStatus

__all__ = ["status_reply", "round_members", "MAX_WORKER_ROWS", "MAX_ROWS"]

#: Worker rows listed at most: the round's members by rank first (what ``status`` is read for), then the others.
MAX_WORKER_ROWS = 256
#: Host, blacklisted-slot and notice rows listed at most, each: the hosts with a listed worker first, then those
#: draining or missing, then the rest. What is left out is counted in the reply (``*_omitted``), so a job of
#: thousands of hosts answers in some 100 KB, not megabytes a terminal cannot show anyway.
MAX_ROWS = 512

_STATE_WORDS = {
    WorkerState.STARTING: "starting",
    WorkerState.CONNECTED: "setting up",  # registered: its script runs up to its first call that needs the round
    WorkerState.WAITING: "ready",
    WorkerState.RUNNING: "training",
    WorkerState.DRAINING: "leaving",
    WorkerState.COMPLETED: "completed",
    WorkerState.EXITING: "leaving",
}


def round_members(job: ElasticJob) -> list:
    """The live members of the job's current round: its world size is their number (0 between rounds), for status
    and the metrics alike."""
    return job.members()


def _phase(job: ElasticJob) -> str:
    if job.phase is Phase.STARTING:
        return "waiting for slots" if not job.workers else "starting"
    if job.phase is Phase.FINISHING:
        return "finishing"
    if job.phase is Phase.DONE:
        return "done"
    if len(round_members(job)) < job.policy.min_np:
        return "below --min-np"
    return "training"


def status_reply(job: ElasticJob, config: JobConfig, *, provider: str, now: float, wall_now: float,
                 uptime_s: float, steps_per_s: float | None = None) -> StatusReply:
    """What the driver answers to a signed ``status`` request.

    ``steps_per_s`` is rank 0's optimizer step rate as the driver measures it from heartbeats
    (:meth:`~cloud_elastic.metrics.StepRate.as_of`); None shows as unknown. A draining host shows its slots as
    last seen ready (:meth:`~cloud_elastic.driver.job.hosts.HostManager.slots_of`), and at least the slots its
    live workers hold.
    """
    held: dict[str, int] = {}  # host -> 1 + its highest slot a live worker holds
    for w in job.workers.values():
        if w.alive:
            held[w.slot.host] = max(held.get(w.slot.host, 0), w.slot.index + 1)
    alive = sorted((w for w in job.workers.values() if w.alive),
                   key=lambda w: (not w.member_of(job.round), w.rank if w.member_of(job.round) else 0))
    workers_omitted = max(0, len(alive) - MAX_WORKER_ROWS)
    unlisted: dict[str, int] = {}  # a host whose workers were all cut must not show as idle
    for w in alive[MAX_WORKER_ROWS:]:
        unlisted[w.slot.host] = unlisted.get(w.slot.host, 0) + 1
    alive = alive[:MAX_WORKER_ROWS]
    spares = set(job.rounds.spare_ids)
    by_host: dict[str, list[WorkerStatus]] = {}
    for w in sorted(alive, key=lambda w: (w.slot.host, w.slot.index)):
        by_host.setdefault(w.slot.host, []).append(
            # A rank is only meaningful in the current round (a leaver keeps its old one).
            WorkerStatus(w.slot.index, w.worker_id,
                         "spare" if w.worker_id in spares else _STATE_WORDS.get(w.state, w.state.value),
                         w.rank if w.member_of(job.round) else None,
                         None if w.compute_s is None else round(w.compute_s, 4),
                         None if (share := comm_share(w)) is None else round(share, 3))
        )
    hosts = job.hosts
    # A soft notice (a rebalance recommendation, a cordon) keeps new workers off a host that stays: "noticed", not
    # "ready" (a spare there counts as not ready; review h24).
    rows = [HostStatus(h, n, "noticed" if h in hosts.soft or h in hosts.provider_soft else "ready",
                       tuple(by_host.get(h, ())), hosts.sources.get(h, ""), hosts.prices.get(h), unlisted.get(h, 0))
            for h, n in hosts.ready.items()]
    rows += [HostStatus(h, max(hosts.slots_of(h) or 0, held.get(h, 0)), "draining", tuple(by_host.get(h, ())),
                        hosts.sources.get(h, ""), hosts.prices.get(h), unlisted.get(h, 0))
             for h in hosts.draining]
    rows += [HostStatus(h, n, "missing", tuple(by_host.get(h, ())), hosts.sources.get(h, ""), hosts.prices.get(h),
                       unlisted.get(h, 0))
             for h, (n, _) in hosts.missing.items()]
    # Stable: discovery's order within each.
    rows.sort(key=lambda row: (not (row.workers or row.workers_unlisted), row.state in ("ready", "noticed")))
    blacklisted = [BlacklistedSlot(s.host, s.index, round(left, 1), failures)
                   for s, left, failures in hosts.blacklist.blocked_slots(now)]
    blacklisted += [BlacklistedSlot(s.host, s.index, 0.0, n, True) for s, n in hosts.blacklist.for_good_slots()]
    notices = [PendingNotice(h, job.notice_sources.get(h, "provider"), d.deadline)
               for h, d in hosts.draining.items()]
    members = round_members(job)
    commit, commit_lost = _last_commit(job, members)
    computes = [w.compute_s for w in members if w.compute_s is not None]
    return StatusReply(
        job=job.job_id,
        phase=_phase(job),
        round=job.round,
        world_size=len(members),
        num_proc=config.num_proc,
        min_np=config.min_np,
        max_np=config.max_np,
        uptime_s=round(uptime_s, 1),
        resets=job.resets,
        commit_step=commit or None,
        commit_lost=commit_lost,
        steps_per_s=None if steps_per_s is None else round(steps_per_s, 2),
        hosts=tuple(rows[:MAX_ROWS]),
        blacklisted=tuple(blacklisted[:MAX_ROWS]),
        notices=tuple(notices[:MAX_ROWS]),
        hosts_omitted=max(0, len(rows) - MAX_ROWS),
        workers_omitted=workers_omitted,
        blacklisted_omitted=max(0, len(blacklisted) - MAX_ROWS),
        notices_omitted=max(0, len(notices) - MAX_ROWS),
        provider=provider,
        median_compute_s=round(statistics.median(computes), 4) if computes else None,
        whole_host_slots=config.whole_host_slots,
        spares=len(spares),
        spares_wanted=spare_slots(job.policy.spares, job.policy.whole_host_slots),
        **_cost(job, now),
    )


def _last_commit(job: ElasticJob, members: list) -> tuple[int, bool]:
    """The job's last commit, and whether it is lost (0: none).

    In a round, the members' newest. Between rounds (after a drain or a failure, the next round not formed yet)
    there are no members, but the survivors still hold the commit the next round goes on from: the newest a
    live worker holds. None holds one while the job runs, its state committed: every holder is gone, and the
    next round resumes from a checkpoint; the newest checkpoint's commit reported stored (0: none reported to
    this driver), marked lost. Only before the job runs (adopted workers still coming back) or once it is
    finishing is the newest commit heard of the answer."""
    if members:
        return max(w.commit_seq for w in members), False
    held = max((w.commit_seq for w in job.workers.values() if w.alive and w.holds_state), default=0)
    if held or job.phase is not Phase.RUNNING or not job.state_committed:
        return held or job.commit_high, False
    newest = job.leavers.newest_checkpoint
    return (0 if newest is None else newest[1]), True


def _cost(job: ElasticJob, now: float) -> dict:
    """The cost fields of a job with several host sources (none otherwise)."""
    sourcing = job.capacity.sourcing
    if sourcing is None:
        return {}
    s = sourcing.summary(now)
    per_step = sourcing.per_commit(s).value
    return {"cost": round(s.dollars, 6), "cost_per_hour": round(s.dollars_per_hour, 6),
            "cost_per_step": None if per_step is None else round(per_step, 8),
            "cost_fallback_only": None if s.fallback_only is None else round(s.fallback_only, 6),
            "cost_unpriced_slot_hours": round(s.unpriced_slot_hours, 6), "cost_slot_hours": round(s.slot_hours, 6),
            "cost_idle_slot_hours": round(s.idle_slot_hours, 6), "fallback_slots": sourcing.wanted}
