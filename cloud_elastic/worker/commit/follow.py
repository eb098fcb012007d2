"""Follow-mode admission: a newcomer trains along with the running workers while it receives their commit.

Today's sync (``TorchState.sync``, ``comm.heal``) ends only when a newcomer has
received the whole committed state, so the running workers' stall at the
admitting commit grows with the state. In follow mode the admitting round's
sync moves only its small parts (attributes, samplers, schedulers, the optimizer
state's skeleton, in the broadcast it makes anyway); the newcomers join the
round as *followers*:

* a follower takes part in every gradient allreduce with a zero contribution
  (its bucket zeroed before it is sent, the membership flag kept), and averages
  divide by the number of *active* members (``comm.followers``); a user's
  ``hvd.allreduce`` from a follower sends the op's identity (0 for a sum or an
  average, +inf for a minimum...), so a metric is not polluted;
* its ``ElasticSampler`` gives it a copy of an active member's shard, and
  records batches as the active members do (``comm.followers.data_shard``): its samples
  are not trained, and not counted as processed either; the window's effective
  batch is the one before the admission;
* at each commit (:func:`at_commit`, after the membership check; from the
  second of the window where rank 0's commit interval allows, :func:`quiet`, so
  that the switching step carries no piece) the holders
  send it the next pieces of the committed state, at most
  ``CLOUD_ELASTIC_FOLLOW_MB`` (4 MB) per commit, or several commits' pieces at
  once where the window would otherwise outlast ``CLOUD_ELASTIC_FOLLOW_WINDOW_S``
  (30 s; rank 0 says how many in a two-element broadcast at the window's first
  commit and then every few commits, from the window's pace so far, and all the
  rest once the time is up: :func:`_pace`), cut and shared among all
  holders by ``comm.heal`` (each holder a part, point to point): every
  parameter (with the optimizer state of the same shape, sliced alike) and
  every other optimizer-state tensor, in a plan every member works out alike
  from shapes (:func:`plan`). A commit is a step boundary, and what is sent
  there is the commit itself, outside the window between an update and its
  commit, so a holder's commit kept in place stays exact. The pieces travel
  while the next step computes (``Heal.post``) and land before its update
  (``followers.land``, from ``DistributedOptimizer.step``, or at the next commit
  where no step came between): a holder's tensors change no sooner, and a
  follower's are copied in from buffers of its own (a receive a failed round
  leaves behind writes nothing the next sync gives). Only one commit's pieces
  travel so (several at once, the pace's catch-up or ``complete``'s rest, are
  received in place at the commit), and only where rank 0 saw no parameter
  changed in place outside the optimizer (:func:`ahead`: a clamp at the top of
  the loop would race the piece on its way);
* the follower applies every step's averaged gradients with the optimizer's own
  ``step()`` to the parameters whose first piece has arrived (the others have
  no gradient during its update, ``followers.received_only``, and keep the
  script's own values; its optimizer state starts as zeros whose pages are
  written only as the pieces arrive, ``comm.skeleton.zeros``, so what it
  updates is finite). The supported optimizers update each
  element from that element's parameter, gradient and state and the
  parameter's one-element ``step`` (sent with the parameter's first piece),
  so an element received stays equal to the holders' from then on, and an
  element not received yet is overwritten when it arrives;
* each commit after a piece arrived, every member adds up the bits of that
  piece as it is now, one update later (a digest at the cost of a read of the
  piece); at the commit after the last piece, rank 0's model buffers are sent
  (BatchNorm statistics: each worker's own, as in a sync), and one allgather
  compares every member's digests and state fingerprint. Equal: the follower
  commits again, holds that commit and the whole round raises
  :class:`FollowerActivated`, which ``elastic.run`` answers with ``state.reset()``
  (the samplers re-shard over every member) and no sync, then enters the
  training function again. Unequal: the same, with today's full sync first.
  The reset callbacks do not run there: a script sees one reset per admission
  (at the switch, on the workers that were there; none on the newcomer), as
  with the whole sync. What it sees otherwise during the window (``hvd.size()``
  counts the follower, gradients average over the active members): see
  docs/porting.md.

A follower holds no commit during the window (``ledger.following``), so a
failure of anyone in it ends the round as any failure does: the survivors go
back to their commits, and the next round's sync gives a surviving follower the
whole state as today. Only rank 0 decides (:func:`decide`), and only where
following is known to be exact and the commit stays on two hosts
(:func:`_exposure`); elsewhere the admission syncs as before: two holders of
the commit on two hosts at least, no window of the round before cut short, Gloo on CPU, replicas (no ``hvd.shard``), one ``TorchState`` whose
optimizers are all ``DistributedOptimizer`` over ``SGD``, ``Adam``,
``AdamW``, ``Adagrad`` or ``RMSprop``, one backward pass per step, every
parameter of its models updated by one of them, no SyncBatchNorm or GradScaler,
the newcomers (workers that never held a commit) in the highest ranks and each one growing the round (a spare
that takes a lost or leaving member's place gets the whole state in the sync, so that the size it keeps trains
from the switch: the promise of ``--spares``), and a state that has trained (commit 1 on).
On by default; ``CLOUD_ELASTIC_FOLLOW=0`` turns it off (every admission by the whole sync).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from cloud_elastic.worker.comm import collectives
from cloud_elastic.worker.comm.compression import Compression
from cloud_elastic.worker.comm.heal import Heal
from cloud_elastic.worker.comm.skeleton import _join_tensors, allocate, state_limit
from cloud_elastic.worker.commit.fingerprint import fingerprint
from cloud_elastic.worker.commit.handlers import ModelHandler, OptimizerHandler, SnapshotHandler, StateDictHandler
from cloud_elastic.worker.exceptions import HostsUpdatedInterrupt
from cloud_elastic.worker.comm.followers import current, land
from cloud_elastic.worker.comm.sync_batchnorm import SyncBatchNorm

__all__ = ["FollowerActivated", "Window", "plan", "decide", "quiet", "start", "at_commit", "complete", "shed",
           "pace_word"]

log = logging.getLogger(__name__)

#: The optimizers whose update is element by element (see the module docstring), by class.
SUPPORTED = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop)


class FollowerActivated(HostsUpdatedInterrupt):
    """Raised by ``commit()`` on every member at once when a follow window ends: the state was just committed,
    nothing rolls back; ``elastic.run`` calls ``state.reset()`` (samplers re-shard over every member; not the
    reset callbacks, which ran at the switch) and, when ``sync``, first gives the follower the whole state as
    before (its state did not match the holders'), then enters the training function again."""

    def __init__(self, sync: bool) -> None:
        super().__init__(skip_sync=not sync)
        self.sync = sync


@dataclass(frozen=True)
class Slice:
    """Elements ``start`` to ``stop`` of each tensor named by ``refs`` (same number of elements each)."""

    refs: tuple[tuple[Any, ...], ...]
    start: int
    stop: int


@dataclass
class Window:
    """One round's follow window, the same on every member."""

    round: int
    followers: list[int]
    size: int
    seq: int | None
    plan: list[list[Slice]]
    boundary: int = 0
    digests: list[int] = field(default_factory=list)
    bytes: int = 0
    #: Per parameter (by ``id``): the boundary of its first piece. A follower updates it from then on only.
    first: dict[int, int] = field(default_factory=dict)
    #: When this member opened the window (``time.monotonic``); rank 0's bounds the window (``follow_window_s``).
    opened: float = 0.0
    #: Rank 0 said that the window moves more than one commit's pieces a commit (see :func:`_pace`).
    paced: bool = False
    #: Rank 0's last word (:func:`_pace`): the plan's commits that move at each commit, until ``decide_at``.
    pace: int = 1
    #: The boundary of rank 0's next word on the pace.
    decide_at: int = 0
    #: On rank 0, the seconds between its last two commits before the window: its pace until it has one of its own.
    interval: float = 0.0
    #: Rank 0's word (:func:`quiet`): the switching step's commit moves no pieces; they start at the next one.
    quiet: bool = False
    #: Rank 0's word (:func:`ahead`): a commit's pieces travel while the next step computes.
    ahead: bool = False
    #: The last commit's pieces, on their way (``heal.InFlight``) until ``followers.land``: before the next update.
    in_flight: Any = None

    @property
    def active(self) -> int:
        return self.size - len(self.followers)


# ------------------------------------------------------------------------------------------- the plan
def _optimizers(state: Any) -> list[tuple[int, Any]]:
    return [(i, h.value) for i, h in enumerate(state._handlers.values()) if isinstance(h, OptimizerHandler)]


def _units(state: Any) -> list[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int]]:
    """Per parameter: the refs of the tensors sliced with it, of the other state tensors, and its size."""
    units = []
    handlers = list(state._handlers.values())
    covered: set[int] = set()
    for index, opt in _optimizers(state):
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                covered.add(id(p))
                aligned, other = [("p", index, g, i)], []
                for key in sorted(k for k, v in opt.state.get(p, {}).items() if isinstance(v, torch.Tensor)):
                    ref = ("s", index, g, i, key)
                    (aligned if opt.state[p][key].numel() == p.numel() and p.numel() > 1 else other).append(ref)
                units.append((aligned, other, p.numel()))
    for index, handler in enumerate(handlers):  # parameters no optimizer updates (frozen): sent once
        if isinstance(handler, ModelHandler):
            for name, p in handler.value.named_parameters():
                if id(p) not in covered:
                    units.append(([("m", index, name)], [], p.numel()))
    return units


def _tensor(state: Any, ref: tuple[Any, ...]) -> torch.Tensor:
    handler = list(state._handlers.values())[ref[1]]
    if ref[0] == "m":
        return dict(handler.value.named_parameters())[ref[2]].detach()
    p = handler.value.param_groups[ref[2]]["params"][ref[3]]
    return p.detach() if ref[0] == "p" else handler.value.state[p][ref[4]]


def _words(step: int, tensors: list[torch.Tensor]) -> int:
    """``step`` elements a slice, rounded down so that a slice of each tensor starts and ends on an 8-byte boundary
    of it (:func:`_digest` then reads it in place): Adam's 12 bytes an element made 333,333-element slices of the
    4 MB budget, every other one 4 bytes off, each copied to be read (review s67 rvU). A step under a word stays."""
    word = max(8 // math.gcd(8, t.element_size()) for t in tensors)
    return max(1, step - step % word if step >= word else step)


def plan(state: Any, budget: int) -> list[list[Slice]]:
    """The pieces sent at each commit, at most ``budget`` bytes a commit (one slice more than that only when a
    single element row is bigger), from the state's shapes alone: the same on every member."""
    boundaries: list[list[Slice]] = []
    filling: list[Slice] = []
    used = 0

    def put(piece: Slice, nbytes: int) -> None:
        nonlocal filling, used
        if filling and used + nbytes > budget:
            boundaries.append(filling)
            filling, used = [], 0
        filling.append(piece)
        used += nbytes

    for aligned, other, _ in _units(state):
        for ref in other:  # first: a parameter's step count arrives no later than its first elements
            t = _tensor(state, ref)
            step = _words(budget // t.element_size(), [t])
            for a in range(0, t.numel(), step):
                put(Slice((ref,), a, min(t.numel(), a + step)), (min(t.numel(), a + step) - a) * t.element_size())
        tensors = [_tensor(state, ref) for ref in aligned]
        per = sum(t.element_size() for t in tensors)
        n = tensors[0].numel()
        step = _words(budget // per, tensors)
        for a in range(0, n, step):
            put(Slice(tuple(aligned), a, min(n, a + step)), (min(n, a + step) - a) * per)
    if filling:
        boundaries.append(filling)
    return boundaries


def _index(state: Any, window: Window) -> None:
    """A follower's ``window.first``, from the window's plan (again after :func:`_merge`)."""
    first_of: dict[tuple[Any, ...], int] = {}
    for b, pieces in enumerate(window.plan):
        for piece in pieces:
            for ref in piece.refs:
                if ref[0] != "m":
                    first_of.setdefault(ref[1:4], b)
    window.first = {}
    for index, opt in _optimizers(state):
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                b = first_of.get((index, g, i))
                if b is not None:
                    window.first[id(p)] = b


def _views(state: Any, pieces: list[Slice]) -> list[torch.Tensor]:
    """The live tensors' elements of ``pieces``, as views (resolved now: zero-copy commits move storages)."""
    return [_tensor(state, ref).reshape(-1)[s.start: s.stop] for s in pieces for ref in s.refs]


def _digest(views: list[torch.Tensor]) -> int:
    """The views' bytes added up as little-endian 64-bit words (each view zero-padded to a multiple of 8 bytes),
    modulo 2**62: the same for the same bytes wherever they lie. An aligned view is read in place, at memory
    speed; a 32-bit sum into 64 bits, as before, made a temporary at every commit and cost a window step of the
    benchmark's 1 GB state 2.5 ms (12.5 against 10.2 ms, issue 41)."""
    total = 0
    for v in views:
        raw = v.reshape(-1).view(torch.uint8)
        if raw.storage_offset() % 8 or raw.data_ptr() % 8:  # torch views by the offset; the plan avoids this
            raw = raw.clone()  # a copy, which the allocator aligns
        whole = raw.numel() - raw.numel() % 8
        total += int(raw[:whole].view(torch.int64).sum())  # wraps modulo 2**64, in any order of addition
        if whole < raw.numel():  # the last word, zero-padded: its bytes alone, not a copy of the view
            total += int.from_bytes(raw[whole:].numpy().tobytes(), "little")
    return total & (2**62 - 1)


# --------------------------------------------------------------------------------------- the decision
NOTHING_TO_FOLLOW = "no trained commit to follow"


def _refusal(ctx: Any, state: Any, receivers: list[int], root_seq: int | None, fresh: list[int] | None) -> str:
    """Why these receivers cannot follow ("" if they can); on rank 0, from its own state."""
    info = ctx.info
    if not ctx.settings.follow:
        return "CLOUD_ELASTIC_FOLLOW=0"
    if getattr(ctx.device, "type", "cpu") != "cpu" or ctx.backend != "gloo":
        return "not Gloo on CPU"
    if not receivers or receivers != list(range(info.size - len(receivers), info.size)) or 0 in receivers:
        return "the receivers are not the newest ranks"
    if not root_seq or info.from_checkpoint:
        return NOTHING_TO_FOLLOW
    interval, bound = getattr(ctx.ledger, "commit_interval", None), ctx.settings.follow_window_s
    if interval is not None and 2 * interval > bound:  # the pieces at one commit at least, the check at the next
        return (f"commits {interval:.3g} s apart: a window of two commits would outlast "
                f"CLOUD_ELASTIC_FOLLOW_WINDOW_S={bound:g} s")
    exposed = _exposure(ctx, receivers)
    if exposed:
        return exposed
    if fresh is None or not set(receivers) <= set(fresh):
        return "a receiver held a commit of its own (a survivor of a failure)"
    if len(receivers) > info.size - getattr(ctx, "previous_size", 0):
        return "a receiver takes a lost or leaving member's place (a spare): the size it keeps trains from the switch"
    handlers = list(state._handlers.values())
    if any(getattr(h, "sharded", False) for h in handlers):
        return "sharded state"
    if any(isinstance(h.value, torch.amp.GradScaler) for h in handlers if isinstance(h, StateDictHandler)):
        return "a GradScaler"
    opts = [h for h in handlers if isinstance(h, OptimizerHandler)]
    models = [h for h in handlers if isinstance(h, ModelHandler)]
    if not opts or not models:
        return "no model and optimizer"
    for h in opts:
        opt = h.value
        if not h.distributed or type(opt).__mro__[1] not in SUPPORTED:
            return f"optimizer {type(opt).__mro__[min(1, len(type(opt).__mro__) - 1)].__name__} not followed"
        if getattr(opt, "_ce_closures", False):  # its step's gradients come from inside step() (``optim.closure``)
            return "an optimizer stepped with a closure"
        if opt._ce_passes != 1 or opt._ce_compression not in (Compression.none, Compression.fp16, Compression.bf16):
            return "several backward passes a step, or a custom compression"
        if any(g.get("differentiable") or g.get("capturable") for g in opt.param_groups):
            return "differentiable or capturable optimizer settings"
    trained = {id(p) for h in opts for g in h.value.param_groups for p in g["params"]}
    for h in models:
        if any(p.requires_grad and id(p) not in trained for p in h.value.parameters()):
            return "a model parameter that no DistributedOptimizer updates"
        if any(isinstance(m, (torch.nn.SyncBatchNorm, SyncBatchNorm)) for m in h.value.modules()):
            return "SyncBatchNorm"  # hvd's too (review h6): a follower's statistics would count in the members'
        if not all(t.is_contiguous() for t in h.value.state_dict().values() if isinstance(t, torch.Tensor)):
            return "a non-contiguous tensor"
    return ""


def _exposure(ctx: Any, receivers: list[int]) -> str:
    """Why a window would leave the commit exposed ("" if it would not). Its followers hold no commit, so the
    holders must be two at least on two hosts at least: a host lost (killed, reclaimed, drained) in the window
    leaves a holder, and the failure or the graceful change ends the window there; the next sync then gives the
    whole commit (a window cut short is not started again: under churn it might never end)."""
    info = ctx.info
    cut = getattr(ctx, "following", None)
    if cut is not None and cut.round != info.round:
        return f"the follow window of round {cut.round} was cut short by a membership change"
    hosts = getattr(ctx.ledger, "sync_hosts", None)
    holders = [rank for rank in range(info.size) if rank not in receivers]
    if hosts is None or len(hosts) != info.size:
        return "the holders' hosts are not known"
    on = len({hosts[rank] for rank in holders})
    if len(holders) < 2 or on < 2:
        return f"{len(holders)} holder(s) of the commit on {on} host(s); a window needs two on two hosts"
    return ""


def decide(ctx: Any, state: Any, receivers: list[int], root_seq: int | None, fresh: list[int] | None = None
           ) -> list[int]:
    """On rank 0: the followers of this round's sync (its receivers, each a worker that never held a commit: a
    newcomer, a spare; ``fresh``, from ``sync_facts``), or [] for today's whole sync."""
    if getattr(ctx, "follow_ended_round", None) == ctx.info.round:
        return []  # a window of this round ended unequal: the sync that follows gives the whole state
    why = _refusal(ctx, state, receivers, root_seq, fresh)
    if why:
        if receivers:  # a job's first sync has nothing to follow: no word for it (review rvD)
            log.log(logging.DEBUG if why == NOTHING_TO_FOLLOW else logging.INFO,
                    "worker %s: rank(s) %s receive the whole commit in the sync (no follow mode: %s)",
                    ctx.worker_id, receivers, why)
        return []
    return list(receivers)


#: The longest commit interval at which the switching step's commit moves no piece (see :func:`quiet`).
QUIET_INTERVAL_S = 1.0


def quiet(ctx: Any) -> bool:
    """On rank 0, with followers: whether the window's first commit, the one that ends the switching step, moves no
    pieces (they start at the next commit). That step already carries the rendezvous, the sync's small parts and
    the newcomer's first step, with the running workers waiting; a piece there made it the admission's longest
    gap (2.5-5 ms more at the benchmark's small model, issue 41's stall). Only where commits are short
    (:data:`QUIET_INTERVAL_S`, and a tenth of ``CLOUD_ELASTIC_FOLLOW_WINDOW_S`` at most): there a few ms count,
    and the commit more costs the window next to nothing; a script committing every 10 s would have had a
    window one commit (10 s) longer, past its bound at the least jitter (review rvQ)."""
    interval = getattr(ctx.ledger, "commit_interval", None)
    return interval is not None and interval <= min(QUIET_INTERVAL_S, ctx.settings.follow_window_s / 10)


def ahead(state: Any) -> bool:
    """On rank 0, with followers: whether the window's pieces may travel while the next step computes (landing
    before its update, ``followers.land``), rather than be sent and received at the commit. Not where the loop
    changes a parameter in place outside the optimizer (``DistributedOptimizer._ce_check_outside`` saw it: WGAN's
    clamp at the top of each iteration, a step pre-hook): the change would race the piece on its way, on the
    holders and on the followers alike, and the window would end unequal, in a whole sync (review s67 rvU F3)."""
    return not any(getattr(h.value, "_ce_outside", False) for h in state._handlers.values()
                   if isinstance(h, OptimizerHandler))


def start(ctx: Any, state: Any, followers: list[int], skeletons: list[Any], seq: int | None,
          quiet_first: bool = False, ahead: bool = False) -> None:
    """Every member, in the admitting sync once the small parts came: open the window. A follower builds its
    optimizers' state from rank 0's skeletons (zeros whose memory is touched as the pieces arrive)."""
    info = ctx.info
    if info.rank in followers:
        for (_, opt), shape in zip(_optimizers(state), skeletons):
            # Zeros whose pages are touched as the pieces come (skeleton.zeros): what it updates before a
            # parameter's state arrives is finite (garbage made its loss NaN), at no cost while the others wait.
            tensors = allocate(shape, "optimizer state", state_limit(opt), zeroed=True)
            opt.load_state_dict(_join_tensors(shape, tensors))
    window = Window(info.round, list(followers), info.size, seq, plan(state, ctx.settings.follow_bytes),
                    opened=time.monotonic(), interval=getattr(ctx.ledger, "commit_interval", None) or 0.0,
                    quiet=quiet_first, ahead=ahead)
    if info.rank in followers:
        _index(state, window)
    ctx.following = window
    ctx.ledger.following = info.rank in followers  # its commits hold nothing of the job's until the window ends
    for handler in state._handlers.values():
        reset = getattr(handler.value, "reset", None)
        if type(handler).__name__ == "SamplerHandler" and reset is not None:
            reset()  # the active members' shards (a follower copies one)
    total = sum(s.stop - s.start for b in window.plan for s in b)
    log.log(logging.INFO if info.rank == 0 else logging.DEBUG,  # one line a window, not one a member (rvD)
            "worker %s: rank(s) %s follow from commit %s: %d piece(s) over %d commit(s) (%d elements)",
            ctx.worker_id, followers, seq, sum(len(b) for b in window.plan), len(window.plan), total)


def shed(ctx: Any, state: Any) -> None:
    """A worker that joined a running job, before its first sync: free what it built itself and will not keep.

    Whatever the sync (followed or whole), it receives the job's optimizer state and commit, so its own
    optimizers' state and the whole copy of its own first commit (``handlers.SnapshotHandler._first``) go now,
    while the running workers still train towards the commit that admits it: freed at the switch, where they
    wait for it, 1 GB of them cost 0.5 to 0.8 s here. Not rank 0, whose state is the job's at its start."""
    if not getattr(ctx, "joined_running", False) or ctx.ledger.commit_seq != 0 or ctx.info is None or ctx.info.rank == 0:
        return
    for handler in state._handlers.values():
        if isinstance(handler, SnapshotHandler) and not getattr(handler, "sharded", False):
            handler._first = None
            if isinstance(handler, OptimizerHandler):
                handler.value.state.clear()


def _resave(state: Any) -> None:
    """A follower's commit is its live state again (its version counters too), without closing a window."""
    for handler in state._handlers.values():
        if isinstance(handler, SnapshotHandler):
            handler.save()


#: The most commits between two of rank 0's words on the pace (each a synchronisation point of every member,
#: 3 ms a commit here when it was said at every one).
PACE_EVERY = 16


def pace_word(left: int, commits_done: int, spent: float, bound: float, interval: float) -> tuple[int, int]:
    """Rank 0's word on the pace (see :func:`_pace`): (the plan's commits that move at each commit, for how many
    commits), with ``left`` of the plan's commits left after ``commits_done`` of the window's, ``spent`` seconds
    into a window bounded by ``bound``, at ``interval`` seconds between two commits before the window."""
    remaining = bound - spent
    mean = spent / commits_done if commits_done > 0 else interval
    if remaining <= 0:
        return left, 1
    if mean <= 0:
        return 1, 1  # no interval known yet: it speaks again at the next commit, with one
    commits = max(1, int(remaining / mean) - 1)  # at that interval, the check's commit left out
    return min(left, -(-left // commits)), max(1, min(PACE_EVERY, int(remaining / mean / 2)))


def _pace(ctx: Any, window: Window) -> tuple[int, int]:
    """On every member, rank 0's word (a two-element broadcast, :func:`pace_word`): how many of the plan's next
    commits move at each commit, and for how many commits, so that the window ends within ``follow_window_s``.
    1 while it keeps to that at the pace seen so far (its commits' mean interval; at the first, the interval of
    its last two commits before the window: review rvD, a script committing every 16 s kept a window of 47 s);
    more as it falls behind; all that is left once the time is up. The commit after the last piece, which ends
    the window, is counted in. The word holds for at most :data:`PACE_EVERY` commits and for no more than half
    the time left at that mean interval, so rank 0 speaks again before the time is up even if the commits come
    up to twice as slowly as they did."""
    left = len(window.plan) - window.boundary
    pace, gap = 1, 1
    if ctx.info.rank == 0:
        pace, gap = pace_word(left, window.boundary, time.monotonic() - window.opened, ctx.settings.follow_window_s,
                              window.interval)
    word = torch.tensor([pace, gap], dtype=torch.int64)
    collectives.broadcast_(word, 0, "follow pace")
    pace, gap = (int(v) for v in word.tolist())
    if pace > 1 and ctx.info.rank == 0 and not window.paced:
        window.paced = True
        log.info("worker %s: the follow window would outlast CLOUD_ELASTIC_FOLLOW_WINDOW_S=%g s: %d commit(s)' "
                 "pieces move at each commit from now on, of %d left", ctx.worker_id, ctx.settings.follow_window_s,
                 pace, left)
    return max(1, pace), max(1, gap)


def _merge(ctx: Any, state: Any, window: Window, count: int) -> None:
    """The pieces of the plan's next ``count`` commits move at this one."""
    b = window.boundary
    window.plan[b:b + count] = [[piece for pieces in window.plan[b:b + count] for piece in pieces]]
    if ctx.info.rank in window.followers:
        _index(state, window)


def at_commit(ctx: Any, state: Any) -> None:
    """Every member, after a commit's membership check: send the next pieces, or end the window."""
    window = current(ctx)
    if window is None:
        return
    if window.quiet:  # the switching step's commit (see :func:`quiet`): the pieces start at the next one
        window.quiet = False
        return
    follower = ctx.info.rank in window.followers
    land(ctx)  # the last commit's pieces, where no update landed them (a commit without a step in between)
    if follower and window.boundary > 0:
        _resave(state)  # its commit holds what came (a received element's version counter did not move)
    with torch.no_grad():
        if window.boundary > 0:
            window.digests.append(_digest(_views(state, window.plan[window.boundary - 1])))
        if window.boundary < len(window.plan):
            if len(window.plan) - window.boundary > 1:
                if window.boundary >= window.decide_at:
                    window.pace, gap = _pace(ctx, window)
                    window.decide_at = window.boundary + gap
                if window.pace > 1:
                    _merge(ctx, state, window, min(window.pace, len(window.plan) - window.boundary))
            heal = Heal(window.followers, window.size, window.seq)
            views = _views(state, window.plan[window.boundary])
            if window.ahead and sum(v.numel() * v.element_size() for v in views) <= 2 * ctx.settings.follow_bytes:
                # On their way while the next step computes; landed before its update (``followers.land``), where
                # a holder's tensors start to change and a follower's take the update. At the benchmark's 1 GB
                # state a follower waited 4.4 ms a commit for its 4 MB with every member waiting for it (issue 41).
                window.in_flight = heal.post(views, "the commit, following")
            else:
                # Here and now, received in place: several commits' pieces at once (the pace's catch-up, the rest
                # at ``complete``), whose landing buffers would have held up to the whole state again (review s67
                # rvU F2), or a loop that changes parameters before ``step()`` (:func:`ahead`).
                heal.tensors(views, "the commit, following")
                if follower:
                    _resave(state)
            window.boundary += 1
            window.bytes += heal.bytes
            return
        heal = Heal(window.followers, window.size, window.seq)
        for handler in state._handlers.values():
            if isinstance(handler, ModelHandler):
                sd = handler.value.state_dict()
                params = {name for name, _ in handler.value.named_parameters(remove_duplicate=False)}
                heal.buffers({k: v for k, v in sd.items() if k not in params})
        mark = int(fingerprint(state) or "0", 16) & (2**62 - 1)
        rows = _gather(ctx, torch.tensor(window.digests + [mark], dtype=torch.int64))
    equal = bool((rows == rows[0:1]).all())
    ctx.following = None
    ctx.ledger.following = False
    if follower:
        _resave(state)
        ctx.ledger.holds_commit = equal
    if not equal:
        ctx.follow_ended_round = ctx.info.round
        log.warning("worker %s: the followers' state differs from the holders' at the end of the window; they "
                    "receive the whole commit now", ctx.worker_id)
    else:
        log.log(logging.INFO if ctx.info.rank == 0 else logging.DEBUG,
                "worker %s: rank(s) %s follow no more: %s moved here in %d commit(s), every digest equal",
                ctx.worker_id, window.followers, f"{window.bytes / 1e3:.1f} kB", len(window.plan))
    raise FollowerActivated(sync=not equal)


def _gather(ctx: Any, mine: torch.Tensor) -> torch.Tensor:
    """Every member's row of digests, by rank: one allgather. The rows have the same length on every member
    (one digest a commit of the window, and the fingerprint), so no sizes go first (``collectives.allgather``'s
    exchange of them was a second collective)."""
    what = "allgather follow digests"
    out = torch.empty((ctx.info.size, mine.numel()), dtype=torch.int64)
    ctx.wait(ctx.group(what).allgather([list(out.unbind(0))], [mine]), what)
    return out


def complete(ctx: Any, state: Any) -> bool:
    """The training function returned with a window open (on every member, at the same step): the rest of the
    state moves now, all at once, so that every worker ends with the same state. Returns whether the follower did
    not match (the caller then syncs it whole)."""
    window = current(ctx)
    if window is not None and window.boundary < len(window.plan):
        _merge(ctx, state, window, len(window.plan) - window.boundary)
    while current(ctx) is not None:
        try:
            at_commit(ctx, state)
        except FollowerActivated as exc:
            return exc.sync
    return False
