"""Which host sources the job's slots come from: the choice rule, the fallback, group capacity, the cost.

Only for a job with several sources (``Policy.sources``, see
:mod:`cloud_elastic.providers.sources`); with one, :class:`Sourcing` changes nothing.

* **The choice rule** (:func:`choose`): free slots are taken non-fallback first, then
  by higher ``priority``, then lower price per slot-hour (a slot of unknown price after
  every priced one of its priority), then older host, then slot index. So when more
  slots are offered than ``--max-np`` allows, the job fills the preferred ones, and
  ties keep the order hosts were first seen (older hosts first, as ranks do).
* **The fallback** (:class:`FallbackRule`): fallback slots are wanted only while the other sources' usable
  slots (ready, not blacklisted, no notice) are below ``--min-np``, below ``-np`` before the job's first round (it
  cannot start with fewer), or below ``-np`` for ``--fallback-after`` seconds (a fallback that started the job
  counts so from the start: with ``--fallback-after`` it stays until the other sources give ``-np``); the
  fallback then tops the job up to ``-np`` (its normal size: a job below ``--min-np`` at start-up could not start
  with less, and a job just topped up to ``--min-np`` would be drained again as soon as one preferred slot came
  back).
* **Coming back** (:meth:`Sourcing.step`): fallback workers beyond what is wanted are
  drained, the least preferred first (lower priority, unknown price, then the priciest; ties newest first), once
  their replacements are ready: a ready one (at
  rendezvous or training) leaves only while the job keeps, without it, as many ready
  workers as it will have when the usable preferred slots are all ready
  (``min(usable + wanted, --max-np)``). Until then it trains on and holds no place
  for launches (:attr:`Sourcing.replacing`), so its replacement is launched beside
  it; a replacement that never comes up is blacklisted as usual, the fallback is
  wanted again, and the worker stays. A drained worker leaves at its next commit,
  with no rollback; one not ready yet leaves at once. Nor does one leave with the last copy of the training
  state (the job ran wholly on the fallback): while no worker that stays holds it, as
  :meth:`.leaving.Leavers.mark` counts holders, its holders train on marked ``replaced``, which gives them no
  place in the next round (:mod:`.formation`, as the last holders on a leaving host): that round takes the
  replacements beside them, beyond ``--max-np``, and syncs the state to them; they leave once those hold it:
  once one of them made a commit of its own (a commit number a sync gave it, or a place in the round, is not
  enough: Spot may take it back before). A drained worker that comes back to rendezvous while no other worker that
  stays holds the state (its round failed, or its successors are gone) stays instead (:meth:`Sourcing.keep_holder`).
* **Capacity** (``--manage-capacity``): while fallback slots are wanted and a fallback group shows fewer hosts
  than its share needs, one :class:`~.actions.SetCapacity` raises its desired capacity to ``ceil(its share / slots
  per host)``, slots per host being its own hosts' as last seen; before any has shown its slots, to one host (the rest
  is sized once it shows them: another group's hosts may be of another size; the next group's share counts its
  hosts as of one slot each). Shares go preferred group first
  (:meth:`Sourcing.fallbacks`), each keeping the hosts its workers use and giving what its provider says it can
  (:attr:`Sourcing.can_give`), the next the rest (a group that cannot give all it is asked keeps its own ask; one
  the job may not change is asked nothing). Asked again every :data:`REASK_S` while it still shows fewer, with no
  event (the provider sends it only where it may change the group: ``providers/group_capacity.py``); a smaller
  number, once fewer slots are wanted, is a new value with its event. Once its share is 0 and no worker is left
  on it, it is set back to 0 (one whose raise was never sent, held back or skipped, is left as it is, with no
  event: ``Room.owned``). Nothing before the job's first discovery answer (a failed first call shows no
  host, not a lack of them), nor to a group the job never raised. At the job's end the driver sets every group
  still raised back to 0 (:meth:`Sourcing.lowered`); a driver restarted after a crash takes over what its
  predecessor raised (:meth:`Sourcing.inherit`, kept beside the checkpoints: ``raised(sent=True)``, a group set
  back to 0 until the cloud has taken the 0).
* **Cost** (:class:`~cloud_elastic.cost.CostMeter`): each worker's slot is charged at
  its host's price from launch to exit, and so is each slot no worker uses on the hosts of a fallback group the
  job raised, up to the capacity it asked (:mod:`.paid`: the job asked for them); a ``cost`` event at most every
  :data:`COST_EVENT_EVERY_S` while the rate changes, and at least every
  :data:`COST_EVENT_MAX_S`. The meter moves at each :meth:`Sourcing.step` and each
  :meth:`Sourcing.charge`, which the driver calls at every tick (a fixed-size job's
  running round and a finishing job plan no launches, so take no step). A driver restarted
  after a crash goes on from its predecessor's figures (:meth:`Sourcing.carry_cost`). The cost per commit
  (:meth:`Sourcing.per_commit`) is this driver's run's: its own dollars over the commits made since the run
  began (the job's start, else its first checkpoint load or adoption), not over the job's whole history.

Pure: time comes in as ``now``; the I/O (capacity calls, price look-ups) is the runtime's.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

from cloud_elastic.cost import CostMeter, CostSoFar, CostSummary
from cloud_elastic.driver.job.actions import Phase, SetCapacity
from cloud_elastic.driver.job.hosts import HostManager, Slot
from cloud_elastic.driver.job.paid import IdleWatch, paid
from cloud_elastic.driver.job.spares import doubtful
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.providers.group_capacity import Room
from cloud_elastic.providers.sources import SourceSpec

__all__ = ["choose", "FallbackRule", "Sourcing", "PerCommit", "COST_EVENT_EVERY_S", "COST_EVENT_MAX_S", "REASK_S"]

log = logging.getLogger(__name__)

S = WorkerState
_ACTIVE = (S.STARTING, S.CONNECTED, S.WAITING, S.RUNNING)
_READY = (S.WAITING, S.RUNNING)  # reached rendezvous: can take a place in the next round
#: The rate of spending changed: a ``cost`` event, but not more often than this.
COST_EVENT_EVERY_S = 5.0
#: A ``cost`` event at least this often while the job runs.
COST_EVENT_MAX_S = 60.0
#: The fallback is weighed again at least this often (a blacklisted slot coming back, --fallback-after's timer),
#: and at once when a host or a worker changed: a step of a large job does not count every slot.
RECHECK_S = 1.0
#: A fallback group that shows fewer hosts than wanted is asked again this long after the job last asked it (the
#: group's own scaling may have lowered it since): the provider sends it only where it may change the group
#: (``providers/multi.py``), never lowering one raised beyond it while its instances boot.
REASK_S = 30.0


def _rank(spec: SourceSpec | None) -> tuple[bool, int]:
    return (False, 0) if spec is None else (spec.fallback, -spec.priority)


def choose(free: list[Slot], hosts: HostManager, specs: Mapping[str, SourceSpec]) -> list[Slot]:
    """``free`` in the order the job takes slots (see the module docstring). Stable, deterministic."""
    def key(slot: Slot) -> tuple:
        spec = specs.get(hosts.sources.get(slot.host, ""))
        price = hosts.prices.get(slot.host)
        return (*_rank(spec), price is None, price if price is not None else 0.0, hosts.order_of(slot.host),
                slot.index)

    return sorted(free, key=key)


def _cheapest_first(spec: SourceSpec) -> tuple[int, bool, float]:
    """The order fallbacks are raised in: priority, then price, unpriced last. ``price`` is per slot-hour; a group
    priced by ``on_demand_price`` alone (AWS, per instance-hour: its slots per instance are unknown before one is
    up) is ranked by that, as if of one slot an instance: give ``price=`` to rank groups of other sizes exactly."""
    price = spec.price if spec.price is not None else spec.on_demand_price
    return -spec.priority, price is None, price or 0.0


class FallbackRule:
    """When the fallback is wanted, and how many slots it should give (see the module docstring)."""

    def __init__(self, num_proc: int, min_np: int, max_np: int, fallback_after_s: float | None) -> None:
        self.num_proc, self.min_np, self.max_np = num_proc, min_np, max_np
        self.fallback_after_s = fallback_after_s
        self.below_np_since: float | None = None
        # The fallback was wanted to start the job: with --fallback-after it stays wanted, as once that time has
        # passed, until the other sources give -np (drained at the start, it would only be raised again then).
        self._started_short = False

    def wanted(self, preferred_slots: int, now: float, *, starting: bool = False) -> tuple[int, str]:
        """(fallback slots wanted, why) given the other sources' usable slots at ``now``; ``starting``: the job has
        not formed its first round, and cannot start with fewer than -np."""
        if preferred_slots < self.num_proc:
            if self.below_np_since is None:
                self.below_np_since = now
        else:
            self.below_np_since = None
            self._started_short = False
        after = self.fallback_after_s
        timed = after is not None and self.below_np_since is not None and (
            self._started_short or now - self.below_np_since >= after)
        if starting and preferred_slots < self.num_proc:
            self._started_short = True
        if preferred_slots < self.min_np:
            why = f"below --min-np {self.min_np}"
        elif starting and preferred_slots < self.num_proc:
            why = f"below -np {self.num_proc} before the job's first round (it cannot start with fewer)"
        elif timed and now - self.below_np_since < after:
            why = f"below -np {self.num_proc} since the job started with the fallback (--fallback-after)"
        elif timed:
            why = f"below -np {self.num_proc} for {after:g}s (--fallback-after)"
        else:
            return 0, ""
        return max(0, min(self.num_proc, self.max_np) - preferred_slots), why


@dataclass(frozen=True)
class PerCommit:
    """This driver's run's cost per commit: its ``dollars`` over the ``commits`` it made (``value``; None before
    the first). ``carried``: the job's cost also counts a crashed predecessor's, which is in neither figure."""

    commits: int
    dollars: float
    value: float | None
    carried: bool


class Sourcing:
    """The job's sources at each step (see module docstring)."""

    def __init__(self, job: JobView, send_away: Callable[[WorkerRecord, str], None]) -> None:
        self._job = job
        self._send_away = send_away
        policy = job.policy
        self.specs = {s.name: s for s in policy.sources}
        self.rule = FallbackRule(policy.num_proc, policy.min_np, policy.max_np, policy.fallback_after_s)
        self.cost = CostMeter()
        #: Fallback slots wanted at the last step, and why.
        self.wanted, self.why = 0, ""
        #: Source -> the desired capacity the job last asked for.
        self.requested: dict[str, int] = {}
        self._asked_at: dict[str, float] = {}  # source -> when the job last asked it for a capacity
        #: Sources in ``requested`` by a crashed predecessor's word only (:meth:`inherit`): set back to 0 by the same
        #: rule, never taken for a value this job asked (it may be stale); told to the provider (``raised.share``).
        self.inherited: dict[str, int] = {}
        self._known: dict[str, tuple[str, float | None]] = {}  # host -> (source, price), kept past its departure
        self._fallbacks = [s.name for s in sorted(policy.sources, key=_cheapest_first) if s.fallback]
        #: Fallback source -> the slots of one of its hosts, as they last showed (a raise is sized by them).
        self.host_slots: dict[str, int] = {}
        self._held_key: tuple = ()
        self._held: Mapping[str, tuple[int, float, int]] = {}
        self._idle_slots = 0  # of the slots held, those of raised fallback hosts that no worker uses (.paid)
        self._idle_unpriced = 0  # of them, those without a price
        self._idle = IdleWatch()  # the hosts of those slots, named once they stay so
        self._cost_at = float("-inf")  # when the last cost event was emitted
        self._cost_rate = -1.0
        self._carried: float | None = None  # dollars carried from crashed predecessors: not this run's
        self._weighed: tuple = ()  # (hosts version, workers, alive, ready) when the fallback was last weighed
        self._weighed_at = float("-inf")
        #: Fallback source -> what its group can give now and whether the job set it (a raise sent or taken over, not
        #: held back or skipped), as its provider says (``raised.share``, before each tick and discovery answer); a
        #: source not in it: nothing known (every raise asked counts as set).
        self.can_give: dict[str, Room] = {}
        #: Fallback workers beyond what is wanted that stay until replacements are ready: they hold no place
        #: for launches (:meth:`.capacity.Capacity.plan_launches`), so the replacements can start beside them.
        self.replacing = 0
        self._handing = 0  # of them, those that hold the training state no worker that stays holds yet
        self._sent_away: set[str] = set()  # the fallback workers sent away, while alive (keep_holder)

    @property
    def active(self) -> bool:
        return bool(self.specs)

    def is_fallback(self, host: str) -> bool:
        spec = self.specs.get(self._job.hosts.sources.get(host, ""))
        return spec is not None and spec.fallback

    # ------------------------------------------------------------------ choice
    def order(self, free: list[Slot]) -> list[Slot]:
        """The free slots the job may fill now, preferred first; fallback ones only as many as wanted."""
        if not self.specs:
            return free
        ordered = choose(free, self._job.hosts, self.specs)
        allowed = self.wanted - sum(1 for w in self._job.active() if self.is_fallback(w.slot.host))
        whole = self._job.policy.whole_host_slots
        if whole and allowed > 0:
            allowed += -allowed % whole  # whole hosts only: a part of one would be no host at all
        taken: list[Slot] = []
        for slot in ordered:
            if self.is_fallback(slot.host):
                if allowed <= 0:
                    continue
                allowed -= 1
            taken.append(slot)
        return taken

    # -------------------------------------------------------------------- step
    def step(self, now: float) -> None:
        """Weigh the fallback, send back its surplus workers, ask for capacity, and charge the cost."""
        if not self.specs:
            return
        job = self._job
        # While fallback workers wait for their replacements, a replacement reaching rendezvous is news too.
        ready = sum(1 for w in job.alive() if w.state in _READY) if self.replacing else 0
        changed = (job.hosts.version, len(job.workers), len(job.alive()), ready)
        if changed != self._weighed or now - self._weighed_at >= RECHECK_S:
            self._weighed, self._weighed_at = changed, now
            self._weigh(now)
        self.charge(now)

    def _weigh(self, now: float) -> None:
        job = self._job
        preferred = sum(1 for s in job.hosts.available_slots(now) if not self.is_fallback(s.host))
        wanted, why = self.rule.wanted(preferred, now, starting=job.phase is Phase.STARTING and not job.adopting)
        if wanted != self.wanted:
            if wanted > self.wanted:
                log.info("job %s: %d slot(s) from the other sources, %s: up to %d fallback slot(s) wanted",
                         job.job_id, preferred, why, wanted)
            else:
                log.info("job %s: %d slot(s) from the other sources: %d fallback slot(s) wanted", job.job_id,
                         preferred, wanted)
            self.wanted, self.why = wanted, why
        self._send_back(preferred)
        if job.policy.manage_capacity:
            self._capacity(now)
        # Where each host came from and its price, kept while a worker may still run there (a host gone from
        # discovery is charged at its last price until its worker exits), and no longer.
        keep = {w.slot.host for w in job.alive()}
        self._known = {h: v for h, v in self._known.items() if h in keep}
        for host, source in job.hosts.sources.items():
            self._known[host] = (source, job.hosts.prices.get(host))

    def _send_back(self, preferred: int) -> None:
        """Drain the fallback workers beyond what is wanted, the dearest first (:meth:`_drain_order`), a ready one
        only once the job keeps without it as many ready workers as it will have, and a holder of the training state
        only once a worker that stays holds it too (see the module docstring); set :attr:`replacing`, and
        ``replaced`` on those that wait only for that."""
        job = self._job
        whole = job.policy.whole_host_slots
        keep = self.wanted + (-self.wanted % whole if whole else 0)  # a fallback host is kept whole
        on_fallback: list[WorkerRecord] = []
        ready = 0
        for w in job.active():
            if self.is_fallback(w.slot.host):
                on_fallback.append(w)
                ready += w.state in _READY
            elif w.state in _READY and job.hosts.stays(w.slot):
                ready += 1
        on_fallback.sort(key=self._drain_order)
        for w in on_fallback:
            w.replaced = False
        if self._sent_away:
            self._sent_away = {i for i in self._sent_away if i in job.workers and job.workers[i].alive}
        # Ready workers the job may lose and still have what it will have once every usable slot is ready.
        spare = ready - min(preferred + self.wanted, job.policy.max_np)
        replacing, handing, decided, going = 0, 0, set[str](), set[str]()
        for w in on_fallback[: max(0, len(on_fallback) - keep)]:
            if w.state not in _ACTIVE or w.slot.host in decided:
                continue  # taken along by a whole host already
            group = [o for o in on_fallback if o.slot.host == w.slot.host] if whole else [w]
            if whole:
                decided.add(w.slot.host)
            lost = sum(1 for o in group if o.state in _READY)
            last = lost <= spare and self._last_holders(group, going)
            if lost > spare or last:
                # Its replacement is not ready, or not launched yet, or does not hold the state yet (it takes it in
                # a round beside the group, which holds no place there either: .formation): it trains on till then.
                replacing += sum(1 for o in group if self._holds_place(o))
                if last:
                    handing += len(group)
                    for o in group:
                        o.replaced = True
                continue
            spare -= lost
            going.update(o.worker_id for o in group)
            self._sent_away.update(o.worker_id for o in group)
            why = (f"cheaper slots are back ({preferred} from the preferred sources): fallback host "
                   f"{w.slot.host} is no longer needed")
            log.info("job %s: worker %s (%s) will leave: %s", job.job_id, w.worker_id, w.label, why)
            self._send_away(w, why)
        if handing and not self._handing:
            log.info("job %s: %d fallback worker(s) no longer wanted hold the training state: they train on until "
                     "their replacements from the preferred sources hold it too (a round with both syncs it), then "
                     "leave at a commit", job.job_id, handing)
        self._handing = handing
        if replacing != self.replacing:
            if replacing > self.replacing:
                log.info("job %s: %d fallback worker(s) no longer wanted train on until their replacements from "
                         "the preferred sources are ready", job.job_id, replacing)
            self.replacing = replacing

    def _drain_order(self, w: WorkerRecord) -> tuple:
        """Fallback workers the least preferred first, as :func:`choose` ranks their slots (lower priority, then
        unknown price, then the priciest: the dearest hours are given back first), then newest first."""
        source, known = self._known.get(w.slot.host, ("", None))
        spec = self.specs.get(self._job.hosts.sources.get(w.slot.host, source))
        price = self._job.hosts.prices.get(w.slot.host, known)
        return (0 if spec is None else spec.priority, price is not None, -(price or 0.0), -w.seq)

    def _last_holders(self, group: list[WorkerRecord], going: set[str]) -> bool:
        """Whether ``group``, fallback workers the job would send away, takes the training state with it: it holds
        the state and no worker that stays (not in it, not in ``going``, not leaving) does. Holders are as for a
        notice (:meth:`.leaving.Leavers.mark`): workers at rendezvous or training that hold a commit; before any
        commit is heard of, the members of the running round (they make the first), none once it was aborted."""
        job = self._job
        if job.state_committed:
            def holds(o: WorkerRecord) -> bool:
                return o.state in _READY and o.holds_state
        elif job.abort_round >= job.round:
            return False
        else:
            def holds(o: WorkerRecord) -> bool:
                return o.state is S.RUNNING and o.round == job.round
        if not any(holds(o) for o in group):
            return False
        out = going | {o.worker_id for o in group}
        if not job.state_committed:
            stays = job.hosts.stays
            return not any(holds(o) and o.worker_id not in out and stays(o.slot) for o in job.active())
        newest = max(o.commit_seq for o in group)
        return not any(o.worker_id not in out and self._successor(o, newest) for o in job.active())

    def _successor(self, o: WorkerRecord, newest: int, failed: bool = False) -> bool:
        """Whether ``o`` is a worker that stays and holds the committed training state as of commit ``newest``, for a
        fallback worker to leave it: with a commit of its own (a commit number a sync gave it is not enough: Spot may
        take it back before it commits, and the round then fails), while a member of a running round that has not
        failed (``failed``: it is failing; its heartbeat may lag a commit behind), else at rendezvous with that
        commit or a newer one (not one from a round it left long ago; a member of a failed round may be dead)."""
        job = self._job
        if not (o.state in _READY and o.holds_state and o.commits > 0 and job.hosts.stays(o.slot)):
            return False
        if o.state is S.RUNNING and o.round == job.round:
            return not failed and job.abort_round < job.round
        return o.commit_seq >= newest

    def keep_holder(self, w: WorkerRecord, failed: bool) -> None:
        """``w``, draining, is back at rendezvous (``failed``: from a failure of its round): a fallback worker this
        sent away that holds the state no other worker that stays holds (its successors were lost, or their round
        failed, before their commit reached it) stays instead of taking the state with it: it waits for the next
        round (DRAINING to WAITING), marked ``replaced``, and is weighed again from there."""
        job = self._job
        if (w.worker_id not in self._sent_away or job.phase is not Phase.RUNNING or not w.holds_state
                or not job.hosts.stays(w.slot)):
            return
        # Whole hosts: a host-mate is no successor. It was sent away with this host and stays or leaves with it; one
        # kept a moment ago, counted so, would send this worker away and leave half a host no round can take.
        whole = job.policy.whole_host_slots
        if any(o is not w and not (whole and o.slot.host == w.slot.host) and self._successor(o, w.commit_seq, failed)
               for o in job.active()):
            return
        self._sent_away.discard(w.worker_id)
        w.stays()
        w.replaced = True
        log.warning("job %s: worker %s (%s) stays: it was to leave (cheaper slots are back), but no worker that stays "
                    "holds the training state it holds (%s)", job.job_id, w.worker_id, w.label,
                    "its round failed" if failed else "its replacements are gone")

    def _holds_place(self, w: WorkerRecord) -> bool:
        """Whether ``w`` counts among the workers that hold a place for launches
        (:meth:`.capacity.Capacity._placed`): a worker that holds none anyway is not given up twice."""
        hosts = self._job.hosts
        if w.state is S.RUNNING and not hosts.stays(w.slot):
            return False
        return not (self._job.policy.spares and w.rank is None and doubtful(hosts, w.slot.host))

    def _capacity(self, now: float) -> None:
        job = self._job
        if not job.discovered_once:
            return  # no host seen yet is not no spot host: a failed first discovery call must not raise a group
        hosts = job.hosts
        busy = {hosts.sources.get(w.slot.host) for w in job.alive()}
        shares = self._shares()
        for name, need, present, _ in shares:
            if not self.can_give.get(name, Room()).managed:
                continue  # the job may not change it (AccessDenied): no ask, and no event for a value never sent
            asked = 0 if name in self.inherited else self.requested.get(name, 0)
            again = now - self._asked_at.get(name, now) >= REASK_S
            if need > present and (need > asked or (again and need < asked)):
                # A smaller need is a new value, with its event (the larger one asked earlier would keep the group).
                self._ask(name, need, f"{self.wanted} fallback slot(s) wanted ({self.why})", now)
            elif need > present and again:
                # The same value again, with no event: the provider sends it only where it may change the group.
                self._asked_at[name] = now
                log.debug("job %s: --manage-capacity: host source %r asked again for %d: it shows %d host(s)",
                          job.job_id, name, asked, present)
                job.act(SetCapacity(name, asked))
            elif need == 0 and self.requested.get(name, 0) > 0 and name not in busy and not self._sent(name):
                # Its raise was never sent (held back, skipped): the provider drops the pending raise and sends no
                # 0 either; no event for a change never made.
                self.requested[name], self._asked_at[name] = 0, now
                log.info("job %s: --manage-capacity: host source %r is left as it is: this job never set its desired "
                         "capacity (its raise to %d was not sent)", job.job_id, name, asked)
                job.act(SetCapacity(name, 0))
            elif need == 0 and self.requested.get(name, 0) > 0 and name not in busy:
                givers = ", ".join(repr(n) for n, _, _, gives in shares if gives and n != name)
                why = ("the job no longer needs it" if not self.wanted else
                       f"host source(s) {givers or 'other'} give the {self.wanted} fallback slot(s) wanted")
                self._ask(name, 0, why, now)

    def _shares(self) -> list[tuple[str, int, int, int]]:
        """(fallback source, hosts the job wants of its group, hosts it shows, hosts it counts for), preferred
        first: each group keeps the hosts its workers use; of the slots still wanted, each is asked for what it
        can be given (:attr:`can_give`: up to its MaxSize), and the next for the rest of what it cannot give (a
        group the job may not change, whose raise is refused or whose hosts do not come counts for what it has,
        its own ask unchanged)."""
        hosts = self._job.hosts
        used = {w.slot.host for w in self._job.alive()}
        groups = []
        for name in self._fallbacks:
            present = [h for h in (*hosts.ready, *hosts.missing) if hosts.sources.get(h) == name]
            # Its own hosts' slots as last seen (another group's may be of another size); 0: none seen yet.
            per_host = max((hosts.ready.get(h) or hosts.missing.get(h, (0, 0.0))[0] for h in present), default=0)
            per_host = self.host_slots[name] = per_host or self.host_slots.get(name, 0)
            groups.append((name, present, per_host, sum(1 for h in present if h in used)))
        left = self.wanted - sum(busy * max(per_host, 1) for _, _, per_host, busy in groups)
        shares = []
        for name, present, per_host, busy in groups:
            need = busy + math.ceil(max(left, 0) / max(per_host, 1))
            room = self.can_give.get(name, Room())
            if room.most is not None:
                need = max(busy, min(need, max(room.most, len(present))))
            gives = need if room.gives is None else max(busy, min(need, max(room.gives, len(present))))
            shares.append((name, need if self.wanted else 0, len(present), gives if self.wanted else busy))
            left -= (gives - busy) * max(per_host, 1)  # of unknown size: the next group is asked as for 1 slot each
            if not per_host and need > busy:
                # None of its hosts seen: one host, the rest sized from the slots it shows (sized from another
                # group's 1-GPU hosts, a raise of 4-GPU ones paid for idle instances the whole job).
                shares[-1] = (name, busy + 1 if self.wanted else 0, len(present), shares[-1][3])
        return shares

    def raised(self, *, sent: bool = False) -> dict[str, int]:
        """The groups this job raised and has not asked to set back to 0: source -> the desired capacity it asked for.
        ``sent``: what a driver restarted after a crash may lower (its sign of life): the groups taken over, and
        those the job's calls may have set (``Room.holds``, a raise not yet sent is not: its call is written ahead)
        until the cloud has taken their 0 (asked, throttled or under way: a driver killed then leaves its successor
        the group, still paid, at the value it holds)."""
        if not sent:
            return {name: hosts for name, hosts in self.requested.items() if hosts > 0}
        out = {}
        for name, hosts in self.requested.items():
            room = self.can_give.get(name, Room())
            if hosts > 0 and (name in self.inherited or room.owned is None) or room.holds:
                out[name] = hosts or room.holds
        return out

    def _sent(self, name: str) -> bool:
        return self.can_give.get(name, Room()).owned is not False or name in self.inherited

    def inherit(self, raised: Mapping[str, int]) -> None:
        """Take over what a crashed predecessor had raised (its :meth:`raised`, kept beside the checkpoints): set back
        to 0 by the same rule as the job's own; a source not a fallback of this command is left as it is (WARNING)."""
        job = self._job
        for name, hosts in raised.items():
            spec = self.specs.get(name)
            if spec is None or not spec.fallback or not job.policy.manage_capacity:
                log.warning("job %s: the previous driver raised host source %r to %d, which this command does not "
                            "manage as a fallback (--manage-capacity): it is left as it is", job.job_id, name, hosts)
                continue
            if hosts > self.requested.get(name, 0):
                self.requested[name] = self.inherited[name] = hosts
                log.info("job %s: the previous driver raised host source %r to %d; it is set back to 0 once the "
                         "job no longer needs it", job.job_id, name, hosts)

    @property
    def fallbacks(self) -> tuple[str, ...]:
        """The fallback sources, preferred first (priority, then price): the first is raised first."""
        return tuple(self._fallbacks)

    def lowered(self, source: str, *, made: bool = True) -> None:
        """``source``'s group was set back to 0 outside a step (the job is over, see the driver's shutdown); not
        ``made``: the job had never set it, and it was left as it is (no event)."""
        self.requested[source] = 0
        if made:
            self._job.emit("capacity", source=source, hosts=0, reason="the job is over")

    def _ask(self, source: str, hosts: int, why: str, now: float) -> None:
        job = self._job
        self.requested[source] = hosts
        self._asked_at[source] = now
        self.inherited.pop(source, None)
        log.info("job %s: --manage-capacity: desired capacity of host source %r to %d: %s", job.job_id, source,
                 hosts, why)
        job.emit("capacity", source=source, hosts=hosts, reason=why)
        job.act(SetCapacity(source, hosts))

    # -------------------------------------------------------------------- cost
    def charge(self, now: float) -> None:
        """Charge what the job pays for now (:mod:`.paid`: its workers, and the free slots of the fallback hosts it
        raised) up to ``now``, and emit a ``cost`` event when one is due."""
        if not self.specs:
            return
        job = self._job
        hosts = job.hosts
        alive = job.alive()
        raised = {name: n for name, n in self.raised().items() if self._sent(name)}
        key = (hosts.version, len(job.workers), len(alive), tuple(raised.items()))
        if key != self._held_key:
            self._held_key = key
            now_paid = paid(alive, hosts, self._known, raised)
            self._held, self._idle_slots, self._idle.idle = now_paid.held, now_paid.idle_slots, now_paid.idle
            on = Counter(w.slot.host for w in alive)  # the free slots of idle hosts without a price, as paid() counts
            self._idle_unpriced = sum(hosts.ready.get(h, 0) - on[h] for group in now_paid.idle.values() for h in group
                                      if hosts.prices.get(h) is None)
            fallback_prices = [p for h, (s, p) in self._known.items() if s in self._fallbacks and p is not None]
            fallback_spec = next((self.specs[n].price for n in self._fallbacks if self.specs[n].price is not None),
                                 None)
            if fallback_spec is not None or fallback_prices:
                self.cost.fallback_price = fallback_spec if fallback_spec is not None else max(fallback_prices)
        self._idle.say(job.job_id, now)
        self.cost.advance(now, self._held, self._idle_slots, self._idle_unpriced)
        rate = self.cost.dollars_per_hour
        if (rate != self._cost_rate and now - self._cost_at >= COST_EVENT_EVERY_S) or \
                now - self._cost_at >= COST_EVENT_MAX_S:
            self._cost_at, self._cost_rate = now, rate
            self.emit_cost()

    def carry_cost(self, before: CostSoFar) -> None:
        """Go on from what the job cost under a crashed predecessor (its meter's figures, kept beside the
        checkpoints), with a ``cost`` event that says the sum."""
        if self.specs:
            self.cost.carry(before)
            self._carried = (self._carried or 0.0) + before.dollars
            self.emit_cost()

    def summary(self, now: float) -> CostSummary:
        """The cost so far, charged up to ``now``."""
        self.cost.advance(now, self._held, self._idle_slots, self._idle_unpriced)
        return self.cost.summary()

    def per_commit(self, s: CostSummary) -> PerCommit:
        """What this driver's run cost per commit, of ``s`` (:meth:`summary`): the dollars it spent (not those
        carried from a crashed predecessor, :meth:`carry_cost`) over the commits made since the run began: the
        job's start, else its first checkpoint load or the workers it adopted (a resumed job's commits count
        from its checkpoint, not from the job's first commit)."""
        job = self._job
        base = job.commit_base if job.commit_base is not None else (None if job.resumed else 0)
        commits = 0 if base is None else max(0, job.commit_high - base)
        dollars = max(0.0, s.dollars - (self._carried or 0.0))
        return PerCommit(commits, dollars, dollars / commits if commits else None, self._carried is not None)

    def emit_cost(self) -> None:
        """A ``cost`` event with the running figures."""
        s = self.cost.summary()
        per = self.per_commit(s).value
        self._job.emit("cost", dollars=round(s.dollars, 6), dollars_per_hour=round(s.dollars_per_hour, 6),
                       slot_hours=round(s.slot_hours, 6), unpriced_slot_hours=round(s.unpriced_slot_hours, 6),
                       idle_slot_hours=round(s.idle_slot_hours, 6),
                       fallback_slots=self.wanted, per_step=None if per is None else round(per, 8),
                       by_source={k: round(v, 6) for k, v in s.by_source.items()})
