"""The same failure again and again without progress: how many times the job lets it happen.

A job whose workers fail the same way at the same point, with no progress in between, would otherwise go round
for ever (each relaunch forms a round, and a formed round restarts the ``--elastic-timeout`` clock).
:data:`REPEATS` bounds each such loop; the pieces that own the loops count them with a :class:`Streak`, keyed on
how far the job has trained (:meth:`Trained.at`):

* a slot whose worker fails :data:`REPEATS` times in a row without progress is blacklisted for the rest of the job
  (:meth:`.hosts.Blacklist.record_failure`); when that leaves fewer than ``--min-np`` slots, the job ends
  as any job below ``--min-np`` does;
* with ``--checkpoint-dir``, every worker lost :data:`REPEATS` times in a row without progress in between ends the
  job rather than resume again (:meth:`.failures.Failures.fail`); progress there is what the checkpoints hold (a
  resumed attempt that loads the checkpoint an earlier one of the streak loaded got no further), or, for a state
  without fingerprints, a commit of the resumed attempt past the one the job was lost at the time before;
* a round aborted for a stall that re-forms with the same members and stalls again without progress,
  :data:`REPEATS` times in a row, ends the job (:meth:`.completion.Completion.check_progress`), but only
  when every member was waiting inside a collective each time (a mismatch no rank can leave): a member
  busy outside any collective is a straggler, and its stalls never count;
* a worker given up while its process still ran (``WorkerRecord.hung``), :data:`REPEATS` times in a row with no
  progress of the job in between, ends the job, naming it, what it was doing and the remedy (:class:`Hangs`,
  :meth:`.failures.Failures.give_up`); the job's end checkpoints its newest commit first (``ending.FailingEnd``).
  Such a worker is *stuck* (no progress past ``--progress-timeout`` after its round's abort while it still
  heartbeats: a deadlock; it counts as it is given up) or *silent* (its heartbeats stopped for the whole
  ``--heartbeat-timeout``: a hang holding the GIL; one the fast silence rule gave up sooner never counts, a
  healthy C call may hold the GIL for seconds). A silent one counts only once its process was killed
  (:meth:`.failures.Failures.signal_stacks`), and never if a heartbeat of it arrived after its give-up (a frozen
  host that thawed). Where its stacks signal is armed it counts only if it printed its stacks on the signal the
  stop sends: ``faulthandler``'s handler needs no GIL, so a GIL-hung process prints them, while a frozen host or
  one whose network is down (its ssh session still open) prints nothing, and such an outage never counts. Where it
  is not (the script handles SIGUSR1, a wrapper gets the signal, a Ray, Spark or adopted process cannot be asked)
  its silence alone counts: an outage longer than ``--heartbeat-timeout``, three times without progress, then does.
  Workers given up together count once, however many scans found them and in whatever order: every member of one
  stuck round, and every worker of one outage (already running when its first worker was given up, and given up
  within one ``--heartbeat-timeout`` of it, on any host: a network drop of several hosts; a host's round member and
  its newcomer); a worker relaunched after a give-up, or one that ran on past the outage, counts again. Any
  progress starts the count again, so an elastic job that trains on without it never ends this way (its slot only
  cools down), and neither does a straggler that comes back.

*Progress* is what was trained, not how many commits were made (:class:`Trained`). Horovod's own loop
(``for state.batch in range(state.batch, N): ...; state.commit()``) redoes the restored batch after each restore
and commits it again before the bug recurs: every relaunch adds a commit, yet trains nothing new. So each worker
reports with its heartbeats and at rendezvous a fingerprint of the state it would restore: its committed state's
plain attributes (``batch``, ``epoch``, ``step``: what ``State(**kwargs)`` and ``TorchState(model, opt, **kwargs)``
hold besides tensors) and its samplers' positions (``worker.commit.fingerprint``; floats are left out: a metric such
as ``state.loss`` differs at each redo). Progress is a worker's fingerprint changing from one report of it to its
next: a commit that moved the state on from the one before (a redo commits the restored attributes again, and
changes nothing). Changes are counted, not states never seen: a job whose ``batch`` starts again each epoch, the
epoch kept where no fingerprint looks (a scheduler, a tensor), moves on at every commit all the same. The
fingerprints are trusted only once a worker saw them say where training is, so that a job that trains on is never
stopped for attributes that do not: a worker marks its fingerprint once a commit of its process held attributes
other than those of the state it followed (its previous commit, or the state it restored, was synced or loaded),
and says they cannot tell (for good) once they stood still over training, i.e. a commit held its predecessor's
attributes after an optimizer step, or the restored state's after two of one optimizer (Horovod's redo is one step
of each; a step kept in a tensor, or ``epoch`` alone committed every N batches, stands still over more). Until a
worker marked one, or once one said so, the commit counts as before: a commit past the one of the last failure is
progress. Known limit: a bug in a process's first commit interval of a job whose attributes no process saw move
yet (e.g. Horovod's ImageNet example failing before its second commit) is measured by the commit count, which
Horovod's loop raises at each redo: it is not caught.

Only a failure the worker's own process caused counts (:func:`own_failure`): an exception its script
reported, a non-zero exit code, or death by a crash signal (:data:`CRASH_SIGNALS`). A worker killed from
outside (SIGKILL or SIGTERM: a spot reclaim, a preemption, the OOM killer), a host that could not be reached
and a host lost from discovery keep the usual growing cooldown, however often they happen: a flapping host or
a storm of reclaims is not the script's fault (under ``--blacklist-cooldown-range 0 0`` any failure of a worker
blocks its slot for good, as Horovod does). A host that leaves discovery and comes back starts with a clean
record, but a slot blocked for good stays so unless a new instance holds the address
(:meth:`.hosts.HostManager.update`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Hashable

from cloud_elastic.protocol_reports import UNTOLD  # what a worker reports once its attributes cannot tell

__all__ = ["REPEATS", "CRASH_SIGNALS", "OUTSIDE_SIGNALS", "SILENT", "REMEMBERED", "UNTOLD", "Hangs", "Streak",
           "Trained", "death_signal", "own_failure"]

#: How many times the same failure, without progress, ends its loop (see the module docstring). Three:
#: a second failure may still be bad luck (a host lost twice), a third in the same place is the script's.
REPEATS = 3
#: How many workers' last fingerprints a job remembers, the oldest reporter forgotten first (a worker that reports
#: again after this many others counts its next report as its first: no change either way).
REMEMBERED = 4096

#: The signals a process dies by of its own doing (an abort(), a bad memory access, a bad instruction).
CRASH_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})
#: Killed from outside (a reclaim, a preemption, the OOM killer, an operator): never the script's fault.
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM})
#: What a worker given up for silence while its process still ran was doing, as far as the driver can tell; it
#: counts once it has printed its stacks on the driver's signal (see the module docstring).
SILENT = "silent (holding the GIL?)"


def death_signal(exit_code: int) -> int | None:
    """The signal a worker process died by, as its exit code tells: ``-N`` for signal N; under a shell wrapper
    (``bash run.sh`` whose ``python`` child died), the shell's ``128 + N``, read as a signal only for the ones the
    job's rules tell apart (:data:`CRASH_SIGNALS`, :data:`OUTSIDE_SIGNALS`), so ``sys.exit(130)`` stays a code.
    None when it did not die by one of those (or a signal at all). The one place both the repeat count
    (:func:`own_failure`) and the failure's line (``exit_status.LastErrors.attach``) read it."""
    if exit_code < 0:
        return -exit_code
    if exit_code > 128 and exit_code - 128 in CRASH_SIGNALS | OUTSIDE_SIGNALS:
        return exit_code - 128
    return None


def own_failure(error: str, exit_code: int | None, transport: bool) -> bool:
    """Whether a worker's failure is its own process's doing, and so counts toward a repeat: it reported an
    exception (``error``), or its process ended with a non-zero code or a crash signal (``exit_code``, ``-N``
    for signal N, or a shell's ``128 + N``: :func:`death_signal`). Not when its host could not be reached
    (``transport``), it was killed from outside, or its end is unknown (given up as silent or stuck)."""
    if transport:
        return False
    if error:
        return True
    if exit_code is None or exit_code == 0:
        return False
    died_by = death_signal(exit_code)
    return exit_code > 0 if died_by is None else died_by in CRASH_SIGNALS


@dataclass
class Streak:
    """How many times in a row the same thing (``key``) happened; another key starts the count again at 1."""

    key: Hashable = None
    count: int = 0

    def note(self, key: Hashable) -> int:
        """``key`` happened (again): return how many times in a row it has now."""
        if self.count and key == self.key:
            self.count += 1
        else:
            self.key, self.count = key, 1
        return self.count

    def clear(self) -> None:
        """Something else happened in between: the next :meth:`note` counts from 1."""
        self.key, self.count = None, 0


@dataclass
class Trained:
    """How far the job has trained, as the fingerprints of its committed states tell (see the module docstring).

    Fed every fingerprint a worker reports (:meth:`note`: the state it would restore, with each heartbeat and at
    rendezvous) and every one a checkpoint load reports (``stored=True``). :attr:`mark` counts the changes: a
    worker's fingerprint that differs from its previous report, or, for its first, from the newest fingerprint the
    job heard of (reported or loaded: the state a newcomer was synced to, or an attempt resumed from), so Horovod's
    redo of a restored batch leaves it where it was, and a new process whose first report comes after its first
    commit moved on; a checkpoint load that differs from the newest fingerprint heard is a change too (the attempt
    before it committed and saved a state no heartbeat told of, then every worker was lost). :attr:`loads` counts
    the loads of a state other than the previous load's. Pure and bounded: one dict of at most
    :data:`REMEMBERED` short strings."""

    #: Changes of a worker's fingerprint so far, and loads of another state than the load before.
    mark: int = 0
    loads: int = 0
    #: False once a worker said its state's attributes do not tell its commits apart (:data:`UNTOLD`): for good.
    telling: bool = True
    #: Whether a worker marked its fingerprint (``+``): its process saw its attributes move with training
    #: (``worker.ledger.CommitLedger.trained``); from then on every worker's reports count.
    heard: bool = False
    _last: dict[str, str] = field(default_factory=dict)
    _newest: str | None = None
    _loaded: str | None = None

    def note(self, fingerprint: str, worker: str = "", *, stored: bool = False) -> None:
        """``worker`` reported ``fingerprint`` ("": none, a state without plain attributes or not committed yet;
        ``+`` first: marked); ``stored``: the state a checkpoint load gave (the loader's own reports follow from it:
        no change of :attr:`mark`)."""
        if not fingerprint:
            return
        if stored:
            if fingerprint != self._loaded:
                self._loaded = fingerprint
                self.loads += 1
            if self._newest is not None and fingerprint != self._newest:
                self.mark += 1  # a checkpoint holding a state no report told of: its attempt moved on and was lost
            self._newest = fingerprint
            return
        if fingerprint == UNTOLD:
            self.telling = False
            return
        if fingerprint.startswith("+"):
            self.heard = True
            fingerprint = fingerprint[1:]
        before = self._last.pop(worker, self._newest)  # re-inserted: the newest reporter last
        self._last[worker] = self._newest = fingerprint
        if len(self._last) > REMEMBERED:
            del self._last[next(iter(self._last))]
        if before is not None and before != fingerprint:
            self.mark += 1

    @property
    def tells(self) -> bool:
        """Whether the fingerprints measure progress: a worker marked its own (its attributes moved with training),
        and none said they cannot."""
        return self.telling and self.heard

    def at(self, commit: int) -> Hashable:
        """The guards' key for the job at ``commit``: how often its committed states moved on where the fingerprints
        tell, else the commit itself (a state without plain attributes: the commit-count rule)."""
        return ("trained", self.mark) if self.tells else commit

    def loaded(self) -> Hashable | None:
        """The key of every-worker-lost's streak (None where the fingerprints do not tell, or no load reported one:
        the commit-count rule then): how often a checkpoint load gave another state than the load before. What an
        attempt trained and lost with its workers is no progress (the next attempt resumes from where it did); one
        whose checkpoint moved on is. Known limit: a state whose fingerprint comes back (``batch`` starting again
        each epoch) loaded by attempts an epoch apart, lost at the same batch each time, looks the same."""
        return ("loaded", self.loads) if self.tells and self.loads else None

    @property
    def nothing(self) -> str:
        """What "without progress" means now, for the end lines: no commit, or none that moved the state on."""
        return "no commit that moved the state on" if self.tells else "no commit"

    def none_between(self, commit: int) -> str:
        """``at commit N, with no commit past it in between`` (or none that moved the state on), for the end lines."""
        return f"at commit {commit}, with {self.nothing if self.tells else 'no commit past it'} in between"


@dataclass
class Hangs:
    """Workers given up while their process still ran (``WorkerRecord.hung``), in a row without progress of the job.

    Workers given up together count once: each give-up comes with the keys of what it was part of (the round it was
    a member of, the outage it was given up in: see ``Failures._together``), and one that shares a key with a give-up
    already counted since the last progress counts 0. Every key seen since is kept (progress clears them): only
    the last one kept, one outage of two hosts whose workers the scans found in the order b, c, b counted 3 and ended
    a healthy job. Not a blacklist: the slot keeps its usual cooldown; the job ends at the :data:`REPEATS`-th (see the
    module docstring)."""

    streak: Streak = field(default_factory=Streak)
    _keys: set[Hashable] = field(default_factory=set)
    #: The workers given up as hung since the last progress, counted or not, first give-up first: id -> (host, slot).
    workers: dict[str, tuple[str, str]] = field(default_factory=dict)

    def given_up(self, at: Hashable, together: frozenset[Hashable], worker: str = "", host: str = "",
                 slot: str = "") -> int:
        """A hung worker (``worker`` on ``slot`` of ``host``) was given up with the job at ``at`` (how far it had
        trained: :meth:`Trained.at`), as part of everything in ``together``: how many such give-ups in a row there are
        now with no progress in between (0: it shares a key with a give-up already counted since; its other keys join
        that one's)."""
        if not self.streak.count or at != self.streak.key:
            self._keys.clear()
            self.workers.clear()
        self.workers[worker] = (host, slot)
        if self._keys & together:
            self._keys |= together
            return 0
        self._keys |= together
        return self.streak.note(at)

    def line(self, worker: str, commit: int, times: int, doing: str, nothing: str = "no commit") -> str:
        """The job's end line: the worker (``host[slot] (rank N)``), the commit, how many times, what it was doing
        (:data:`SILENT` first for one given up for silence), and the timeout that gave it up, to raise; ``nothing``:
        what came in between (no commit; or none of a new state, :meth:`Trained.none_between`). Where the
        give-ups were of more than one slot (an outage of several hosts, then others), it says how many workers on
        which hosts were given up, and names the last one."""
        remedy = ("raise --heartbeat-timeout if its script can hold the GIL that long" if doing.startswith(SILENT)
                  else "raise --progress-timeout if this step can take longer")
        if len(set(self.workers.values())) <= 1:  # one slot's worker each time (relaunched after each give-up)
            return (f"no progress: worker {worker} was given up {times} times in a row at commit {commit}, its process "
                    f"still running each time and {nothing} in between; what it was doing: {doing}; {remedy}")
        hosts = list(dict.fromkeys(host for host, _ in self.workers.values()))
        on = f"on host {hosts[0]}" if len(hosts) == 1 else f"on {len(hosts)} hosts ({', '.join(hosts[:8])}" + (
            ", ...)" if len(hosts) > 8 else ")")
        return (f"no progress: hung workers were given up {times} times in a row at commit {commit} "
                f"({len(self.workers)} workers {on}; those given up together, in one outage or one round, count "
                f"once), their processes still running each time and {nothing} in between; the last: worker {worker}, "
                f"what it was doing: {doing}; {remedy}")
