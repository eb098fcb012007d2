"""A restarted driver adopting its predecessor's running workers: the job's side of adoption.

The runtime side (the predecessor's record, its ports and secret, the window's
deadline) is in :mod:`cloud_elastic.driver.restart`; this piece decides what the job makes of the
workers that come back:

* :meth:`Adoption.begin`: the window opens; worker ids go on from the
  predecessor's highest sequence number, so none is ever reused;
* :meth:`Adoption.adopt`: a worker is adopted where it stands, keeping its
  round, rank and process group (nothing forms, nothing rolls back); the job's
  round, update generation and aborted round continue from the highest any
  adopted worker has seen, so every later round number (and store namespace)
  is new to them. Idempotent for a worker already adopted;
* :meth:`Adoption.end`: the window closes. When the adopted members form their
  round completely, the job goes on in it (zero steps lost); otherwise the
  round is aborted and the normal failure path applies (survivors roll back, a
  new round forms, from the latest checkpoint if no state holder came back).
  When a worker came back saying its training function had returned and the
  driver had said ``done`` (``AdoptRequest.completed``), the training is over:
  such workers complete again once discovery has answered (:meth:`Adoption.finish`;
  the job goes straight to finishing and waits for their exit; nothing trains
  again); a member of the round that did not come back had exited: it fails the
  job if its exit report (``driver.restart.record.exit_reports``, or fetched
  from its SSH host: ``driver.restart.remote_reports``) says a non-zero code,
  or if it left none, as its work after training is unknown. The predecessor itself saw the members that exited
  while it was up: it kept their exit codes in its adoption record (:meth:`Adoption.exits`), which count as their
  exit reports (an SSH worker's report on its host is asked for only while it runs); one it had from the process's
  real exit status is final (the window lets no report override it), and the judgements :meth:`Adoption.finish`
  made are kept there too, for a driver restarted after this one;
* :meth:`Adoption.exiting` and :meth:`Adoption.exit_status`: every worker says at
  exit the exit code it exits with (the control plane's ``exiting``); a process whose
  status this driver cannot learn (adopted, so not its child; or started by a local
  fork server that died) has that code for its status; one that said none has an
  unknown status, which fails a completed job
  (:meth:`~.completion.Completion.exited_after_completing`); the exit of a member of a finishing round is kept for
  :meth:`Adoption.exits`.
"""

from __future__ import annotations

import logging
from typing import Callable, Collection, Mapping

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.exit_status import ExitStatus, reported_error_line, signal_name
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.protocol import AdoptRequest, RankInfo

__all__ = ["Adoption"]

log = logging.getLogger(__name__)

S = WorkerState
_MEMBER = (S.RUNNING, S.DRAINING)


class Adoption:
    """The adoption window of one restarted job (see module docstring)."""

    def __init__(self, job: JobView, seen_seq: Callable[[int], None],
                 adopt_round: Callable[[dict[str, RankInfo], int, float], None],
                 completed: Callable[..., tuple[str, str]]) -> None:
        """``seen_seq(seq)``: a worker numbered ``seq`` exists; ``adopt_round(ranks, update_gen, now)``: the job
        goes on in the current round with these ranks from ``now``; ``completed(worker_id, now, error=)``: a
        worker's training function returned (``Completion.completed``)."""
        self._job = job
        self._seen_seq = seen_seq
        self._adopt_round = adopt_round
        self._completed = completed
        self._done: set[str] = set()  # adopted after its training function returned (AdoptRequest.completed)
        self._pending: tuple[list[tuple[int, str]], dict[str, RankInfo]] | None = None  # for finish()
        self._told: dict[str, int] = {}  # worker id -> the exit code it said it exits with
        self._open = False  # the window is open: workers of the predecessor may re-register
        self._adopted: dict[int, dict[str, tuple[RankInfo, int]]] = {}  # round -> id -> (ranks, gen)
        self._exits: dict[int, dict[str, object]] = {}  # rank -> exit report of a member of the finishing round

    @property
    def open(self) -> bool:
        """The window is open, or it closed with workers adopted after their training function returned that
        have not completed again yet (:meth:`finish`): meanwhile the job launches nothing (``job.adopting``), as
        the slots of their peers that had exited are not free for a new worker: the job is finishing."""
        return self._open or self._pending is not None

    @open.setter
    def open(self, value: bool) -> None:
        self._open = value

    @property
    def finishing(self) -> bool:
        """The window closed with workers adopted after their training function returned (:meth:`finish` is to
        come): the exit reports of their peers that did not come back decide how the job ends."""
        return self._pending is not None

    def begin(self, last_seq: int) -> None:
        """Open the window; ``last_seq`` is the highest worker sequence number the predecessor used."""
        self.open = True
        self._seen_seq(last_seq)

    def adopt(self, worker_id: str, slot: Slot, seq: int, request: AdoptRequest, now: float) -> str | None:
        """Adopt a running worker of the predecessor where it stands; None when adopted, else why not."""
        job = self._job
        w = job.workers.get(worker_id)
        if w is not None:
            return None if w.alive else f"worker {worker_id} was already given up"
        if not self._open:
            return "the adoption window of the restarted driver has closed"
        self._seen_seq(seq)
        w = WorkerRecord(worker_id, slot, seq, launched_at=now, last_seen=job.running(now), commits=request.commits,
                         commit_seq=request.commit_seq)
        job.commit_high = max(job.commit_high, request.commit_seq)
        job.commit_base = max(job.commit_base or 0, request.commit_seq)  # its cost per commit counts from here
        if request.round and request.ranks is not None:
            w.state, w.round, w.rank = S.RUNNING, request.round, request.ranks.rank
            self._adopted.setdefault(request.round, {})[worker_id] = (request.ranks, request.update_gen)
            if request.completed:
                self._done.add(worker_id)  # a member until the window closes; then it completes again (end)
        else:
            w.state = S.CONNECTED
        job.workers[worker_id] = w
        job.update_gen = max(job.update_gen, request.seen_update)
        job.abort_round = max(job.abort_round, request.seen_abort)
        job.round = max(job.round, request.round)
        if w.holds_state:
            job.state_committed = True
        log.info("job %s: adopted worker %s (%s) of round %d at commit %d%s", job.job_id, worker_id, w.label,
                 request.round, request.commit_seq or request.commits,
                 "; its training function had returned" if worker_id in self._done else "")
        job.emit("worker_adopted", worker=worker_id, host=slot.host, slot=slot.index, round=request.round,
                 rank=w.rank, commit_step=request.commit_seq or None)
        return None

    def end(self, now: float, missing: dict[str, str]) -> None:
        """Close the window; ``missing`` (worker id -> what became of it) did not come back."""
        job = self._job
        self.open = False
        members = self._adopted.get(job.round, {})
        job.emit("adoption_done", round=job.round, adopted=len(members), missing=sorted(missing))
        if not members:
            return
        job.phase = Phase.RUNNING
        ranks = {wid: ranks for wid, (ranks, _gen) in members.items()}
        self._adopt_round(ranks, max(gen for _ranks, gen in members.values()), now)
        sizes = {r.size for r in ranks.values()}
        complete = len(sizes) == 1 and sorted(r.rank for r in ranks.values()) == list(range(sizes.pop()))
        # Workers the predecessor had launched that never joined a round are newcomers: they are
        # admitted at a commit like any other, and one that did not come back is simply replaced.
        # Only a member of an older round (its group cannot go on) or a missing member of this
        # one makes the adopted round unusable.
        stragglers = [w.worker_id for w in job.alive()
                      if w.worker_id not in members and w.state in _MEMBER and w.round != job.round]
        what = "; ".join(f"{wid} {why}" for wid, why in sorted(missing.items()))
        log.warning("job %s: adopted %d running worker(s) of round %d%s", job.job_id, len(members), job.round,
                    f"; not back: {what}" if what else "")
        done = sorted((ranks[wid].rank, wid) for wid in members if wid in self._done)
        if done:
            # They complete once discovery has answered (finish): completing ticks the job, which would take
            # the hosts of workers not completed yet, undiscovered so far, for hosts that left.
            self._pending = (done, ranks)
        elif not complete:
            job.last_failure = (f"round {job.round} is incomplete after the driver restart"
                                + (f" (not back: {what})" if what else ""))
            job.abort()
        elif stragglers:
            job.last_failure = (f"worker(s) {', '.join(sorted(stragglers))} came back in a round older than "
                                f"{job.round}")
            job.abort()

    def finish(self, now: float, reports: Mapping[int, tuple[str, int | None]] | None = None,
               final: Collection[int] = ()) -> None:
        """The window closed and discovery answered: the workers adopted after their training function
        returned complete again (see :meth:`_finish`; ``reports``: rank -> (worker id, exit code) of the round's
        workers that had exited, from their exit reports; ``final``: the ranks whose code there is their process's
        real exit status, not a worker's word). Nothing to do otherwise."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._finish(*pending, now, reports or {}, final)

    def _finish(self, done: list[tuple[int, str]], ranks: dict[str, RankInfo], now: float,
                reports: Mapping[int, tuple[str, int | None]], final: Collection[int]) -> None:
        """The training was over when the predecessor died (``done``: (rank, id) of the workers it had told so): they
        complete again, rank 0 first, and the job finishes (nothing aborts or trains again). A member of the round
        that did not come back had exited (a rank that saves nothing after training): its exit report says how, and
        the job fails once the others exit if it says a non-zero code, or if there is none (killed, or on another
        host: its work after training is unknown). Each judgement is kept for :meth:`exits`: the rank is in no other
        record a driver restarted after this one reads."""
        job = self._job
        size = next(iter(ranks.values())).size
        gone = sorted(set(range(size)) - {r.rank for r in ranks.values()})
        log.warning("job %s: the training of round %d had completed before the driver restart; waiting for the "
                    "work after it", job.job_id, job.round)
        failed = []
        for rank in gone:
            worker_id, code = reports.get(rank, ("", None))
            self._keep(rank, worker_id, code, said=rank not in final)
            if code == 0:
                log.info("job %s: rank %d (%s) of round %d had exited with code 0 after its training function "
                         "returned", job.job_id, rank, worker_id, job.round)
            elif code is not None:
                how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
                failed.append(f"rank {rank} ({worker_id}) {how} after its training function returned")
            else:
                failed.append(f"rank {rank} left no exit code (killed, or its report could not be read)")
        for _rank, worker_id in done:
            error = None
            if failed and worker_id == done[0][1]:
                error = (f"{'; '.join(failed)}, before the driver restart; its work after training may not be done "
                         f"(round {job.round}: the checkpoints stay)")
            self._completed(worker_id, now, error=error)

    def exiting(self, worker_id: str, code: int | None, error: str | None) -> None:
        """Any worker (adopted or not) says it is about to exit with ``code`` (None: it does not know), ``error``
        why: kept for :meth:`exit_status`."""
        if code is None:
            return
        self._told[worker_id] = code
        w = self._job.workers.get(worker_id)
        if w is not None and error and code != 0:
            w.error = reported_error_line(error)  # the failure's end lines name it (see .failures)
        if code != 0:
            log.warning("job %s: worker %s is exiting with code %d%s", self._job.job_id, worker_id, code,
                        f" ({error})" if error else "")

    def exit_status(self, worker_id: str, status: ExitStatus) -> ExitStatus:
        """``status`` of an ended process, or, where it is unknown (adopted, or its fork server died), the code
        the worker said it exits with."""
        code = self._told.get(worker_id)
        said = not status.known and code is not None
        status = status if status.known or code is None else ExitStatus(code)
        self._exited(worker_id, status, said)
        return status

    def _exited(self, worker_id: str, status: ExitStatus, said: bool) -> None:
        """Keep the exit of a member of the round once its training is over (the job is finishing), for
        :meth:`exits` (``said``: its code is the one the worker said, not its process's status)."""
        job = self._job
        w = job.workers.get(worker_id)
        if w is None or job.phase is not Phase.FINISHING or w.round != job.round or w.rank is None:
            return
        self._keep(w.rank, worker_id, status.code if status.known and not status.transport_error else None, said)

    def _keep(self, rank: int, worker_id: str, code: int | None, said: bool) -> None:
        """Keep the exit of rank ``rank`` of the current round, the report's shape: only that round's, so at most one
        per rank; ``said`` (the code is the worker's word) only where it matters, for a code."""
        round_ = self._job.round
        self._exits = {r: e for r, e in self._exits.items() if e["round"] == round_}
        self._exits[rank] = {"v": 1, "round": round_, "rank": rank, "code": code, "error": None, "id": worker_id,
                             **({"said": True} if said and code is not None else {})}

    def exits(self) -> list[dict[str, object]]:
        """The exit reports (``driver.restart.record``'s shape, with the worker's ``id``) of the members of the
        finishing round that exited: the adoption record keeps them, as a worker that exited is no longer in it,
        and a driver restarted after this one judges those members by them."""
        job = self._job
        return [dict(e) for _rank, e in sorted(self._exits.items()) if e["round"] == job.round]
