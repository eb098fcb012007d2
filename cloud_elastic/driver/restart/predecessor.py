"""A driver restarted for a job that has a durable record: who the job is, whether to adopt, and how long to wait.

With ``--checkpoint-dir`` the checkpoint store holds the job's ``job.json`` (job id and command,
never the secret), so that running the same command again after a driver crash keeps the job id
and resumes from the latest checkpoint. :func:`plan_start` makes every decision of a start once,
before anything listens, and returns them as a frozen :class:`StartPlan`:

* the job id: the one the store records, else ours, recorded there only if no other driver recorded one
  meanwhile (:func:`_claim`: of two drivers started at once on a fresh store, one runs the job);
* when the store recorded one, the next generation of the job's drivers, claimed beside the checkpoints only
  if no other driver claimed it meanwhile (:func:`_next_generation`: of two drivers restarted at once, one
  runs the job), once every check below let this start go on;
* whether the first round resumes from a checkpoint (the store holds one of this job: :mod:`.stored`, which also
  refuses a store whose job record and checkpoints are gone while ``succeeded.json`` or the claims name a job);
* whether to adopt a dead predecessor's running workers: found by the checkpoint URL in this
  user's private driver records (:mod:`.record`), when it died within its workers' grace (less
  than a second left is not worth the race) and the record is of the store's job;
* that the same job is not already running (a live driver pid on this machine, or a sign of life
  beside the checkpoints from a live driver here, or ``job.json`` created or the newest generation
  claimed by one that has not yet written its first): ConfigError before anything starts;
* until when new workers must wait (:attr:`StartPlan.wait_until`): a dead predecessor's workers
  may train on for its ``--driver-grace`` and write a last checkpoint, and two generations must
  never train the same job.

Without ``--checkpoint-dir`` nothing can be adopted or resumed, but a dead driver of the same
command (this user's record on this machine, :func:`cloud_elastic.records.find_jobs`) left workers
that train on for its grace, on the same hosts and devices: the plan waits them out
(:func:`_without_store`) and the job then starts over, as a supervisor restarting the driver
expects. A refusal would not do: the Terraform unit does not restart a driver that exits 2. So does a
start whose ``--checkpoint-dir`` holds no job record yet (:func:`_same_command`): a restart that adds
``--checkpoint-dir``, or changes it, finds its predecessor only that way.

:func:`wait_for_predecessor` carries out that wait (when nothing was adopted) and then checks
again: a driver elsewhere that refreshed its sign of life meanwhile owns the job, and the
checkpoints the old workers wrote meanwhile are resumed from.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from cloud_elastic.config import JobConfig, past_grace_s
from cloud_elastic.driver.restart.finished import say_if_succeeded
from cloud_elastic.driver.restart.record import RECORD_NAME, AdoptionRecord, find_records, read_record
from cloud_elastic.driver.restart.stored import (list_checkpoints, newer_link, refuse_if_job_gone, refuse_if_moved,
                                                 resumes)
from cloud_elastic.errors import CheckpointError, ConfigError
from cloud_elastic.records import driver_running, find_jobs, job_dir, list_jobs, pid_alive, prune_gone, runtime_root

__all__ = ["ADOPT_MARGIN_S", "RECORD_TOUCH_S", "StartPlan", "WaitOutcome", "driver_alive", "open_store", "plan_start",
           "resumes", "wait_for_predecessor"]

log = logging.getLogger(__name__)

#: How often the loop refreshes the status record's mtime (a restarted driver's measure of when we died).
RECORD_TOUCH_S = 2.0
#: What a worker stopping at the end of the grace may spend finishing rank 0's last checkpoint, and margin.
_LAST_CHECKPOINT_S = 12.0
#: What a worker stopping at the end of the grace without checkpoints may spend exiting, and margin.
_STOP_S = 3.0
#: Adopting workers that have less than this left of their grace is not worth the race.
ADOPT_MARGIN_S = 1.0


@dataclass(frozen=True)
class StartPlan:
    """What a starting driver does, decided once before anything listens (see module docstring).

    ``wait_until`` (Unix time, None: no predecessor) is when a dead predecessor's workers have
    surely stopped, and ``waiting_for`` says who that predecessor was (for the log). ``grace_s`` is
    the longest ``--driver-grace`` any driver of the job gave its workers; ``previous_alive`` the
    sign of life a dead driver left beside the checkpoints, read again after the wait.
    ``predecessor_gone``: no worker of an earlier driver can be running.
    """

    job_id: str
    resumed: bool = False
    adopt: AdoptionRecord | None = None
    wait_until: float | None = None
    waiting_for: str = ""
    grace_s: float = 0.0
    previous_alive: Any = None
    predecessor_gone: bool = True
    checkpoint_dir: str | None = None
    #: The driver generation this start claimed (:mod:`cloud_elastic.checkpoint.claims`); None: none claimed.
    generation: int | None = None
    #: (generation, time) of each older claim dated ahead of this machine's clock when planned: live only if
    #: renewed since (:func:`_claimed_since`).
    claims_ahead: tuple[tuple[int, float], ...] = ()

    def without_adoption(self) -> "StartPlan":
        """The plan once an adoption is given up (the predecessor's ports could not be bound)."""
        return replace(self, adopt=None)


def open_store(config: JobConfig) -> Any:
    """The CheckpointStore of ``--checkpoint-dir`` (None without one). Imports torch: seconds.

    ConfigError for a missing fsspec backend, or a local path that is a file or lies under one."""
    if config.checkpoint_dir is None:
        return None
    _refuse_a_file(config.checkpoint_dir)
    from cloud_elastic.checkpoint import CheckpointStore

    return CheckpointStore(config.checkpoint_dir, keep=config.checkpoint_keep)


def _refuse_a_file(url: str) -> None:
    """A local ``--checkpoint-dir`` that is a file, or under one, as the one-line error of a flag (it was
    "could not read /etc/passwd/job.json: [Errno 20] Not a directory", exit 1, as if storage had failed)."""
    if "::" in url or ("://" in url and not url.startswith("file://")):
        return
    path = os.path.abspath(url[len("file://"):] if url.startswith("file://") else url)
    at = path
    while not os.path.lexists(at) and os.path.dirname(at) != at:
        at = os.path.dirname(at)
    if os.path.exists(at) and not os.path.isdir(at):
        raise ConfigError(f"--checkpoint-dir {url}: {'it' if at == path else at} is a file, not a directory")


def plan_start(config: JobConfig, store: Any, *, job_id: str) -> StartPlan:
    """Decide how a driver of ``config`` starts, with ``store`` (:func:`open_store`) and ``job_id`` as its own.

    Writes the job's record to a store that has none. Raises ConfigError (the same job already
    running here) or CheckpointError (unreadable storage) before anything starts.
    """
    try:
        # Records (the job's secret, its workers' kept output) of drivers gone a day past their grace go first, as
        # ``status`` deletes them: a machine whose user never ran ``status`` kept every killed driver's (review h13).
        prune_gone(list_jobs(), time.time())
    except ConfigError as exc:  # the records' folder unreadable: said where the driver writes its own
        log.debug("could not prune the records of drivers gone long ago: %s", exc)
    if store is None:
        return _without_store(config, job_id)
    return replace(_plan(config, store, job_id), checkpoint_dir=config.checkpoint_dir)


def _plan(config: JobConfig, store: Any, job_id: str) -> StartPlan:
    from cloud_elastic.checkpoint import read_job_record
    from cloud_elastic.checkpoint.claims import newest_claim

    adopt, previous = _adoptable(config)
    record = read_job_record(store)
    if record is None:
        found = store.list()
        linked = newer_link(store, found)
        if linked:  # the checkpoints' job is not known either: moving the folders back is what is needed first
            raise ConfigError(f"{linked} ({store.url} holds no job record, job.json, either)")
        if found or store.unreadable():
            record = _record_lost(config, store, found)  # checkpoints whose record went: resume them, never restart
        else:
            refuse_if_job_gone(store)  # a job that ran here, its state and record gone: not trained over again
            _refuse_if_store_lost(config, store)  # the same, known from this machine's record of a dead driver
            refuse_if_moved(config.command, config.checkpoint_dir, store)  # its dead driver checkpointed elsewhere
    if record is None:
        job_id = adopt.job_id if adopt is not None else job_id
        _claim(store, config, job_id)
        log.info("job %s: checkpoints go to %s", job_id, store.url)
        plan = _with_wait(StartPlan(job_id, adopt=adopt, grace_s=config.driver_grace_s), config,
                          previous if adopt is not None else None, None, store)
        # Without a job record here, a dead driver of the same command checkpointed elsewhere or not at all (the
        # restart adds or changes --checkpoint-dir): its workers train on beside ours unless waited out.
        return plan if adopt is not None else _same_command(config, plan)
    if record.command != tuple(config.command):
        log.warning("job %s was started with the command %s; resuming it with %s",
                    record.job_id, " ".join(record.command), " ".join(config.command))
    if adopt is not None and adopt.job_id != record.job_id:
        log.warning("job %s: %s belongs to job %s; not adopting the workers of job %s", adopt.job_id, store.url,
                    record.job_id, adopt.job_id)
        adopt = None
    job_id = record.job_id
    grace = config.driver_grace_s
    recorded_grace = record.extra.get("driver_grace_s")
    if isinstance(recorded_grace, (int, float)) and not isinstance(recorded_grace, bool):
        grace = max(grace, float(recorded_grace))  # the previous workers got the first driver's grace
    if adopt is None:
        previous = _previous_driver(job_id)
    if previous is not None and driver_alive(previous[0], previous[2], previous[1]):
        raise ConfigError(f"job {job_id} is already running here (driver pid {previous[0]}); "
                          "stop it first or use another --checkpoint-dir")
    newest = newest_claim(store)
    previous_alive, by = _previous_alive(store, job_id, record, newest)
    checkpoints = list_checkpoints(store, job_id)  # refused before "resuming it" is said
    say_if_succeeded(store, job_id)  # resumed all the same (a longer schedule, another layout), but said
    plan = StartPlan(job_id, resumed=resumes(store, job_id, announce_none=True, checkpoints=checkpoints,
                                             adopting=adopt is not None),
                     adopt=adopt, grace_s=grace, claims_ahead=_claims_ahead(store, newest))
    generation = _next_generation(store, job_id, grace, newest.generation + 1 if newest is not None else 1)
    return _with_wait(replace(plan, generation=generation), config, previous, previous_alive, store, by)


def _record_lost(config: JobConfig, store: Any, found: list[Any]) -> Any:
    """The job record written again for checkpoints found without one (``job.json`` deleted, or not copied with
    them), from the newest checkpoint's job id; ConfigError when none names its job: a fresh job id and training
    from the start would prune those checkpoints away. ``found``: the readable ones (``store.list()``)."""
    newest = next((c for c in found if c.job_id), None)
    if newest is None:
        raise ConfigError(f"{store.url} holds checkpoints but no job record (job.json), and no checkpoint names "
                          "its job: not starting the training over them; restore job.json, or give an empty "
                          "--checkpoint-dir to start over")
    log.warning("job %s: %s holds checkpoints of this job but no job record (job.json); it is written again and the "
                "job resumes from them", newest.job_id, store.url)
    return _claim(store, config, newest.job_id)


def _claim(store: Any, config: JobConfig, job_id: str) -> Any:
    """The job record of ``job_id`` (naming this driver), written where there is none; ConfigError naming the
    driver that wrote one since we looked: of two drivers started at once on a fresh store, one runs the job."""
    from cloud_elastic.checkpoint import DurableJobRecord, read_job_record, write_job_record

    record = DurableJobRecord(job_id, tuple(config.command), time.time(), extra={
        "driver_grace_s": config.driver_grace_s, "driver": {"host": socket.gethostname(), "pid": os.getpid(),
                                                         "instance": _this_instance()}})
    if write_job_record(store, record, only_if_absent=True):
        return record
    try:
        other = read_job_record(store)
    except CheckpointError:
        other = None  # being written where the storage has no atomic create
    driver = other.extra.get("driver") if other is not None else None
    pid = driver.get("pid") if isinstance(driver, dict) else None
    raise _twice(store, (pid, driver.get("host")) if isinstance(pid, int) else None,
                 f"started job {other.job_id}" if other is not None else "started its job")


def _next_generation(store: Any, job_id: str, grace_s: float, generation: int) -> int:
    """Claim ``generation`` of the job's drivers (:mod:`cloud_elastic.checkpoint.claims`) for this one; ConfigError
    naming the driver that claimed it first: of two drivers restarted at the same moment, one runs the job."""
    from cloud_elastic.checkpoint.alive import DriverAlive
    from cloud_elastic.checkpoint.claims import claim

    other = claim(store, generation, DriverAlive(job_id, time.time(), grace_s, socket.gethostname(), os.getpid()))
    if other is not None:
        driver = other.driver
        raise _twice(store, (driver.pid, driver.host) if driver is not None else None,
                     f"restarted job {job_id} (driver generation {generation})")
    log.info("job %s: driver generation %d", job_id, generation)
    return generation


def _twice(store: Any, driver: tuple[int, Any] | None, did: str) -> ConfigError:
    """The one-line refusal of a driver that lost a claim to ``driver`` (pid, host)."""
    who = "another driver"
    if driver is not None:
        who += f" (pid {driver[0]} on {' '.join(str(driver[1])[:100].split())})"
    did = " ".join(did[:120].split())
    return ConfigError(f"{who} {did} on {store.url} at the same moment; not running it twice: stop that driver "
                       "first or use another --checkpoint-dir")


@dataclass(frozen=True)
class WaitOutcome:
    """After :func:`wait_for_predecessor`: whether the first round resumes from a checkpoint, and whether
    the predecessor's workers are surely gone (False when the wait was interrupted)."""

    resumed: bool
    predecessor_gone: bool


def wait_for_predecessor(plan: StartPlan, store: Any, wait: Callable[[float], bool],
                         stop: Callable[[str, int], None], *, resumed: bool) -> WaitOutcome:
    """Wait until a dead predecessor's workers have stopped (and written their last checkpoint).

    ``wait(seconds)`` waits on the job's lock, True when the job was stopped meanwhile (the wait
    then ends at once: its workers may still run, which our last word must not deny).
    ``stop(reason, code)`` ends the job when another driver turns out to run it, or the
    checkpoints cannot be read. ``resumed``: the first round resumes from a checkpoint already.
    """
    if plan.wait_until is None:
        return WaitOutcome(resumed, True)
    left = plan.wait_until - time.time()
    if left > 0:
        log.warning("job %s: %s; its workers train on for up to --driver-grace %gs: waiting %.0fs for them "
                    "to stop before starting new ones", plan.job_id, plan.waiting_for, plan.grace_s, left)
        while left > 0:
            # Our claim, renewed while we wait, says we are still there: a driver restarted after us yields.
            if wait(min(left, CLAIM_RENEW_S)):
                return WaitOutcome(resumed, False)
            _renew_claim(plan, store)
            left = plan.wait_until - time.time()
    if store is None:
        log.warning("job %s: the previous workers have stopped; training starts over (no --checkpoint-dir)",
                    plan.job_id)
        return WaitOutcome(False, True)
    _another_driver(plan, store, stop)
    if not resumed:
        try:
            resumed = resumes(store, plan.job_id, announce_none=False)  # what the old workers wrote while we waited
        except CheckpointError as exc:
            stop(f"cannot read the checkpoints in {plan.checkpoint_dir}: {exc}", 1)
        except ConfigError as exc:  # refused as a start is: they are there, and must not be trained over
            stop(str(exc), 2)
    return WaitOutcome(resumed, True)


def _refuse_if_store_lost(config: JobConfig, store: Any) -> None:
    """ConfigError when a driver of ``--checkpoint-dir`` died on this machine (its adoption record is still here:
    a driver that ended removes it) while the store holds nothing at all: that driver wrote its job record there as
    it started (``_claim``), so this is not the storage it wrote to (a volume not mounted, a folder moved or
    deleted). Starting a new job there trained the same command from initial weights and succeeded (review h25)."""
    for record, pid, last_alive, started in find_records(runtime_root(), config.checkpoint_dir):
        if driver_alive(pid, started, last_alive):
            continue  # a live driver of it is refused with its own line
        ago = time.time() - last_alive
        raise ConfigError(
            f"job {record.job_id}'s driver (pid {pid}) checkpointed to {store.url} and died {ago:.0f}s ago, but "
            f"{store.url} holds nothing of it now (no job.json, checkpoint or claim): not training it again from "
            f"initial weights; mount or restore that storage, or, to start a new job there from initial weights, "
            f"remove that driver's record ({job_dir(record.job_id) / RECORD_NAME})")


def _adoptable(config: JobConfig) -> tuple[AdoptionRecord | None, tuple[int, float, float] | None]:
    """The adoption record of a dead driver of ``--checkpoint-dir`` whose workers may still run, and
    (pid, last sign of life, start) of that driver; (None, None) when there is none worth adopting."""
    for record, pid, last_alive, started in find_records(runtime_root(), config.checkpoint_dir):
        if driver_alive(pid, started, last_alive) or not record.workers:
            continue  # a live driver is refused by plan_start
        left = last_alive + record.grace_s - time.time()
        if left < ADOPT_MARGIN_S:
            log.info("job %s: the previous driver died %.0fs ago, past its workers' --driver-grace %gs: "
                     "not adopting them", record.job_id, time.time() - last_alive, record.grace_s)
            return None, (pid, last_alive, started)
        log.warning("job %s: the previous driver (pid %d) died %.0fs ago; adopting its %d running worker(s) "
                    "(they train on for up to %.0fs more)", record.job_id, pid, time.time() - last_alive,
                    len(record.workers), left)
        return replace(record, grace_ends=last_alive + record.grace_s), (pid, last_alive, started)
    return None, None


def _without_store(config: JobConfig, job_id: str) -> StartPlan:
    """The plan without ``--checkpoint-dir``: wait out the workers of the dead drivers of the same command whose
    grace has not run out (see module docstring); none can be adopted."""
    return _same_command(config, StartPlan(job_id))


def _same_command(config: JobConfig, plan: StartPlan) -> StartPlan:
    """``plan``, waiting out the workers of the dead drivers of the same command (this user's records on this
    machine) whose grace has not run out: they did not checkpoint to this job's ``--checkpoint-dir``, if any, so
    none can be adopted, and they train on the same hosts and devices until then."""
    now, job_id = time.time(), plan.job_id
    if config.command[:1] in (("<ray actor>",), ("<spark task>",)):
        return plan  # Ray's actors and Spark's tasks end with the driver that started them: nothing to wait out
    try:
        # The same command in another directory is another project's job (``python train.py`` is common).
        records = find_jobs(config.command, cwd=os.getcwd())
    except ConfigError as exc:  # the job runs without its records (see Driver._record_for_status)
        log.warning("job %s: cannot look for a previous driver of this command: %s", job_id, exc)
        return plan
    for record in records:
        if driver_alive(record.pid, record.started, record.last_seen):
            continue  # two drivers of one command at once is not a restart; left as it always was
        # Its workers stop at its last sign of life (refreshed every RECORD_TOUCH_S) plus their grace.
        until = record.last_seen + RECORD_TOUCH_S + record.grace_s + _STOP_S
        if until > max(now, plan.wait_until or 0.0):
            theirs = _checkpointed_to(record.job_id)
            plan = replace(plan, wait_until=until, grace_s=max(plan.grace_s, record.grace_s), predecessor_gone=False,
                           waiting_for=f"the previous driver of this command (job {record.job_id}, pid {record.pid}) "
                                       f"died {now - record.last_seen:.0f}s ago, and " + (
                                           "without --checkpoint-dir its workers cannot be adopted (use "
                                           "--checkpoint-dir to keep their progress)" if config.checkpoint_dir is None
                                           and theirs is None else "without --checkpoint-dir its workers cannot be "
                                           f"adopted (it checkpointed to {theirs}: stop this one and run it again "
                                           f"with --checkpoint-dir {theirs} to resume its progress)"
                                           if config.checkpoint_dir is None
                                           else f"its workers, which did not checkpoint to {config.checkpoint_dir}, "
                                                "cannot be adopted"))
    return plan


def _checkpointed_to(job_id: str) -> str | None:
    """The ``--checkpoint-dir`` of job ``job_id``'s dead driver, as its adoption record on this machine says."""
    try:
        record = read_record(job_dir(job_id))
    except ConfigError:
        return None
    return None if record is None else " ".join(record.checkpoint_dir[:500].split()) or None


def _with_wait(plan: StartPlan, config: JobConfig, previous: tuple[int, float, float] | None, previous_alive: Any,
               store: Any, by: str | None = None) -> StartPlan:
    """``plan`` with the wait for a dead predecessor's workers: the later of its last signs of life (this
    machine's private record, the entry beside the checkpoints, which is all a driver restarted on
    another machine has), plus its grace and the time a last checkpoint takes."""
    grace = max(plan.grace_s, config.driver_grace_s)
    lives = []  # (last sign of life + how stale it can be, who)
    if previous is not None:
        pid, last_alive, _started = previous
        lives.append((last_alive + RECORD_TOUCH_S, f"the previous driver (pid {pid}) died "
                                                    f"{time.time() - last_alive:.0f}s ago"))
    if previous_alive is not None:
        from cloud_elastic.checkpoint.alive import ALIVE_RECORD, REFRESH_S

        grace = max(grace, previous_alive.grace_s)
        by = store.backend.url(by or ALIVE_RECORD)
        # A dead driver was not alive after now: a sign of life ahead of this clock is skew (waiting on it would
        # add the skew to the wait). A live one refreshes it during the wait, and _another_driver sees that.
        now = time.time()
        ago = (f"{now - previous_alive.alive:.0f}s ago" if previous_alive.alive <= now else
               f"at a time {previous_alive.alive - now:.0f}s ahead of this machine's clock (taken as now)")
        lives.append((min(previous_alive.alive, now) + REFRESH_S, (
            f"the previous driver (pid {previous_alive.pid} on {previous_alive.host}) was last alive {ago} by {by}"
            + ("" if previous is not None else ", and this machine has no record of it"))))
    if not lives:
        return replace(plan, grace_s=grace)
    last, who = max(lives)
    return replace(plan, wait_until=last + grace + past_grace_s(config.heartbeat_timeout_s) + _LAST_CHECKPOINT_S,
                   waiting_for=who, grace_s=grace,
                   previous_alive=previous_alive, predecessor_gone=False)


def _another_driver(plan: StartPlan, store: Any, stop: Callable[[str, int], None]) -> bool:
    """After the wait: a driver elsewhere that refreshed the entry meanwhile is alive, or one that claimed a
    newer generation while this one waited will run the job; leave the job to it."""
    if _claimed_since(plan, store, stop):
        return True
    if plan.previous_alive is None:
        return False
    from cloud_elastic.checkpoint.alive import read_driver_alive

    try:
        now = read_driver_alive(store)
    except CheckpointError as exc:
        log.warning("job %s: %s", plan.job_id, exc)
        return False
    if (now is not None and not now.stopped and now.alive > plan.previous_alive.alive
            and not now.is_this_process()):
        stop(f"job {plan.job_id} is already running: its driver (pid {now.pid} on {now.host}) was alive "
             f"{max(0.0, time.time() - now.alive):.0f}s ago; stop it first or use another --checkpoint-dir", 2)
        return True
    return False


#: How often a driver waiting out a predecessor renews its claim, and how old a renewal may be and still count.
CLAIM_RENEW_S = 5.0
CLAIM_LIVE_S = 4 * CLAIM_RENEW_S


def _renew_claim(plan: StartPlan, store: Any) -> None:
    if plan.generation is None:
        return
    from cloud_elastic.checkpoint.alive import DriverAlive
    from cloud_elastic.checkpoint.claims import renew

    try:
        renew(store, plan.generation, DriverAlive(plan.job_id, time.time(), plan.grace_s, socket.gethostname(),
                                                  os.getpid()))
    except CheckpointError as exc:
        log.warning("job %s: %s", plan.job_id, exc)


def _claimed_since(plan: StartPlan, store: Any, stop: Callable[[str, int], None]) -> bool:
    """A driver that claimed the job before this one (an older generation) and renewed its claim lately waits
    too, or has just started to run the job: the older one goes on, this one stops. A newer one yields to us the
    same way, so two supervised drivers restarted together never take turns for good. A claim not renewed for
    :data:`CLAIM_LIVE_S` is a driver that died or has run the job long enough for its sign of life to speak; one
    dated ahead of this clock when planned (:attr:`StartPlan.claims_ahead`) is live only if renewed since."""
    if plan.generation is None:
        return False
    from cloud_elastic.checkpoint.claims import claims_between

    try:
        older = claims_between(store, 0, plan.generation)
    except CheckpointError as exc:
        stop(f"job {plan.job_id}: cannot read the driver claims in {plan.checkpoint_dir}: {exc}", 1)
        return True
    now, ahead = time.time(), dict(plan.claims_ahead)
    # A claim dated ahead of this clock when planned is a skewed clock's, not a recent one: a dead driver's that
    # was itself a restart would read as renewed "lately" for the whole skew. It counts once renewed since.
    live = [c for c in older if c.driver is not None and now - c.driver.alive <= CLAIM_LIVE_S
            and ahead.get(c.generation) != c.driver.alive and not c.driver.is_this_process()]
    if not live:
        return False
    first = live[0]
    driver = first.driver
    who = f" (pid {driver.pid} on {' '.join(str(driver.host)[:100].split())})"
    stop(f"job {plan.job_id}: another driver{who} restarted it first (driver generation {first.generation}; this "
         f"one is {plan.generation}) and still waits or runs; not running it twice", 2)
    return True


def _claims_ahead(store: Any, newest: Any) -> tuple[tuple[int, float], ...]:
    """(generation, time) of each claim up to ``newest`` dated ahead of this machine's clock (see
    :attr:`StartPlan.claims_ahead`); CheckpointError when they cannot be listed."""
    from cloud_elastic.checkpoint.claims import claims_between

    if newest is None:
        return ()
    now = time.time()
    return tuple((c.generation, c.driver.alive) for c in claims_between(store, 0, newest.generation + 1)
                 if c.driver is not None and c.driver.alive > now)


def _this_instance() -> str:
    from cloud_elastic.checkpoint.alive import THIS_INSTANCE

    return THIS_INSTANCE


def driver_alive(pid: int, started: float | None = None, last_seen: float | None = None) -> bool:
    """Whether ``pid`` is a live cloud-elastic process (a pid reused by anything else does not count).

    ``started``: a time the driver is known to have run (its record written, a sign of life), and ``last_seen``
    its latest (``started`` if None): a record not refreshed lately names the driver only if the pid's process
    had started by then (:func:`cloud_elastic.records.driver_running`). A dead driver's pid reused by another
    process, one whose command line says ``cloud`` too (amazon-cloudwatch-agent, cloud-init, another job's
    fork server), would otherwise refuse every restart with exit code 2, which a supervisor does not retry.
    Never this process: a record naming its pid was left by a dead driver whose pid it reuses (a container's
    PID 1, restarted in place), which must be waited out or adopted, not taken for a live one."""
    if pid == os.getpid() or not pid_alive(pid):
        return False
    if started is not None and not driver_running(pid, started, started if last_seen is None else last_seen,
                                                  time.time()):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"cloud" in f.read()
    except OSError:  # no /proc (not Linux): trust the pid
        return True


def _previous_alive(store: Any, job_id: str, record: Any, newest: Any) -> tuple[Any, str | None]:
    """The latest sign of life of a driver of ``job_id``, with the name of the record it was read from: the one
    left beside the checkpoints, unless it ended cleanly; without one, the creation of ``record`` (``job.json``)
    by the driver it names; and the newest claim (``newest``, :mod:`cloud_elastic.checkpoint.claims`) of a
    driver other than the one that left it. A creation or claim is the sign of life of a driver that writes its
    own a moment later (or never, having lost to a live one); a claim carries the groups raised and the cost the
    entry gives (its driver carried them while it waited).

    ConfigError when it is a live driver on this machine (whose local record was lost).
    """
    from cloud_elastic.checkpoint.alive import read_driver_alive

    signs = []  # (sign of life, the record it was read from, whether it is a driver's first word)
    try:
        entry = read_driver_alive(store)
        signs.append((entry, None, False) if entry is not None else (_creator(record), "job.json", True))
    except CheckpointError as exc:
        # Which groups it raised is lost with it: a group left raised is paid for, and only an operator can tell.
        log.warning("job %s: %s; only this machine's record and the drivers' claims are used, and the host groups the "
                    "previous driver raised (--manage-capacity), if any, are not known: each stays at the desired "
                    "capacity it had (paid for): set it to 0 yourself once nothing needs it", job_id, exc)
        entry = None
    claimed = newest.driver if newest is not None else None
    if claimed is not None and (entry is None or (entry.host, entry.pid) != (claimed.host, claimed.pid)):
        # A claim says nothing of the groups raised nor of the cost: its driver carried the entry's while it
        # waited (and died before its own sign of life would have said them); without them, a raised group is
        # left paid for by every later driver.
        carried = {} if entry is None or entry.stopped or entry.job_id != job_id else dict(
            raised=entry.raised, cost=entry.cost, refused=entry.refused)
        signs.append((replace(claimed, alive=min(claimed.alive, time.time()), **carried), newest.path, True))
    best: tuple[Any, str | None] = (None, None)
    for sign, by, first in signs:
        if sign is None or sign.job_id != job_id or sign.stopped or sign.is_this_process():
            continue
        if sign.host == socket.gethostname():
            if driver_alive(sign.pid, sign.alive):
                raise ConfigError(f"job {job_id} is already running here (driver pid {sign.pid}); "
                                  "stop it first or use another --checkpoint-dir")
            if first:
                continue  # died here before its first sign of life: its local record tells of any worker
        if best[0] is None or sign.alive > best[0].alive:
            best = (sign, by)
    return best


def _creator(record: Any) -> Any:
    """The driver ``job.json`` names as its creator (:func:`_claim`), alive when it created it (never later
    than now: storage is not trusted with a wait); None when it names none."""
    from cloud_elastic.checkpoint.alive import DriverAlive

    driver = record.extra.get("driver")
    if not isinstance(driver, dict) or not isinstance(driver.get("host"), str) \
            or type(driver.get("pid")) is not int or not 0 < driver["pid"] < 2**22:  # never 0 or -1: a group
        return None
    instance = driver.get("instance")
    return DriverAlive(record.job_id, min(record.created, time.time()), 0.0, driver["host"][:256], driver["pid"],
                       instance=instance[:64] if isinstance(instance, str) else "")


def _previous_driver(job_id: str) -> tuple[int, float, float] | None:
    """(pid, last sign of life, when it wrote the record, as Unix times) of a driver of ``job_id`` that left its
    status record here."""
    try:
        path = job_dir(job_id) / "driver.json"
        record = json.loads(path.read_text(encoding="utf-8"))
        last_alive = path.stat().st_mtime
        return int(record["pid"]), last_alive, float(record.get("started", last_alive))
    except (OSError, ValueError, KeyError, TypeError, ConfigError):
        return None
