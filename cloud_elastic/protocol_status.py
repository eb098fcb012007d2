"""The driver's answer to ``status`` on the wire: :class:`StatusReply` and the records it holds.

The driver builds it (:mod:`cloud_elastic.driver.job.status_reply`) and sends ``StatusReply(...).to_json()``
in a signed control-plane reply; ``cloud-elastic status`` (:mod:`cloud_elastic.status`) reads it back with
:meth:`StatusReply.from_json` and renders it. A malformed reply is one :class:`ControlPlaneError` line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cloud_elastic.errors import ControlPlaneError

__all__ = ["WorkerStatus", "HostStatus", "BlacklistedSlot", "PendingNotice", "StatusReply"]


@dataclass(frozen=True)
class WorkerStatus:
    """One worker on a host slot."""

    slot: int
    worker: str
    #: e.g. "starting" (launched), "setting up" (connected, its script not yet at its first call that needs the
    #: round), "ready", "training", "leaving".
    state: str
    rank: int | None = None
    #: Its compute time per optimizer step (the time outside waiting on peers), when known.
    compute_s: float | None = None
    #: The share of its step time spent in collectives (waiting on peers and sending), when known.
    comm_share: float | None = None


@dataclass(frozen=True)
class HostStatus:
    """One discovered host and its workers."""

    host: str
    slots: int
    #: "ready", "noticed" (ready, with a soft notice: no new worker there), "draining" or "missing" (gone from
    #: discovery, within --host-missing-grace).
    state: str
    workers: tuple[WorkerStatus, ...] = ()
    #: The host source (group) it came from, in a job with several; its price per slot-hour where known.
    source: str = ""
    price: float | None = None
    #: Workers of this host left out of ``workers`` by the reply's cap on worker rows (``workers_omitted``).
    workers_unlisted: int = 0


@dataclass(frozen=True)
class BlacklistedSlot:
    """A slot (or a whole host, ``slot`` None) blocked after failures."""

    host: str
    slot: int | None
    seconds_left: float
    failures: int
    for_good: bool = False  # blocked for the rest of the job (``seconds_left`` 0)


@dataclass(frozen=True)
class PendingNotice:
    """A termination or maintenance notice not yet acted on to the end."""

    host: str
    source: str
    deadline: float | None


@dataclass(frozen=True)
class StatusReply:
    """What a driver answers to a ``status`` request (its fields go on the wire as JSON)."""

    job: str
    #: e.g. "starting", "waiting for slots", "training", "below --min-np", "finishing".
    phase: str
    round: int
    world_size: int
    num_proc: int
    min_np: int
    max_np: int
    uptime_s: float
    resets: int
    #: The job's newest commit a live worker holds (in a round: the members'; between rounds: the survivors'; none
    #: alive: ``commit_lost``), counted in commits (``state.commit()`` calls) in the history of the state, as
    #: ``round_formed.step``: the training step only when the script commits once per step.
    commit_step: int | None = None
    #: No live worker holds the job's last commit (every holder gone while the job runs): ``commit_step`` is then
    #: the commit of the newest checkpoint reported stored, which the next round resumes from (None: none reported).
    commit_lost: bool = False
    #: Optimizer steps per second rank 0's process takes (30 s window; those a rollback undoes included).
    steps_per_s: float | None = None
    hosts: tuple[HostStatus, ...] = ()
    blacklisted: tuple[BlacklistedSlot, ...] = ()
    notices: tuple[PendingNotice, ...] = ()
    provider: str = ""
    #: The median of the round's members' compute times per step (what a straggler is measured against).
    median_compute_s: float | None = None
    #: ``--whole-hosts``: the slots a host joins and leaves with (0: off).
    whole_host_slots: int = 0
    #: With several host sources: dollars so far, per hour now, per commit (``cost_per_step``: of this driver's run,
    #: counted in commits, not optimizer steps: ``Sourcing.per_commit``), on the fallback alone.
    cost: float | None = None
    cost_per_hour: float | None = None
    cost_per_step: float | None = None
    cost_fallback_only: float | None = None
    #: Slot-hours of hosts with no known price: not in ``cost``, never counted as free.
    cost_unpriced_slot_hours: float | None = None
    #: Slot-hours the job has paid for (the unpriced ones included), and of them those of free slots on hosts of a
    #: fallback group the job raised (``--manage-capacity``), which ``cost`` charges too; a crashed predecessor's
    #: included, as in ``cost``.
    cost_slot_hours: float | None = None
    cost_idle_slot_hours: float | None = None
    #: Fallback slots the job wants now (several host sources).
    fallback_slots: int = 0
    #: ``--spares``: workers waiting outside the rounds now, and how many the job keeps.
    spares: int = 0
    spares_wanted: int = 0
    #: Rows the driver left out of ``hosts``, of their ``workers`` and of ``blacklisted`` and ``notices`` (each list
    #: is capped, so that the reply of a job of thousands of hosts stays small): counted here, never silently.
    hosts_omitted: int = 0
    workers_omitted: int = 0
    blacklisted_omitted: int = 0
    notices_omitted: int = 0

    def to_json(self) -> dict[str, Any]:
        """The reply's JSON form (what the driver returns from its handler)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StatusReply":
        """Parse a reply; ControlPlaneError naming what is wrong with a malformed one."""
        try:
            hosts = tuple(
                HostStatus(str(h["host"]), int(h["slots"]), str(h["state"]), tuple(
                    WorkerStatus(int(w["slot"]), str(w["worker"]), str(w["state"]),
                                 None if w.get("rank") is None else int(w["rank"]),
                                 None if w.get("compute_s") is None else float(w["compute_s"]),
                                 None if w.get("comm_share") is None else float(w["comm_share"]))
                    for w in h.get("workers", ())), str(h.get("source", "")), _number(h.get("price")),
                    int(h.get("workers_unlisted", 0)))
                for h in data.get("hosts", ()))
            blacklisted = tuple(
                BlacklistedSlot(str(b["host"]), None if b.get("slot") is None else int(b["slot"]),
                                float(b["seconds_left"]), int(b["failures"]), bool(b.get("for_good", False)))
                for b in data.get("blacklisted", ()))
            notices = tuple(
                PendingNotice(str(n["host"]), str(n["source"]),
                              None if n.get("deadline") is None else float(n["deadline"]))
                for n in data.get("notices", ()))
            return cls(
                job=str(data["job"]), phase=str(data["phase"]), round=int(data["round"]),
                world_size=int(data["world_size"]), num_proc=int(data["num_proc"]), min_np=int(data["min_np"]),
                max_np=int(data["max_np"]), uptime_s=float(data["uptime_s"]), resets=int(data["resets"]),
                commit_step=None if data.get("commit_step") is None else int(data["commit_step"]),
                commit_lost=bool(data.get("commit_lost", False)),
                steps_per_s=None if data.get("steps_per_s") is None else float(data["steps_per_s"]),
                hosts=hosts, blacklisted=blacklisted, notices=notices, provider=str(data.get("provider", "")),
                median_compute_s=None if data.get("median_compute_s") is None else float(data["median_compute_s"]),
                whole_host_slots=int(data.get("whole_host_slots", 0)),
                cost=_number(data.get("cost")), cost_per_hour=_number(data.get("cost_per_hour")),
                cost_per_step=_number(data.get("cost_per_step")),
                cost_fallback_only=_number(data.get("cost_fallback_only")),
                cost_unpriced_slot_hours=_number(data.get("cost_unpriced_slot_hours")),
                cost_slot_hours=_number(data.get("cost_slot_hours")),
                cost_idle_slot_hours=_number(data.get("cost_idle_slot_hours")),
                fallback_slots=int(data.get("fallback_slots", 0)),
                spares=int(data.get("spares", 0)), spares_wanted=int(data.get("spares_wanted", 0)),
                **{f"{name}_omitted": int(data.get(f"{name}_omitted", 0))
                   for name in ("hosts", "workers", "blacklisted", "notices")},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ControlPlaneError(f"malformed status reply: {type(exc).__name__}: {exc}") from None


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
