"""``cloud-elastic status``: list the jobs running on this machine and ask a driver how its job is doing.

The jobs are found by their drivers' records (:mod:`cloud_elastic.records`). The list shows the running
drivers and those gone within their workers' ``--driver-grace`` (the workers may still run, and a restarted
driver adopt them); older records are hidden unless asked for (``--all``), and deleted a day past their grace
as the list is made (:func:`listed_jobs`). The status request is a
signed control-plane message (kind ``status``, see :mod:`cloud_elastic.control`) sent to the recorded
address; the driver answers with a signed :class:`StatusReply` (:mod:`cloud_elastic.protocol_status`). Only a user who can read the job's
secret can sign the request, and the records' directories keep everyone else out, so no other user
of the machine can read a job's status (nor forge messages to its driver).

The driver answers ``status`` with ``StatusReply(...).to_json()``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from cloud_elastic.errors import CloudElasticError, ConfigError, ControlPlaneError
from cloud_elastic.protocol_status import BlacklistedSlot, HostStatus, PendingNotice, StatusReply, WorkerStatus
from cloud_elastic.records import JobRecord, job_dir, list_jobs, prune_gone, read_record

__all__ = [
    "JobRecord",
    "list_jobs",
    "listed_jobs",
    "WorkerStatus",
    "HostStatus",
    "BlacklistedSlot",
    "PendingNotice",
    "StatusReply",
    "query_status",
    "request_drain",
    "render_status",
    "render_job_list",
]

#: The worker id the status client signs its requests with (the driver's reply is addressed to it).
CLIENT_ID = "cli:status"


# ---------------------------------------------------------------------------- the client


def _call_driver(job_id: str, kind: str, payload: dict[str, Any] | None, *, root: Path | None,
                 timeout_s: float) -> dict[str, Any]:
    """One signed request to ``job_id``'s driver (with the job's secret, readable by its user alone)."""
    from cloud_elastic.control import Codec
    from cloud_elastic.worker.link.client import DriverClient

    directory = job_dir(job_id, root)
    record = read_record(directory)
    try:
        secret = (directory / "secret").read_text(encoding="utf-8").strip()
    except PermissionError:
        raise ConfigError(f"cannot read {directory / 'secret'}: permission denied") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the secret of job {job_id}: {exc.strerror or exc}") from None
    client = DriverClient(record.address, Codec(secret, job_id), CLIENT_ID)
    try:
        reply = client.call(kind, payload, timeout_s=timeout_s)
    except ControlPlaneError as exc:
        raise ControlPlaneError(f"job {job_id}: {exc}") from None
    except OSError as exc:
        gone = "" if record.alive else f" (its process {record.pid} is gone)"
        raise CloudElasticError(
            f"job {job_id}: the driver at {record.address} does not answer: {exc.strerror or exc}{gone}"
        ) from None
    finally:
        client.close()
    return {k: v for k, v in reply.items() if k not in ("v", "kind", "ts", "nonce", "re", "to")}


def query_status(job_id: str, *, root: Path | None = None, timeout_s: float = 5.0) -> StatusReply:
    """Ask ``job_id``'s driver for its status over the signed control plane.

    ConfigError when there is no such job or its record cannot be read;
    CloudElasticError (one line) when the driver is gone, refuses the
    request or answers something that fails verification.
    """
    status = StatusReply.from_json(_call_driver(job_id, "status", None, root=root, timeout_s=timeout_s))
    if status.job != job_id:
        raise ControlPlaneError(f"job {job_id}: the driver answered for job {status.job}")
    return status


def request_drain(job_id: str, host: str, slot: int | None = None, *, root: Path | None = None,
                  timeout_s: float = 5.0) -> str:
    """Ask ``job_id``'s driver to drain ``host`` (or one of its slots): its workers leave at their next commit.

    Returns the driver's one-line answer. Errors as for :func:`query_status`;
    CloudElasticError with the driver's reason when it refuses (no such host, say).
    """
    reply = _call_driver(job_id, "drain", {"host": host, "slot": slot}, root=root, timeout_s=timeout_s)
    message = str(reply.get("message") or "")[:500]
    if reply.get("ok") is not True:
        raise CloudElasticError(f"job {job_id}: the driver refused to drain {host}"
                                f"{'' if slot is None else f'[{slot}]'}: {message or 'no reason given'}")
    return message


# ---------------------------------------------------------------------------- rendering


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _cost_line(reply: StatusReply) -> str:
    from cloud_elastic.cost import format_dollars

    line = f"cost {format_dollars(reply.cost or 0.0)} so far, {format_dollars(reply.cost_per_hour or 0.0)}/h now"
    if reply.cost_per_step is not None:
        line += f", {format_dollars(reply.cost_per_step)} per commit"  # commits (commit_step), not optimizer steps
    if reply.cost_unpriced_slot_hours:
        line += f" ({reply.cost_unpriced_slot_hours:.3g} slot-hour(s) with no known price not in it)"
    if reply.cost_idle_slot_hours:
        of = "" if reply.cost_slot_hours is None else f" of its {reply.cost_slot_hours:.3g}"
        line += (f"; {reply.cost_idle_slot_hours:.3g}{of} slot-hour(s) on hosts of a fallback group the job raised "
                 "that ran no worker there")
    if reply.cost_fallback_only is not None:
        line += f"; on the fallback alone: {format_dollars(reply.cost_fallback_only)}"
    if reply.fallback_slots:
        line += f"; {reply.fallback_slots} fallback slot(s) wanted"
    return line


def listed_jobs(*, show_all: bool = False, root: Path | None = None,
                now: float | None = None) -> tuple[list[JobRecord], int]:
    """The records ``cloud-elastic status`` lists, and how many older gone ones it hides (none with
    ``show_all``). Records of drivers gone a day past their grace are deleted first (see :mod:`.records`)."""
    now = time.time() if now is None else now
    jobs = prune_gone(list_jobs(root), now, root)
    shown = jobs if show_all else [j for j in jobs if j.recent(now)]
    return shown, len(jobs) - len(shown)


def render_job_list(jobs: Sequence[JobRecord], *, now: float | None = None, hidden: int = 0) -> str:
    """The job table ``cloud-elastic status`` prints without a job id; ``hidden``: older gone records not in it.

    A gone driver's row says when it was last seen; its UP is ``-`` (it is not up).
    """
    more = (f"({hidden} record(s) of drivers gone for longer than their --driver-grace not shown: "
            "cloud-elastic status --all)\n") if hidden else ""
    if not jobs:
        return "no cloud-elastic jobs running for this user on this machine\n" + more
    now = time.time() if now is None else now
    rows = [("JOB", "DRIVER", "PID", "UP", "COMMAND")]
    for job in jobs:
        if job.alive:
            pid, up = str(job.pid), _duration(now - job.started)
        else:
            pid, up = f"{job.pid} (gone, last seen {_duration(now - job.last_seen)} ago)", "-"
        rows.append((job.job_id, job.address, pid, up, " ".join(job.command)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n" + more


def render_status(reply: StatusReply, *, now: float | None = None) -> str:
    """The text ``cloud-elastic status JOB`` prints."""
    now = time.time() if now is None else now
    rate = f"{reply.steps_per_s:.2f}" if reply.steps_per_s is not None else "-"
    commit = f"#{reply.commit_step}" if reply.commit_step is not None else "-"  # counted in commits, not steps
    if reply.commit_lost:  # every holder gone: what the next round resumes from
        commit = "lost; resumes from " + (f"the checkpoint of commit {commit}" if reply.commit_step is not None
                                          else "the latest checkpoint, if any")
    elif reply.commit_step is not None and not reply.world_size:
        commit += " (the job's: no round now)"
    out = [
        f"job {reply.job}: {reply.phase}, up {_duration(reply.uptime_s)}"
        + (f", provider {reply.provider}" if reply.provider else ""),
        f"round {reply.round}, world size {reply.world_size} "
        f"(-np {reply.num_proc}, --min-np {reply.min_np}, --max-np {reply.max_np}"
        + (f", whole hosts of {reply.whole_host_slots} slot(s)" if reply.whole_host_slots else "") + ")"
        + (f", spares {reply.spares} of {reply.spares_wanted}" if reply.spares_wanted else ""),
        f"steps/s {rate}, last commit {commit}, resets {reply.resets}"
        + (f", median compute {reply.median_compute_s * 1e3:.1f} ms/step" if reply.median_compute_s is not None
           else ""),
    ]
    if reply.cost is not None:
        out.append(_cost_line(reply))
    out.append("")
    sourced = any(h.source for h in reply.hosts)
    rows = [("HOST", "SLOTS", "STATE", *(("SOURCE", "$/SLOT-H") if sourced else ()), "WORKERS")]
    for host in reply.hosts:
        workers = ", ".join(
            f"[{w.slot}] " + (f"rank {w.rank} " if w.rank is not None else "") + w.state
            + (f" {w.compute_s * 1e3:.1f} ms/step" if w.compute_s is not None else "")
            + (f" {w.comm_share * 100:.0f}% comm" if w.comm_share is not None else "") for w in host.workers
        )
        if host.workers_unlisted:
            workers += ("; " if workers else "") + f"{host.workers_unlisted} worker(s) not listed"
        workers = workers or "-"
        where = (host.source or "-", "-" if host.price is None else f"{host.price:.4g}") if sourced else ()
        rows.append((host.host, str(host.slots), host.state, *where, workers))
    columns = len(rows[0]) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    out += ["  ".join(cell.ljust(w) for cell, w in zip(row[:columns], widths)) + "  " + row[columns] for row in rows]
    out += _omitted(reply.hosts_omitted, "host"), _omitted(reply.workers_omitted, "worker")
    if reply.blacklisted:
        out.append("")
        out.append("blacklisted:")
        for b in reply.blacklisted:
            where = f"{b.host}[{b.slot}]" if b.slot is not None else f"{b.host} (whole host)"
            failures = f"{b.failures} failure" + ("s" if b.failures != 1 else "")
            until = "for the rest of the job" if b.for_good else f"for {_duration(b.seconds_left)} more"
            out.append(f"  {where} {until} ({failures})")
        out.append(_omitted(reply.blacklisted_omitted, "blacklisted slot", indent="  "))
    if reply.notices:
        out.append("")
        out.append("pending notices:")
        for n in reply.notices:
            when = f"deadline in {_duration(n.deadline - now)}" if n.deadline is not None else "no deadline given"
            out.append(f"  {n.host}: {n.source}, {when}")
        out.append(_omitted(reply.notices_omitted, "notice", indent="  "))
    return "\n".join(line for line in out if line is not None) + "\n"


def _omitted(count: int, what: str, *, indent: str = "") -> str | None:
    """The line that says how many rows of a kind the driver left out of its reply (None: none)."""
    return f"{indent}... and {count} more {what}{'s' if count != 1 else ''}, not listed" if count else None
