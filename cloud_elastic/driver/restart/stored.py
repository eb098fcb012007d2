"""What a starting driver finds in ``--checkpoint-dir`` besides the job record: the checkpoints it resumes from,
and the signs of a job whose state is gone.

* :func:`resumes` says in one line whether the first round resumes, from which step, and, when the newest
  checkpoint's manifest names another job than the store's (a folder copied in from another job's directory, as
  users do to warm-start), that it was written by that job: ``resuming from DIR: the latest checkpoint is of step
  40, written 3s ago by job 6a524de8 (not this job's dc58994d: a copied checkpoint)``. It is resumed all the same:
  copying one in is a deliberate act.
* :func:`list_checkpoints` lists them, refusing (ConfigError) to train over a state that is there but cannot be read, or
  a succeeded job's whose checkpoints are gone (``succeeded.json``, :mod:`.finished`).
* :func:`list_checkpoints` also refuses a job whose folders are all gone while ``checkpointed.json`` (the newest
  checkpoint written, :mod:`cloud_elastic.checkpoint.store`) says one was written: moved, deleted or lost by storage,
  starting over would train over them.
* :func:`refuse_if_moved`: with nothing at all in the store, a dead driver of the same command (this machine's
  records) that checkpointed elsewhere: a mistyped or changed ``--checkpoint-dir`` would train its job again from
  initial weights beside its progress, so the start is refused, naming both places.
* :func:`refuse_if_job_gone`: with neither a job record nor a checkpoint, ``succeeded.json``, ``checkpointed.json``
  or the drivers' claims (:mod:`cloud_elastic.checkpoint.claims`) may still name a job that ran there; a new job would train it again from
  initial weights (and write its own success over the record), so the start is refused, with the remedies.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cloud_elastic.checkpoint.store import CHECKPOINTED_RECORD as _CHECKPOINTED
from cloud_elastic.driver.restart.finished import SUCCEEDED_RECORD
from cloud_elastic.errors import CheckpointError, ConfigError

__all__ = ["list_checkpoints", "newer_link", "refuse_if_job_gone", "resumes"]

log = logging.getLogger(__name__)


def resumes(store: Any, job_id: str, *, announce_none: bool, checkpoints: list[Any] | None = None,
            adopting: bool = False) -> bool:
    """Whether the store holds a checkpoint of this job (the first round then resumes from the newest), said in the log.

    Asked when the store is opened and again after waiting out a dead predecessor's workers: they
    write their last checkpoints while we wait. ``checkpoints``: :func:`list_checkpoints` already read.
    ``adopting``: the driver plans to adopt its predecessor's running workers, which train on from their own
    step; the checkpoint is then said (at INFO) to be only the fallback, not the step training goes back to.
    """
    found = list_checkpoints(store, job_id) if checkpoints is None else checkpoints
    if not found:
        if adopting:  # "training starts over" read as the adopted workers' training lost (review s60 rvV)
            log.info("job %s: adopting the running workers; there is no checkpoint in %s yet, so only an adoption "
                     "that fails would start training over", job_id, store.url)
        elif announce_none:
            log.info("job %s: resuming the job recorded in %s; it has no checkpoint yet, so training starts "
                     "over unless its workers still write one", job_id, store.url)
        else:
            log.info("job %s: the previous workers wrote no checkpoint to %s; training starts over", job_id, store.url)
        return False
    newest = found[0]
    if adopting:  # "resuming from ... step 1" read as training going back to step 1 (review s60 rvS)
        log.info("job %s: adopting the running workers; the latest checkpoint in %s, of step %d written %s ago%s, is "
                 "only the fallback should the adoption fail", job_id, store.url, newest.step,
                 _age(time.time() - newest.created), _written_by(newest, job_id))
        return True
    log.warning("job %s: resuming from %s: the latest checkpoint is of step %d, written %s ago%s",
                job_id, store.url, newest.step, _age(time.time() - newest.created), _written_by(newest, job_id))
    return True


def _written_by(newest: Any, job_id: str) -> str:
    """`` by job X (not this job's Y: a copied checkpoint)`` when the manifest names another job, else nothing."""
    theirs = newest.job_id
    if not isinstance(theirs, str) or not theirs or theirs == job_id:
        return ""
    return f" by job {' '.join(theirs[:64].split())} (not this job's {job_id}: a copied checkpoint)"


def newer_link(store: Any, found: list[Any]) -> str | None:
    """Why the newest checkpoint folder that is a symbolic link and newer than every one read (``found``)
    is not followed; None when there is none. Moved away and linked back, it holds the job's newest state."""
    return next((why for name, why in store.links() if not found or name > found[0].name), None)


def list_checkpoints(store: Any, job_id: str) -> list[Any]:
    """The readable checkpoints (``store.list()``); ConfigError when training on would go over a state that is
    there but cannot be read, or that is gone from a job that succeeded."""
    found = store.list()
    linked = newer_link(store, found)
    if linked:
        raise ConfigError(f"job {job_id}: {linked}")
    if not found:
        unreadable = store.unreadable()
        if unreadable:  # never "no checkpoint yet": training from the start would prune them too
            name, why = unreadable[0]
            raise ConfigError(f"job {job_id}: {store.url} holds {len(unreadable)} checkpoint(s) and none can be read "
                              f"(the newest, {name}: {why}): not starting the training over; was it written by a "
                              "newer cloud-elastic?")
        succeeded = _succeeded(store)
        if succeeded is not None and succeeded[0] == job_id and succeeded[1] is not None:
            # its checkpoints were moved or deleted: starting over would say "succeeded" again
            raise ConfigError(f"job {job_id} succeeded at step {succeeded[1]} on {store.url}, which holds no "
                              "checkpoint now: not training it again from initial weights; put its checkpoint "
                              "folders back, or use a fresh --checkpoint-dir")
        written = _checkpointed(store)
        if written is not None and written[0] in (job_id, None):
            # its folders were moved or deleted (or storage lost them): starting over would train over them
            raise ConfigError(f"job {job_id} wrote {written[1]} to {store.url}, which holds no checkpoint now: not "
                              "training it again from initial weights; put its checkpoint folders back, use a fresh "
                              f"--checkpoint-dir, or remove {store.backend.url(_CHECKPOINTED)} to train it from the "
                              "start there")
    else:
        _refuse_if_newest_gone(store, job_id, found)
    return found


def _refuse_if_newest_gone(store: Any, job_id: str, found: list[Any]) -> None:
    """ConfigError when ``checkpointed.json`` names a checkpoint of this job newer than every one read (``found``)
    whose folder is gone: a restart went back to the older one, said it could not tell how many steps were lost,
    and succeeded (review h25). One that is there but cannot be read is left to the store's rule (skipped with a
    WARNING that names it and says why, ``CheckpointStore.latest``)."""
    from cloud_elastic.checkpoint.store import read_record

    try:
        named = read_record(store, _CHECKPOINTED, _CHECKPOINTED, "checkpoint record",
                            lambda body: (body.get("job_id"), body["step"], body["name"]))
    except CheckpointError:
        return  # unreadable: it names nothing to compare with
    if named is None:
        return
    job, step, name = named
    newest = found[0]
    if (job not in (job_id, None, "") or type(step) is not int or not isinstance(name, str) or name <= newest.name
            or name in {n for n, _ in store.unreadable()}):
        return
    if any(c.name == name for c in store.list()):
        return  # published since ``found`` was listed: a dead driver's workers train on under --driver-grace (h27)
    raise ConfigError(f"job {job_id} wrote a checkpoint of step {step} ({' '.join(name[:80].split())}) to "
                      f"{store.url}, which is gone now; the newest there is of step {newest.step}: not going back to "
                      f"it unasked; put that checkpoint folder back, or remove {store.backend.url(_CHECKPOINTED)} to "
                      f"resume from step {newest.step}")


def refuse_if_moved(command: Any, checkpoint_dir: str, store: Any) -> None:
    """ConfigError when a driver of ``command`` (run from this directory) died on this machine having checkpointed
    to another ``--checkpoint-dir`` than ``checkpoint_dir`` (``store``'s), which holds nothing (the caller looked):
    its adoption record is still here (a driver that ended removes it; pruned a day past its grace). Starting there
    trained the job again from initial weights and succeeded, its progress left in the other directory (review
    h32)."""
    import os

    from cloud_elastic.driver.restart.record import RECORD_NAME, location, read_record
    from cloud_elastic.records import find_jobs, job_dir

    if tuple(command)[:1] in (("<ray actor>",), ("<spark task>",)):
        return  # one name for every Ray or Spark job: not the same training command
    for job in find_jobs(command, cwd=os.getcwd()):
        try:
            theirs = read_record(job_dir(job.job_id))
        except ConfigError:  # unreadable: the start goes on as before (the wait for its workers still applies)
            continue
        if theirs is None or not theirs.checkpoint_dir or location(theirs.checkpoint_dir) == location(checkpoint_dir):
            continue
        if job.alive and job.pid != os.getpid():  # a live one is refused with its own line; ours: a reused pid
            continue
        where = " ".join(theirs.checkpoint_dir[:500].split())
        raise ConfigError(f"the previous driver of this command (job {job.job_id}, pid {job.pid}) died "
                          f"{time.time() - job.last_seen:.0f}s ago having checkpointed to {where}, and {store.url} "
                          f"holds nothing: not training the job again from initial weights; run it with "
                          f"--checkpoint-dir {where} to resume it, or remove {job_dir(job.job_id) / RECORD_NAME} to "
                          "start a new job here on purpose")


def refuse_if_job_gone(store: Any) -> None:
    """ConfigError when ``store`` holds neither a job record nor a checkpoint (the caller looked) but its
    ``succeeded.json``, ``checkpointed.json`` or its drivers' claims name a job that ran there (see module
    docstring); CheckpointError when the claims cannot be listed. A success record that cannot be read is warned
    about and not counted; one that names no step (the job succeeded before any checkpoint) has nothing trained to
    lose, as in :func:`list_checkpoints`."""
    from cloud_elastic.checkpoint.claims import CLAIMS, newest_claim

    succeeded = _succeeded(store, warn=True)
    written = _checkpointed(store)
    newest = newest_claim(store)
    claimed = newest is not None and newest.driver is not None
    remove = " and ".join(store.backend.url(name) for name, there in (
        (SUCCEEDED_RECORD, succeeded is not None), (_CHECKPOINTED, written is not None), (CLAIMS, claimed)) if there)
    gone = (f"which holds neither its checkpoints nor its job record (job.json) now: not training it again from "
            f"initial weights; use a fresh --checkpoint-dir, or remove {remove} to train a new job there")
    if succeeded is not None and succeeded[1] is not None:  # one that never checkpointed has nothing to lose
        raise ConfigError(f"job {succeeded[0]} succeeded at step {succeeded[1]} on {store.url}, {gone}")
    if written is not None:
        raise ConfigError(f"job {written[0] or '(unnamed)'} wrote {written[1]} to {store.url}, {gone}")
    if claimed:
        job = " ".join(newest.driver.job_id[:64].split())
        raise ConfigError(f"job {job} ran on {store.url} (driver generation {newest.generation}), {gone}")


def _checkpointed(store: Any) -> tuple[str | None, str] | None:
    """(job, what) of the newest checkpoint ``checkpointed.json`` says was written (job None: unnamed; what: ``a
    checkpoint of step 40 (ckpt-...)``); None when there is no such record. One that cannot be read counts as
    written: only a checkpoint writes one (the refusal says which file to remove)."""
    from cloud_elastic.checkpoint.store import read_record

    def parse(body: dict[str, Any]) -> tuple[str | None, str]:
        job, step, name = body.get("job_id"), body["step"], body["name"]
        if type(step) is not int or not isinstance(name, str):
            raise ValueError("step is not an integer or name not a string")
        return ((" ".join(job[:64].split()) if isinstance(job, str) and job else None),
                f"a checkpoint of step {step} ({' '.join(name[:80].split())})")

    try:
        return read_record(store, _CHECKPOINTED, _CHECKPOINTED, "checkpoint record", parse)
    except CheckpointError as exc:
        return None, f"a checkpoint (its record cannot be read: {exc})"


def _succeeded(store: Any, *, warn: bool = False) -> tuple[str, int | None] | None:
    """The job ``succeeded.json`` (:mod:`.finished`) names and the step of the newest checkpoint it had then (None:
    it had none); None when there is no such record, or it cannot be read (logged with ``warn``)."""
    from cloud_elastic.checkpoint.store import read_record

    try:
        found = read_record(store, SUCCEEDED_RECORD, SUCCEEDED_RECORD, "success record",
                            lambda body: (body["job_id"], body.get("step")))
    except CheckpointError as exc:
        if warn:
            log.warning("%s", exc)
        return None
    if found is None or not isinstance(found[0], str) or not found[0]:
        return None
    step = found[1] if type(found[1]) is int else None
    return " ".join(found[0][:64].split()), step


def _age(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}min"
