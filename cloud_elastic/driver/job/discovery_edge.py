"""What the job makes of discovery: its snapshots, its failures, and the hosts missing from it.

Discovery is the job's word on which hosts exist, not on whether its workers live (their
heartbeats and exits say that). :class:`DiscoveryEdge` decides, for the job:

* a snapshot changes the hosts (:class:`~.hosts.HostManager`); what changed is logged and emitted;
* a failed discovery call is retried. Before this driver's discovery first answers, a new job waits
  up to ``--start-timeout`` (a driver that resumes the job, :attr:`DiscoveryEdge.answered_before`, up to
  ``--elastic-timeout``: it cannot launch a worker without an answer), and ends in one line if it has not
  answered by then. A restarted driver that adopted running workers before its discovery answered goes
  on with their hosts (:meth:`DiscoveryEdge.assume`), as its predecessor's discovery listed them: for it
  too, as below, a failure never ends the job by itself.
  Once discovery answered, a failure never ends the job by itself: an AWS API throttled for ten
  minutes, a permission taken away by mistake, a Kubernetes control-plane upgrade all leave the
  workers training. The job keeps its current hosts and trains on while it can: it cannot see
  new hosts, reclaims announced only through discovery (notices from the hosts themselves still
  come), or a scale-in until discovery answers again. Only the ``--min-np`` watch
  (:mod:`.capacity`) ends it: fewer than ``--min-np`` workers for ``--elastic-timeout`` (its line
  then says for how long discovery has failed, and its latest error). The log says
  so once when discovery starts failing and at most every few minutes after
  (:class:`~cloud_elastic.driver.runtime.discovery.FailingStreak`).
  A fatal error (the provider says retrying cannot help) ends the job at once only before
  discovery first answered, in a new job: a typo in a group name fails fast. A restarted
  driver that adopts workers or resumes the job goes on with a job whose discovery answered
  before. Once it has answered, the same call worked, and a long job meets "fatal" errors that
  pass (an expired session token refreshed the next call, a metadata server's 5xx while
  refreshing a token): the job keeps its current hosts, says so in a WARNING, and counts the
  error as any other failure;
* a host missing from discovery past ``--host-missing-grace`` (not draining: just absent) is
  removed and its workers leave, unless that would take away the last live holders of the
  newest commit, or leave fewer than ``--min-np`` workers (counting those that reached
  rendezvous), on discovery's word alone (a throttled ``aws ... | jq`` prints nothing and
  exits 0). Such a host is *kept* (``HostManager.kept``; one WARNING says why): its workers
  train on, but it is a leaving host for placement (``HostManager.stays``): they hold no
  place, so a replacement is launched on a free usable slot, and a spare or newcomer has
  room next to them and takes the state from them in a round (the hand-off of the last
  holders on draining hosts, see :mod:`.leaving`). The keep is judged again every step:
  once other workers hold the newest commit and at least ``--min-np`` of them stay, the host
  is removed as above, its workers leaving at a commit. It stays kept while no replacement
  can be had, until discovery lists it again (an ordinary host again: the replacements
  launched for it beyond ``--max-np`` and the spares leave), or its workers fail (a dead
  host's workers are found by the heartbeat timeout and their exits).
  Before any commit is heard of, the round's running members are the prospective holders of the
  first (as for a notice, see :meth:`.leaving.Leavers.mark`): their host is kept so that a
  replacement joins them at that commit instead of starting over from step 0 beside them, for
  :data:`.leaving.FIRST_COMMIT_HOLD_S`, then only while no worker waits to take over; past that the
  host goes, and the round that forms from step 0 stops its workers and says the job starts over.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable

from cloud_elastic.driver.job.hosts import some_hosts
from cloud_elastic.driver.job.leaving import FIRST_COMMIT_HOLD_S
from cloud_elastic.driver.job.spares import spare_slots
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.providers.api import DiscoveredHosts

__all__ = ["DiscoveryEdge"]

log = logging.getLogger(__name__)

S = WorkerState
#: Workers that count for the keep: those that reached rendezvous (as for the --min-np watch, see
#: .capacity): a replacement still starting may never come up, and the kept host's workers train on meanwhile.
_COUNTED = (S.WAITING, S.RUNNING)
_STAYING = (S.STARTING, S.CONNECTED, S.WAITING, S.RUNNING)


class DiscoveryEdge:
    """Discovery's answers and failures, for one job (see module docstring)."""

    def __init__(self, job: JobView, lapsed: Callable[[str], None],
                 send_away: Callable[[WorkerRecord, str], None]) -> None:
        """``lapsed(host)``: the notice for ``host`` lapsed (see :meth:`.leaving.Leavers.lapsed`); ``send_away``:
        :meth:`.leaving.Leavers.send_away`."""
        self._job = job
        self._lapsed = lapsed
        self._send_away = send_away
        self._fatal_said = ""  # the fatal error last logged in the current run of failures
        self._kept: dict[str, str] = {}  # host missing past the grace -> why its workers are kept
        self._let_go: set[str] = set()  # kept hosts whose workers are no longer needed (for the log)
        # Kept hosts of the prospective holders of the first commit -> when first kept for them.
        self._first_since: dict[str, float] = {}
        self._started_over: set[str] = set()  # such hosts let go past that hold (for the log)
        self._now = 0.0  # of the snapshot or step being judged (the keep's first-commit bound)
        #: Discovery answered this job before this driver started (it adopts workers or resumes the job).
        self.answered_before = False
        #: The hosts are the adopted workers' (:meth:`assume`) until discovery answers this driver.
        self.assumed = False

    def missing_reason(self) -> str:
        return f"missing from discovery for {self._job.hosts.missing_grace_s:g}s (--host-missing-grace)"

    def discovered(self, snapshot: DiscoveredHosts, now: float) -> None:
        """Adopt ``snapshot``: log and emit what changed."""
        job = self._job
        hosts = job.hosts
        job.discovered_once = True
        job.discovery_failing_since, self._fatal_said = None, ""
        was_missing = set(hosts.missing)
        self._now = now
        in_use = {w.slot.host for w in job.alive()}
        changes = hosts.update(snapshot, now, keep=self._keep, in_use=in_use)
        back = [h for h in self._kept if h in hosts.ready or h in hosts.draining]
        for host in back:
            log.info("job %s: host %s is listed by discovery again; its workers were kept", job.job_id, host)
        self._forget_kept()
        if back:
            self._trim()
        if changes:
            log.info(
                "job %s: hosts changed: added=[%s] removed=[%s] draining=[%s] resized=[%s] missing=[%s] (ready "
                "slots: %d)", job.job_id, some_hosts(changes.added), some_hosts(changes.removed),
                some_hosts(changes.draining), some_hosts(changes.resized), some_hosts(changes.missing),
                sum(hosts.ready.values()),
            )
            dropped = set(changes.dropped)
            job.emit(
                "hosts_changed", added=[{"host": h, "slots": hosts.ready[h]} for h in changes.added],
                removed=[{"host": h, "reason": self._dropped_reason() if h in dropped else self.missing_reason()
                          if h in was_missing else "gone from discovery"} for h in changes.removed],
                draining=[{"host": h, "reason": hosts.draining[h].reason, "deadline": hosts.draining[h].deadline}
                          for h in changes.draining],
                missing=list(changes.missing),
                **({"resized": [{"host": h, "slots": hosts.ready[h]} for h in changes.resized]}
                   if changes.resized else {}),
            )
        for host in changes.lapsed:
            self._lapsed(host)
            log.info("job %s: the notice for host %s lapsed (the group still reports it ready); new workers may be "
                     "placed there again", job.job_id, host)
        if len(changes.missing) == 1:
            log.warning(
                "job %s: host %s is missing from discovery; its workers keep running for up to %gs "
                "unless it comes back or is reported draining", job.job_id, changes.missing[0], hosts.missing_grace_s,
            )
        elif changes.missing:  # one line a poll: discovery naming new hosts at every poll made 16,383 a second
            log.warning(
                "job %s: %d hosts are missing from discovery (%s; %d with workers); their workers keep running for up "
                "to %gs unless they come back or are reported draining", job.job_id, len(changes.missing),
                some_hosts(sorted(changes.missing, key=lambda h: h not in in_use)),
                sum(1 for h in changes.missing if h in in_use), hosts.missing_grace_s,
            )
        if changes.dropped:
            log.warning("job %s: %d host(s) removed (%s): %s", job.job_id, len(changes.dropped),
                        some_hosts(changes.dropped), self._dropped_reason())

    def assume(self, snapshot: DiscoveredHosts, workers: int, now: float) -> None:
        """A restarted driver adopted ``workers`` running workers, and its discovery has not answered yet:
        ``snapshot``, the hosts they run on, stands for discovery's answer. Their predecessor's discovery listed those hosts, so
        the job trains on as one whose discovery answered and then failed: the failure never ends it by itself
        (only the ``--min-np`` wait does), and discovery's first answer replaces these hosts."""
        job = self._job
        failing, error = job.discovery_failing_since, job.last_discovery_error
        self.discovered(snapshot, now)
        job.discovered_once, job.discovery_failing_since, job.last_discovery_error = False, failing, error
        self.assumed = True
        log.warning("job %s: host discovery has not answered this driver (%s): the job goes on with the %d host(s) "
                    "of the %d worker(s) it adopted, where its previous driver's discovery listed them, and asks "
                    "again; until discovery answers it cannot see new hosts, reclaims announced only through "
                    "discovery, or a scale-in; it ends only below --min-np %d for --elastic-timeout %gs", job.job_id,
                    error or "no answer yet", len(snapshot.ready), workers, job.policy.min_np,
                    job.policy.elastic_timeout_s)

    def _dropped_reason(self) -> str:
        return (f"missing from discovery, beyond the {self._job.hosts.max_missing} missing hosts kept (those without "
                "workers or blacklisted slots missing longest go first)")

    def failed(self, message: str, *, fatal: bool, now: float) -> None:
        """A discovery call failed (see module docstring for what a fatal error does)."""
        job, policy = self._job, self._job.policy
        answered = job.discovered_once or self.answered_before
        if fatal and not answered:
            job.end(False, f"host discovery failed: {message}", 1)
            return
        job.last_discovery_error = message
        if job.discovery_failing_since is None:
            job.discovery_failing_since = now
        if fatal and message != self._fatal_said:
            self._fatal_said = message
            when = "before" if job.discovered_once else "for this job's previous driver"
            log.warning("job %s: host discovery failed with an error it calls fatal: %s. Discovery worked %s, so "
                        "this may pass (a token being refreshed, a throttled metadata server): the job keeps its "
                        "current hosts and retries", job.job_id, message, when)
        if not job.discovered_once and not self.assumed:  # no hosts known yet: it cannot run the job without them
            limit = policy.elastic_timeout_s if answered else policy.start_timeout_s
            if now - job.discovery_failing_since > limit:
                which = "--elastic-timeout" if answered else "--start-timeout"
                job.end(False, f"host discovery kept failing for {limit:g}s ({which}): {message}", 1)

    def expire(self, now: float) -> None:
        """Remove the hosts missing past the grace that may go (see module docstring)."""
        job = self._job
        self._let_go, self._started_over = set(), set()
        since = {host: t for host, (_, t) in job.hosts.missing.items()}
        self._now = now
        expired = job.hosts.expire(now, keep=self._keep)
        self._forget_kept()
        # Hosts removed for no reason of their own (no workers kept there) share one line when there are several.
        plain = [h for h in expired if h not in self._let_go and h not in self._started_over]
        for host in expired if len(plain) <= 1 else [h for h in expired if h not in plain]:
            why = ("; other workers now hold the state and enough of them stay: its workers leave at their next "
                   "commit" if host in self._let_go else "; no commit heard of: its workers stop, and the next round "
                   "starts over from the initial weights" if host in self._started_over else "")
            log.info("job %s: host %s stayed missing from discovery for %.0fs; removed%s", job.job_id, host,
                     now - since.get(host, now - job.hosts.missing_grace_s), why)
        if len(plain) > 1:
            took = sorted(now - since.get(h, now - job.hosts.missing_grace_s) for h in plain)
            spent = f"{took[0]:.0f}s" if round(took[0]) == round(took[-1]) else f"{took[0]:.0f}-{took[-1]:.0f}s"
            in_use = {w.slot.host for w in job.alive()}
            log.info("job %s: %d hosts stayed missing from discovery for %s; removed: %s (%d with workers)",
                     job.job_id, len(plain), spent, some_hosts(sorted(plain, key=lambda h: h not in in_use)),
                     sum(1 for h in plain if h in in_use))
        if expired:
            why = self.missing_reason()
            job.emit("hosts_changed", added=[], removed=[{"host": h, "reason": why} for h in expired], draining=[])

    def _trim(self) -> None:
        """A kept host is listed again: its workers hold their places again, and the replacements launched for
        them are too many (beyond ``--max-np`` and the spares: a newcomer no round has room for would ask for an
        update every round). The surplus leaves: newcomers before members, workers without the state before
        holders, the newest first (a member drains at its next commit: no rollback)."""
        job = self._job
        policy = job.policy
        # A fallback worker being replaced (``replaced``) holds no place in any round (.formation): counted, it
        # made its own replacement the surplus, and the hand-off ran twice.
        staying = [w for w in job.active() if job.hosts.stays(w.slot) and not w.replaced]
        over = len(staying) - policy.max_np - spare_slots(policy.spares, policy.whole_host_slots)
        surplus = sorted(staying, key=lambda w: (w.member_of(job.round), w.holds_state, -w.seq))[:max(over, 0)]
        for w in surplus:
            if w.state in _STAYING:  # not taken along with its host already (--whole-hosts)
                why = f"a host kept while missing from discovery is listed again: --max-np {policy.max_np} reached"
                log.info("job %s: worker %s (%s) will leave: %s", job.job_id, w.worker_id, w.label, why)
                self._send_away(w, why)

    def _keep(self, expired: tuple[str, ...]) -> set[str]:
        """Of the hosts missing past the grace, those whose removal would take the last live holders of the newest
        commit, or go below ``--min-np``. Newer hosts go first: older ones hold the lower ranks."""
        job = self._job
        hosts, min_np = job.hosts, job.policy.min_np
        staying = [w for w in job.alive() if w.state in _COUNTED and hosts.is_usable(w.slot)]
        holders = [w for w in staying if w.holds_state] if job.state_committed else self._first_holders(staying)
        newest = max((w.commit_seq for w in holders), default=0)
        on_host = Counter(w.slot.host for w in staying)
        newest_on_host = Counter(w.slot.host for w in holders if w.commit_seq == newest)
        left, newest_left = len(staying), sum(newest_on_host.values())
        kept: dict[str, str] = {}
        for host in sorted(expired, key=hosts.order_of, reverse=True):
            workers, holding = on_host.get(host, 0), newest_on_host.get(host, 0)
            if workers == 0:
                continue  # nobody there to keep
            why = []
            last = newest_left and newest_left == holding
            if last:
                why.append(f"its workers are the last live holders of the newest commit (commit {newest})"
                           if job.state_committed else self._first_hold(host, staying))
            if left - workers < min_np:
                why.append(f"removing it would leave {left - workers} worker(s), fewer than --min-np {min_np}")
            why = [w for w in why if w]
            if why:
                kept[host] = " and ".join(why)
            else:
                left, newest_left = left - workers, newest_left - holding
                if last and not job.state_committed:
                    self._started_over.add(host)
                elif host in self._kept:
                    self._let_go.add(host)
        for host, why in kept.items():
            if host not in self._kept:
                log.warning("job %s: host %s has been missing from discovery for over %gs (--host-missing-grace), "
                            "but %s: its %d worker(s) keep training (their heartbeats say they live) until "
                            "discovery lists it again, or until others hold the state and enough of them stay "
                            "(a replacement starts on a free slot, a spare joins them): then they leave at a "
                            "commit", job.job_id, host, hosts.missing_grace_s, why, on_host[host])
        self._kept = kept
        self._first_since = {h: t for h, t in self._first_since.items() if h in kept}
        return set(kept)

    def _first_holders(self, staying: list[WorkerRecord]) -> list[WorkerRecord]:
        """Before any commit is heard of, the prospective holders of the first: the running members of the round
        (as for a notice, see :meth:`.leaving.Leavers.mark`), none once a loss aborted it."""
        job = self._job
        if job.abort_round >= job.round:
            return []
        return [w for w in staying if w.state is S.RUNNING and w.round == job.round]

    def _first_hold(self, host: str, staying: list[WorkerRecord]) -> str:
        """Why ``host``, whose workers are the last prospective holders of the first commit, is kept ('' when it
        is not): for :data:`.leaving.FIRST_COMMIT_HOLD_S`, then only while no worker waits to take over (it would
        start over from the initial weights beside them)."""
        since = self._first_since.setdefault(host, self._now)
        if self._now >= since + FIRST_COMMIT_HOLD_S and any(w.state is S.WAITING for w in staying):
            return ""
        return ("its workers are the last prospective holders of the job's first commit (no commit heard of yet: "
                f"kept {FIRST_COMMIT_HOLD_S:g}s at most while a worker waits to take over)")

    def _forget_kept(self) -> None:
        """Hosts back in discovery or removed are kept no more (a later absence is said again)."""
        missing = self._job.hosts.missing
        if self._kept and any(h not in missing for h in self._kept):
            self._kept = {h: why for h, why in self._kept.items() if h in missing}
