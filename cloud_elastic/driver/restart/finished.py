"""A job that succeeded says so beside its checkpoints, and a later start there says so before it resumes.

The same command run again on a finished job's ``--checkpoint-dir`` resumes it: "resuming from ... step 20",
zero steps trained (unless the script now trains longer), "succeeded"; and a new script there fails loading a
checkpoint of another model ("training state lost"). Resuming stays, as it is how a finished job is trained on
(a longer schedule) or resharded onto another layout; what was missing is the word that the directory holds a
finished job.

A driver whose job succeeded writes ``succeeded.json`` next to ``job.json`` (:func:`mark_succeeded`)::

    {"format": "cloud-elastic-checkpoint", "job_id": "5f3a9c1e", "at": 1795444453.5, "step": 20}

``step`` is that of the newest checkpoint (null: none). A driver started on that directory later
(:func:`say_if_succeeded`, from :func:`~.predecessor.plan_start`) says first, in one warning naming the directory,
that this job already succeeded there, when, and at which step, and that a new job (another script, another model)
wants a fresh ``--checkpoint-dir``: so a load that then fails, or a run that trains nothing, explains itself. Once
the job was trained on past that step (a longer schedule, stopped before it succeeded again) the record is stale:
the newest checkpoint's step differs from it, and nothing is said.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from cloud_elastic.errors import CheckpointError

__all__ = ["SUCCEEDED_RECORD", "mark_succeeded", "say_if_succeeded"]

log = logging.getLogger(__name__)

SUCCEEDED_RECORD = "succeeded.json"


def mark_succeeded(store: Any, job_id: str) -> None:
    """Record beside the checkpoints that job ``job_id`` succeeded. Best effort: a write that fails is logged (the
    job did succeed; a later start on the directory then resumes it without a word of it)."""
    from cloud_elastic.checkpoint.api import FORMAT

    try:
        newest = store.list()
        body = {"format": FORMAT, "job_id": job_id, "at": time.time(), "step": newest[0].step if newest else None}
        data = json.dumps(body).encode()
        store.backend.write(SUCCEEDED_RECORD, lambda f: f.write(data))
    except Exception as exc:  # storage trouble of any kind: the outcome stands
        log.warning("job %s: could not record its success in %s: %s", job_id, store.url, " ".join(str(exc).split()))


def say_if_succeeded(store: Any, job_id: str) -> bool:
    """Warn (one line) when ``store`` records that job ``job_id`` succeeded (see module docstring); whether it does.
    A record of another job (``job.json`` was replaced) counts as none; one that cannot be read is logged."""
    from cloud_elastic.checkpoint.store import read_record

    def parse(body: dict[str, Any]) -> tuple[str, float, Any]:
        step = body.get("step")
        return str(body["job_id"]), float(body["at"]), step if type(step) is int else None

    try:
        found = read_record(store, SUCCEEDED_RECORD, store.backend.url(SUCCEEDED_RECORD), "success record", parse)
    except CheckpointError as exc:
        log.warning("job %s: %s", job_id, exc)
        return False
    if found is None or found[0] != job_id:
        return False
    _, at, step = found
    newest = _newest_step(store)
    if step is not None and newest is not None and newest != step:  # trained on since: no longer what succeeded
        log.debug("job %s: its success at step %s is stale (newest checkpoint: step %s)", job_id, step, newest)
        return False
    ago = max(0.0, time.time() - at)
    when = f"{ago:.0f}s" if ago < 120 else f"{ago / 60:.0f}min" if ago < 7200 else f"{ago / 3600:.0f}h"
    log.warning("job %s already succeeded on %s %s ago%s; resuming it, so only steps the script asks for past that "
                "are trained; a new job (another script or model) wants a fresh --checkpoint-dir", job_id, store.url,
                when, f" at step {step}" if step is not None else "")
    return True


def _newest_step(store: Any) -> int | None:
    """The newest checkpoint's step (None: none, or the listing failed, logged by the store's caller)."""
    try:
        newest = store.list()
    except Exception as exc:  # storage trouble: the warning then goes by the record alone
        log.debug("could not list %s: %s", store.url, exc)
        return None
    return newest[0].step if newest else None
