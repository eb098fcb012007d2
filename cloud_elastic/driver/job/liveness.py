"""Judging worker silence only over time the driver itself was running.

A driver that stalls (a long GC pause, a swapped or throttled VM, SIGSTOP)
hears nothing from its workers while it stalls, through no fault of theirs.
Measured on the wall clock, every worker would look silent afterwards and be
given up at once. :class:`RunningClock` subtracts such stalls: the driver
calls it at least every few tens of milliseconds (its loop ticks every 50 ms),
so a gap between two calls longer than ``max_gap_s`` can only mean that the
driver was not running, and the excess is not counted.

The driver's own heartbeat, a thread that does nothing but read the clock every
0.1 s (``driver/runtime/pulse.py``), makes those calls: busy threads do not delay
it, a paused, starved or swapped process does.

:class:`SilenceWatch` finds the workers to give up: registered ones silent past
the heartbeat timeout (in running time; past :data:`EXIT_GRACE_S` once a worker
said it is past its exit hooks), and ones that never registered within the
start timeout. It is called every step with every live worker, so it skips
the scan exactly when nobody can have become overdue since the last one.

**The fast rule.** A member of the running round is also given up well before
the heartbeat timeout when two independent signs agree:

1. *its heartbeats stopped*: silence since its last heartbeat's *arrival* beyond
   :func:`silence_limit`, an adaptive bound learned from that worker's own
   inter-arrival times (phi accrual: the mean plus :data:`PHI_Z` standard
   deviations above it, so a jittery or loaded worker gets a longer bound), never
   below :data:`FAST_FLOOR_S`, nor below its longest recent gap plus
   :data:`PEAK_MARGIN_S` (a worker once seen silent for 2 s while healthy is
   allowed 2.5 s from then on), nor below the garbage-collector pause it says to
   expect (``pause_s``, see ``worker/link/pauses.py``) plus a heartbeat interval
   and the margin; none before :data:`WARMUP_ARRIVALS` arrivals; nor below the
   longest recent gap usual for the job's other workers (the median of theirs,
   plus the margin): a gap most workers show is the driver's or their machines'
   load, not this one's hang;
2. *its peers wait for it*: other members have waited at least
   :data:`WAIT_MIN_S` in a collective that it has not completed (their flight
   records, see :mod:`.stalls`).

Why this cannot fire on a healthy busy worker: its heartbeat thread shares nothing
with the training thread but the GIL, which Python code hands over every 5 ms and
torch's operators, file and socket I/O release, so a long first step, a
``torch.compile``, a checkpoint write or a busy machine hold a heartbeat up by
milliseconds to a few tenths of a second (measured: docs/architecture.md,
"Silent workers"). What holds the GIL for longer is one C call over a huge object,
above all a full garbage collection, and the worker announces that pause before it
happens (from its heap's size and the collections it measured), so its bound
includes it. A pause it did not announce (a C extension that keeps the GIL for
seconds) is taken for silence only if it also outlasts every gap seen of that
worker *and* its peers are stuck waiting on it; from then on its gap raises that
worker's bound. Without peers waiting on it (between rounds, in rendezvous, no
collective) only the heartbeat timeout gives a worker up, as before; except while a
round whose culprits the fast rule gave up re-forms: a member of it already
overdue at that give-up (silent past its longest recent gap) and past its own
limit then holds up the members back at rendezvous as it held up the collective.

A worker silent for the whole heartbeat timeout is marked ``hung`` (:data:`.repeats.SILENT`): the driver has not
seen its process end. One the fast rule gives up is not: a healthy worker may hold the GIL in one C call for a few
seconds, and only a silence as long as the user allowed counts toward the job's end. A hung one counts (see
:mod:`.repeats`) only if no heartbeat of its process arrives between its give-up and its kill
(:meth:`SilenceWatch.heard` notes one: a frozen host that thaws heartbeats within milliseconds, a GIL-hung process
cannot), and, where its stacks signal is armed, only once it has printed its stacks on the signal the driver
sends as it stops it (a GIL-hung one does; a frozen host or a network drop, an ssh session staying open a while,
prints nothing). A process that ended (killed from outside, its ssh session closed) is reported ended instead.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Iterable

from cloud_elastic.driver.job.repeats import SILENT
from cloud_elastic.driver.job.stalls import Heard, Stall, describe, find_stall, stall_event
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.protocol import FlightEntry

__all__ = ["EXIT_GRACE_S", "FAST_FLOOR_S", "PHI_Z", "RunningClock", "SilenceWatch", "silence_limit"]

#: The fast rule's shortest bound on a member's silence: three heartbeat intervals of 0.5 s.
FAST_FLOOR_S = 1.5
#: Phi accrual with a normal model: phi = 8 (a one in 10^8 chance that a healthy gap is this long) is the
#: mean plus 5.6 standard deviations.
PHI_Z = 5.6
#: A worker's longest recent gap, plus this, is always allowed again.
PEAK_MARGIN_S = 0.5
#: Gaps the fast rule needs to have seen of a worker before it judges it (about 3 s of heartbeats).
WARMUP_ARRIVALS = 6
#: How long peers must have waited in a collective before it counts as stalled.
WAIT_MIN_S = 0.5
#: Weight of a new gap in the running mean and variance (about the last 16 gaps count).
_ALPHA = 1 / 16
#: Per arrival, how much of the peak's excess over the mean is kept (half of it after about 6 minutes
#: of heartbeats): a healthy pause seen once is allowed again for minutes.
_PEAK_KEEP = 0.998

#: The most workers given up for silence whose heartbeats are still listened for (see SilenceWatch.heard).
_GIVEN_UP_KEPT = 64

#: How long a worker that said it is past its exit hooks (``exiting``) may stay silent before its process has
#: ended (the heartbeat timeout, if longer): the interpreter's teardown (freeing CUDA, joining native threads)
#: can take seconds on a loaded host, and a worker on its way out is not a silent one.
EXIT_GRACE_S = 60.0

log = logging.getLogger(__name__)


class RunningClock:
    """Maps monotonic time to the driver's running time (monotonic minus its own stalls)."""

    def __init__(self, max_gap_s: float = 1.0) -> None:
        self.max_gap_s = max_gap_s
        self.stalled_s = 0.0
        self._last: float | None = None

    def __call__(self, now: float) -> float:
        """Running time at ``now``; a call after a stall adds the stall to :attr:`stalled_s`."""
        if self._last is not None:
            gap = now - self._last
            if gap > self.max_gap_s:
                self.stalled_s += gap - self.max_gap_s
                log.warning(
                    "the driver did not run for %.1fs (paused, starved or swapped); "
                    "worker silence during that time is not held against the workers", gap,
                )
        if self._last is None or now > self._last:
            self._last = now
        return now - self.stalled_s


def silence_limit(heard: Heard, floor_s: float = FAST_FLOOR_S) -> float | None:
    """How long ``heard``'s worker may be silent before the fast rule suspects it; None while warming up.

    The largest of the floor, the phi-accrual bound (mean + :data:`PHI_Z` standard deviations of its
    inter-arrival gaps), its longest recent gap plus :data:`PEAK_MARGIN_S`, and its mean gap plus the
    garbage-collector pause it said to expect plus the same margin.
    """
    if heard.arrivals < WARMUP_ARRIVALS:
        return None
    return max(floor_s, heard.mean + PHI_Z * math.sqrt(heard.var), heard.peak + PEAK_MARGIN_S,
               heard.mean + heard.pause + PEAK_MARGIN_S)


def arrived(heard: Heard, running: float) -> None:
    """A new heartbeat arrived at ``running`` (running time): fold its gap into ``heard``'s statistics."""
    gap = running - heard.at
    heard.at = running
    if gap <= 0:
        return
    if heard.arrivals == 0:
        heard.mean, heard.var, heard.peak = gap, 0.0, gap
    else:
        # The upper semi-variance: a heartbeat answered early (the round changed) is a short gap, and
        # says nothing of how late one can be; only gaps longer than the mean widen the bound.
        delta = gap - heard.mean
        heard.mean += _ALPHA * delta
        heard.var = (1 - _ALPHA) * (heard.var + _ALPHA * max(0.0, delta) ** 2)
        heard.peak = max(gap, heard.mean + (heard.peak - heard.mean) * _PEAK_KEEP)
    heard.arrivals += 1


class SilenceWatch:
    """Which live workers are overdue: silent past ``heartbeat_timeout_s`` or unregistered past ``start_timeout_s``,
    or caught by the fast rule (see module docstring).

    ``last_seen`` only grows and ``launched_at`` never changes, so after a scan
    nobody can become overdue before the earliest due time it saw unless a
    worker is born or a heartbeat reports a wait in a collective that may
    corroborate a member already past its limit, or that will have lasted the
    heartbeat timeout (:meth:`heard`); :meth:`overdue` skips the scan until then.
    The round's stall is worked out only when someone is past its limit or a wait
    is that long. Workers that completed their
    training function are never overdue (they are exiting).

    ``emit(kind, **fields)`` receives a ``collective_stalled`` event whenever a
    stall is named: before the fast rule gives its culprit up, or once a stall
    has lasted the heartbeat timeout while its culprits still heartbeat.
    """

    def __init__(self, heartbeat_timeout_s: float, start_timeout_s: float,
                 emit: Callable[..., None] | None = None, job_id: str | Callable[[], str] = "job") -> None:
        """``job_id``: the job's id, or how to read it when a line is logged (a resumed job takes its checkpoint's
        id after the driver built its job: its lines must name that one)."""
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.start_timeout_s = start_timeout_s
        self._emit = emit
        self._job_id_of = job_id if callable(job_id) else (lambda: job_id)
        self._silence_due = float("-inf")  # running time before which no registered worker can be overdue
        self._start_due = float("-inf")  # time before which no unregistered worker can be overdue
        self._born = -1  # workers ever recorded, as of the last scan
        self._heard: dict[str, Heard] = {}
        self._reported: tuple[int, int] = (0, 0)  # (round, seq) of the last stall named while all heartbeat
        self._suspects: frozenset[str] = frozenset()  # members past their limit at the last scan, nobody waiting
        #: The stall whose culprits the fast rule gave up, every member it blamed, and when (running time): the
        #: give-up aborts the round, its waiting ranks leave the collective for rendezvous, and there they wait for
        #: the others it blamed (two hosts frozen at once: the second a hair under its own limit at that scan waited
        #: the whole timeout), and for any member already overdue then (:meth:`_blamed_before`).
        self._blamed: tuple[Stall | None, frozenset[str], float] = (None, frozenset(), 0.0)
        self._given_up: dict[str, WorkerRecord] = {}  # found silent for the whole timeout: a heartbeat now thawed it
        #: ``host:port`` the workers were told to reach the driver at, once it listens (the driver sets it): named
        #: in the line of a worker that never registered, whose own line may come too late to be read.
        self.driver_address = ""

    def heard(self, worker_id: str, running: float, flight: FlightEntry | None, pause_s: float = 0.0) -> None:
        """A heartbeat of ``worker_id`` arrived at ``running`` (running time), with its newest collective
        and the longest garbage-collector pause it expects. One of a worker given up for silence (its process not
        yet killed: a frozen host that thawed) says that it was not hung (``heard_after_given_up``)."""
        gone = self._given_up.get(worker_id)
        if gone is not None and not gone.alive:
            gone.heard_after_given_up = True
        h = self._heard.get(worker_id)
        if h is None:
            h = self._heard[worker_id] = Heard(running)
        else:
            arrived(h, running)
        h.pause = pause_s
        h.limit = silence_limit(h)
        # A worker's own limit is first known after a few heartbeats: a scan made before that (every member
        # warming up) put the next one a whole heartbeat timeout away, too late for the fast rule.
        if h.limit is not None and h.at + h.limit < self._silence_due:
            self._silence_due = h.at + h.limit
        if flight is not None:
            if h.flight is None or (flight.round, flight.seq, flight.state) != (h.flight.round, h.flight.seq,
                                                                              h.flight.state):
                h.flight_at = running - flight.age_s
            h.flight = flight
            if flight.state == "entered":
                # A member already past its limit is given up once peers wait for it: look then. A wait
                # that lasts the heartbeat timeout is named: look then too.
                due = h.flight_at + (WAIT_MIN_S if self._suspects else self.heartbeat_timeout_s)
                if due < self._silence_due:
                    self._silence_due = due

    def flight(self, worker_id: str) -> FlightEntry | None:
        """The newest collective ``worker_id``'s heartbeats reported (None: none yet)."""
        h = self._heard.get(worker_id)
        return None if h is None else h.flight

    def overdue(self, alive: Iterable[WorkerRecord], born: int, now: float,
                running_now: float, round_: int = 0) -> list[tuple[WorkerRecord, str]]:
        """The workers of ``alive`` to give up, each with what it did wrong.

        ``born`` counts the job's workers ever recorded (a birth invalidates the
        shortcut); ``now`` is the monotonic time and ``running_now`` the
        driver's running time at ``now`` (see :class:`RunningClock`);
        ``round_`` is the running round (its members are judged by the fast rule too).
        """
        if born == self._born and running_now <= self._silence_due and now <= self._start_due:
            return []
        alive = list(alive)
        if born != self._born and len(self._heard) > len(alive):  # forget the dead (at a birth: rarely)
            ids = {w.worker_id for w in alive}
            self._heard = {k: v for k, v in self._heard.items() if k in ids}
        timeout, start_timeout = self.heartbeat_timeout_s, self.start_timeout_s
        # A worker that registers after this scan has last_seen >= running_now: no bound beyond now + timeout.
        silence_due, start_due = running_now + timeout, float("inf")
        found, suspects, long_wait = [], [], False
        heard = self._heard
        for w in alive:
            if w.state is WorkerState.COMPLETED:
                continue
            if w.state is not WorkerState.STARTING:  # registered
                silent = running_now - w.last_seen
                allowed = timeout if w.exiting_at is None else max(timeout, EXIT_GRACE_S)
                if silent > allowed:
                    if w.exiting_at is None:
                        w.hung = SILENT  # its process still runs (not reaped): a hang that counts (see .repeats)
                        self._given_up[w.worker_id] = w
                        while len(self._given_up) > _GIVEN_UP_KEPT:
                            del self._given_up[next(iter(self._given_up))]
                    found.append((w, f"stopped answering heartbeats for {silent:.1f}s" if w.exiting_at is None
                                  else f"has been exiting for {silent:.1f}s and its process has not ended"))
                    continue
                if w.last_seen + allowed < silence_due:
                    silence_due = w.last_seen + allowed
                if w.state is WorkerState.CONNECTED and w.exiting_at is None and round_:
                    # Registered, never at rendezvous: a worker joining a running job first runs its script up to
                    # its first call that needs the round (worker.context); that set-up is bounded like a start.
                    # Before the first round (a job with --spares defers every worker's join) it is not: the first
                    # round waits for its workers' set-up, as a first sync would.
                    if now - w.launched_at > start_timeout:
                        found.append((w, f"did not reach rendezvous within {start_timeout:g}s (its script's set-up "
                                         "before its first hvd.rank(), hvd.size() or elastic.run)"))
                        continue
                    if w.launched_at + start_timeout < start_due:
                        start_due = w.launched_at + start_timeout
                h = heard.get(w.worker_id)
                if h is None or not round_ or w.round != round_ or w.state not in _MEMBER or w.exiting_at is not None:
                    continue
                f = h.flight
                if f is not None and f.state == "entered" and h.flight_at + timeout <= running_now:
                    long_wait = True
                limit = h.limit
                if limit is None or limit >= allowed:
                    continue
                if running_now - h.at <= limit:
                    if h.at + limit < silence_due:
                        silence_due = h.at + limit
                else:
                    suspects.append((w, limit))
            elif now - w.launched_at > start_timeout:
                found.append((w, self._never_registered(w, start_timeout)))
            elif w.launched_at + start_timeout < start_due:
                start_due = w.launched_at + start_timeout
        if suspects:
            suspects, silence_due = self._past_the_usual(suspects, running_now, silence_due)
        self._suspects = frozenset(w.worker_id for w, _ in suspects)
        if suspects or long_wait:  # only then is the round's stall worth working out
            members = [w for w in alive if w.round == round_ and w.state in _MEMBER]
            stall = find_stall(members, heard, round_, running_now, WAIT_MIN_S)
            if stall is not None:
                found += self._name(stall, [(w, limit) for w, limit in suspects if stall.blames(w.worker_id)],
                                    running_now, {w.worker_id for w in members if w.returned})
            elif self._blamed[0] is not None and self._blamed[0].round == round_:
                back = [w.rank for w in alive if w.round == round_ and w.state is WorkerState.WAITING]
                found += self._blamed_before(suspects, running_now, back)
        self._silence_due, self._start_due, self._born = silence_due, start_due, born
        return found

    def _past_the_usual(self, suspects: list[tuple[WorkerRecord, float]], running_now: float,
                        silence_due: float) -> tuple[list[tuple[WorkerRecord, float]], float]:
        """The suspects also silent past the gap usual for the job's other workers (the median of their longest
        recent gaps, plus :data:`PEAK_MARGIN_S`), each with the larger limit; and the scan due time for the others.
        A gap most workers showed lately is the machine's or the driver's (starved, loaded), not a sign that this
        one hangs: a clean-clone run of the suite, its machine's load 13 on 2 cores, saw a healthy rank 0 silent
        1.5 s, its own limit, while its peer waited for it, and gave it up."""
        ids = {w.worker_id for w, _ in suspects}
        peaks = sorted(h.peak for k, h in self._heard.items() if k not in ids and h.limit is not None)
        if not peaks:
            return suspects, silence_due
        usual = peaks[(len(peaks) - 1) // 2] + PEAK_MARGIN_S
        kept = []
        for w, limit in suspects:
            at = self._heard[w.worker_id].at
            if running_now - at > usual:
                kept.append((w, max(limit, usual)))
            elif at + usual < silence_due:
                silence_due = at + usual
        return kept, silence_due

    def _never_registered(self, w: WorkerRecord, start_timeout: float) -> str:
        """Why a worker that never registered is given up, likelier cause first. One that printed a failed call to
        the driver (``WorkerRecord.tried_driver``) reached ``hvd.init()``: the address or the network is why (its
        own line says so only after its retries, which may be later). One that printed none most often never got
        there: its script's set-up, or its launch, is that slow (a worker behind a firewall that drops packets
        prints its first failure only after the call's 30 s, and a script may silence the warning: named second)."""
        if not self.driver_address:
            return f"did not reach rendezvous within {start_timeout:g}s"
        reach = "check --driver-address and that the workers can reach the driver (firewall)"
        if w.tried_driver:
            return (f"never reached the driver at {self.driver_address} within {start_timeout:g}s, though it tried "
                    f"(see its output): {reach}")
        return (f"never reached the driver at {self.driver_address} within {start_timeout:g}s and printed no failed "
                f"try: its script's set-up before hvd.init(), or its launch, took that long (raise --start-timeout, "
                f"or see what it waits on); else {reach}")

    def _name(self, stall: Stall, fast: list[tuple[WorkerRecord, float]], running_now: float,
              returned: frozenset[str] | set[str] = frozenset()) -> list[tuple[WorkerRecord, str]]:
        """Say who the stalled collective waits for, in the log and the events, before anyone is given up;
        return the silent culprits to give up now (the fast rule). ``returned``: the members that returned from
        their training function (then that, not "busy", is why they are not in it)."""
        if fast:
            self._blamed = (stall, frozenset(m.worker for m in stall.missing), running_now)
            log.warning("job %s: %s", self._job_id_of(), describe(stall, running_now))
            self._event(stall, running_now, "silent rank(s) given up")
            waited = stall.waited_s(running_now)
            ranks = ", ".join(str(r) for r in stall.waiting)
            # Not marked hung: a silence shorter than --heartbeat-timeout never counts toward the job's end.
            return [(w, f"stopped answering heartbeats for {running_now - self._heard[w.worker_id].at:.1f}s "
                        f"(its limit {limit:.1f}s) while rank(s) {ranks} waited {waited:.1f}s for it in "
                        f"collective #{stall.seq} ({stall.op}) of round {stall.round}") for w, limit in fast]
        if stall.waited_s(running_now) >= self.heartbeat_timeout_s and (stall.round, stall.seq) != self._reported:
            self._reported = (stall.round, stall.seq)
            why = ("returned from its training function" if all(m.worker in returned for m in stall.missing)
                   else "busy, or stuck outside the collective")
            log.warning("job %s: %s (still heartbeating: %s)", self._job_id_of(), describe(stall, running_now), why)
            self._event(stall, running_now, "still heartbeating")
        return []

    def _blamed_before(self, suspects: list[tuple[WorkerRecord, float]], running_now: float,
                       back: list[int | None]) -> list[tuple[WorkerRecord, str]]:
        """The suspects (past their own limit) of the round whose stalled collective's culprits were given up: the
        ones that stall blamed too, whose peers left that collective for the aborted round's rendezvous, and, once
        members are back at that rendezvous (``back``: their ranks), any other already overdue at that give-up (silent
        longer than its longest recent gap): the round's re-formation waits for it as the collective did (a review
        froze a second rank 0.7 s after the first, inside the collective, so not blamed: it was given up only at
        --heartbeat-timeout, the survivors idle meanwhile). One that heartbeat as usual until the give-up is not: its
        silence began with the abort, on its way back through its rollback (a restore holding the GIL, review h31),
        and only the heartbeat timeout judges it, as any worker in rendezvous."""
        stall, ids, given_up_at = self._blamed
        assert stall is not None
        heard = self._heard
        suspects = [(w, limit) for w, limit in suspects if w.worker_id in ids or (
            back and heard[w.worker_id].at + heard[w.worker_id].peak < given_up_at)]
        silent = {w.worker_id: f"stopped answering heartbeats for {running_now - self._heard[w.worker_id].at:.1f}s "
                               f"(its limit {limit:.1f}s)" for w, limit in suspects}
        ranks = ", ".join(str(r) for r in sorted(r for r in back if r is not None))
        return [(w, f"{silent[w.worker_id]}, missing with the rank(s) given up from collective #{stall.seq} "
                    f"({stall.op}) of round {stall.round}, whose re-formation waits for it") if w.worker_id in ids
                else (w, f"{silent[w.worker_id]} while rank(s) {ranks} waited at the rendezvous re-forming round "
                         f"{stall.round} (aborted at collective #{stall.seq}, {stall.op}) for it")
                for w, _ in suspects]

    def _event(self, stall: Stall, running_now: float, verdict: str) -> None:
        if self._emit is not None:
            self._emit("collective_stalled", **stall_event(stall, running_now, verdict))


_MEMBER = (WorkerState.RUNNING, WorkerState.DRAINING)
