"""Sharded training at host granularity: FSDP2 inside a host, replicas across hosts (``hvd.shard``).

The instance is the unit of elasticity (``--whole-hosts --slots-per-host S``).
Inside a host, the model is sharded across its S workers with FSDP2
``fully_shard``, over the host's own process group: torch's *default* group,
formed once by :func:`shard` on a host-keyed namespace of the driver's store
(``CLOUD_ELASTIC_HOST_KEY``, new for each incarnation of the host), and never
changed while the host lives. Across hosts, local rank *i* of every host holds
shard *i*; the gradient shards are averaged over the round's *cross-host* group
of that local rank (:meth:`RoundGroupsMixin.cross_group`), which is formed anew
in each round at its first use and dies with the round, like the round's group.
A host that loses a worker leaves whole (the driver's ``--whole-hosts``), so the
host group never needs re-forming.

What each piece does in sharded mode:

* ``DistributedOptimizer`` over DTensor parameters: after backward (FSDP2 has
  reduce-scattered and averaged over the host), ``step()`` allreduces the local
  gradient shards over the cross-host group, sums then divides by the number of
  hosts: the arithmetic of FSDP2's HSDP, bitwise (docs/design/sharded.md);
* with more than one host, the membership flag is agreed over the round's whole
  group in each ``step()``, after the gradient average and before the update (one
  one-element allreduce, :func:`agree_before_update`; a commit with no step before
  it agrees alone), so every worker of every host stops at the same commit, and no
  worker updates a step that a host-mate's failed average rolls back from; one
  host agrees at each commit instead, as replicas do without buckets;
* ``TorchState`` commits the local shards of the parameters and of the
  optimizer state as it commits a replica (``commit.handlers.ShardedModelHandler``,
  ``ShardedOptimizerHandler``): in place in the common loop, else a kept copy
  made at the commit (never deferred to the optimizer step); it restores by
  copying them back, and syncs a newcomer host from the host of the newest
  commit, local rank *i* from local rank *i* over the cross-host group;
* an FSDP2 collective that fails because a host-mate died surfaces as a
  ``RuntimeError`` from torch; ``elastic.run`` treats it as a lost peer when the
  driver aborts the round (:func:`peer_lost`), and the worker leaves with its host.

Durable checkpoints (``--checkpoint-dir``) of a sharded model are torch DCP
checkpoints written by the workers of rank 0's host together
(:mod:`cloud_elastic.worker.durable.sharded`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import time
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from cloud_elastic.errors import ConfigError
from cloud_elastic.worker.comm.collectives import on_device
from cloud_elastic.worker.comm.statecodec import StateSyncError
from cloud_elastic.worker.context import init
from cloud_elastic.worker.exceptions import CollectiveError, WorkerRemoved
from cloud_elastic.worker.rounds.signed_store import SignedStore, host_namespace

__all__ = ["shard", "is_sharded", "local", "average_gradient_shards", "agree_before_update", "check_layout",
           "mixed_hosts", "check_hosts", "peer_lost"]

log = logging.getLogger(__name__)


class HostGroup:
    """The host's own process group (torch's default group), and the store it was formed on."""

    def __init__(self, key: str, store: Any, size: int) -> None:
        self.key = key
        #: Referenced as long as the group lives: torch calls back into a Python store (see ``groups``).
        self.store = store
        self.size = size


def shard(model: torch.nn.Module, modules: Iterable[torch.nn.Module] = (), **fully_shard_kwargs: Any) -> torch.nn.Module:
    """Shard ``model`` across this host's workers with FSDP2; return it (the same object, now an ``FSDPModule``).

    Each of ``modules`` (e.g. ``model.layers``) becomes its own FSDP2 unit
    first, then the whole model: the layers' parameters are all-gathered one unit
    at a time. ``fully_shard_kwargs`` go to ``torch.distributed.fsdp.fully_shard``.
    Call it after ``hvd.init()`` and before creating the ``DistributedOptimizer``,
    on every worker of every host, with the same layout. The host's group is
    formed at the first call. Needs ``cloud-elastic run --whole-hosts``.
    """
    ctx = init()
    ctx.join_if_pending()  # the host's group is formed among the workers of this worker's round
    if getattr(ctx, "host_group", None) is None:
        ctx.host_group = _form_host_group(ctx)
    from torch.distributed.fsdp import fully_shard

    for module in modules:
        fully_shard(module, **fully_shard_kwargs)
    fully_shard(model, **fully_shard_kwargs)
    return model


def _form_host_group(ctx: Any) -> HostGroup:
    if not ctx.standalone and not ctx.settings.host_key:
        raise ConfigError("hvd.shard needs whole hosts: run the job with cloud-elastic run --whole-hosts "
                          "--slots-per-host N")
    if dist.is_initialized():
        raise ConfigError("hvd.shard: torch.distributed's default process group already exists; cloud-elastic "
                          "makes it the host's own group (do not call init_process_group)")
    started = time.monotonic()
    while True:
        store, size = _try_host_group(ctx)
        if store is not None:
            break
    log.info("worker %s: formed its host's group (%d workers) in %.2fs", ctx.worker_id, size, time.monotonic() - started)
    return HostGroup(ctx.settings.host_key if not ctx.standalone else "standalone", store, size)


def _try_host_group(ctx: Any) -> tuple[Any, int]:
    """Form the host's group in this worker's current round; ``(None, 0)`` when that round was aborted while a
    host-mate had not arrived (this worker has then joined the next round, where the host-mate comes).

    The host's group outlives rounds, but its formation's keys are the round's
    (``host_namespace(..., "KEY@ROUND")``): a host-mate whose own first round failed
    to form (a peer died while it connected) is at rendezvous for the next round,
    which needs this worker there too. Waiting for it here, as this worker did, held
    both until the collective timeout. So a wait for a host-mate's key ends when the
    round is aborted; this worker withdraws the keys it wrote (a host-mate that still
    reads this round's keys does not find a stale address), joins the next round, and
    forms the group there. A host-mate that has arrived is never left: once its key is
    there, the formation goes on whatever happens to the round.
    """
    info = ctx.info
    if ctx.standalone:
        store, rank, size, round_ = dist.HashStore(), 0, 1, 0
    else:
        round_ = info.round
        namespace = host_namespace(ctx.settings.secret, ctx.job_id, f"{ctx.settings.host_key}@{round_}")
        store = FormingStore(ctx._store, namespace, ctx.settings.secret, sent_away=lambda: ctx.sent_away,
                             aborted=lambda: ctx._aborted(round_), timeout_s=ctx.collective_timeout_s)
        rank, size = info.local_rank, info.local_size
    try:
        with loopback_gloo(ctx.backend):
            dist.init_process_group(ctx.backend, store=store, rank=rank, world_size=size,
                                    timeout=timedelta(seconds=ctx.collective_timeout_s),
                                    device_id=ctx.device if ctx.backend == "nccl" else None)
    except BaseException:
        if ctx.standalone:
            raise
        if ctx.sent_away is not None:
            # Told to leave while waiting for a host-mate (it died before its hvd.shard): the host leaves whole.
            _leave_while_forming(ctx, ctx.sent_away)
        if not store.gave_up:
            raise
        store.withdraw()
        log.warning("worker %s: round %d was aborted while it waited for a host-mate to form its host's group; "
                    "joining the next round", ctx.worker_id, round_)
        _rejoin_before_training(ctx)
        return None, 0
    finally:
        if isinstance(store, FormingStore):
            store.forming = False
    return store, size


def _rejoin_before_training(ctx: Any) -> None:
    """Join the next round from inside ``hvd.shard`` (before ``elastic.run``, which syncs the state it finds)."""
    from cloud_elastic.worker.exceptions import CollectiveError

    ctx._abandon_round()
    while True:
        try:
            ctx.rendezvous("failure")
            return
        except CollectiveError as exc:
            log.warning("worker %s: could not join the next round (%s); retrying", ctx.worker_id, exc)
        except WorkerRemoved as exc:
            _leave_while_forming(ctx, str(exc))


def _leave_while_forming(ctx: Any, why: str) -> None:
    print(f"cloud-elastic: leaving the job while forming its host's group: {why}", file=sys.stderr, flush=True)
    ctx.leave()
    sys.exit(0)


class FormingStore(SignedStore):
    """The host's store while its group forms: a wait for a host-mate ends when the driver sends this worker away,
    or when the worker's round is aborted while the host-mate has not arrived.

    A host-mate that dies before its ``hvd.shard`` never writes its address, and the driver
    sends this worker away with its host (``--whole-hosts``); but it is blocked in torch's
    formation of the host's group, where no commit or rendezvous would tell it, and would wait
    ``CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S``. So each ``get`` and ``wait`` looks for its keys every
    ``POLL_S`` and, between looks, at what the worker's heartbeats last heard: ``sent_away()``
    (the driver's reason, or None) raises :class:`WorkerRemoved`; ``aborted()`` (the round was
    aborted) raises a store error and sets ``gave_up`` (see ``_try_host_group``). A slow
    host-mate is waited for as long as before: only the driver's word ends the wait early.
    Once the group has formed (``forming`` false) it is a plain :class:`SignedStore`.
    """

    POLL_S = 0.05

    def __init__(self, inner: Any, namespace: str, secret: str, *, sent_away: Callable[[], str | None],
                 timeout_s: float, aborted: Callable[[], bool] = lambda: False) -> None:
        super().__init__(inner, namespace, secret)
        self._sent_away = sent_away
        self._aborted = aborted
        self._timeout_s = timeout_s
        self._written: list[str] = []
        self.forming = True
        self.gave_up = False

    def _await(self, keys: list[str], timeout_s: float) -> None:
        if not self.forming:
            return
        deadline = time.monotonic() + timeout_s
        while not self._store.check(keys):
            why = self._sent_away()
            if why:
                raise WorkerRemoved(why)
            if self._aborted():
                self.gave_up = True
                raise _STORE_TIMEOUT(f"the round was aborted while waiting for the host's group keys {keys}")
            if time.monotonic() >= deadline:
                raise _STORE_TIMEOUT(f"timed out after {timeout_s:g}s waiting for the host's group keys {keys}")
            time.sleep(self.POLL_S)

    def set(self, key: str, value: Any) -> None:
        super().set(key, value)
        if self.forming:
            self._written.append(key)

    def withdraw(self) -> None:
        """Delete the keys this worker wrote while forming (its address, in an abandoned formation)."""
        for key in self._written:
            try:
                self.delete_key(key)
            except Exception:  # the store may be gone with the driver: nothing is left to read them then
                pass
        self._written.clear()

    def get(self, key: str) -> bytes:
        self._await([key], self._timeout_s)
        return super().get(key)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._await(keys, self._timeout_s if timeout is None else timeout.total_seconds())
        super().wait(keys, timeout)

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout_s = timeout.total_seconds()
        super().set_timeout(timeout)


#: What a store raises on a timeout (``DistStoreError``, a RuntimeError, where torch has it).
_STORE_TIMEOUT = getattr(dist, "DistStoreError", RuntimeError)


@contextlib.contextmanager
def loopback_gloo(backend: str) -> Iterator[None]:
    """A host's Gloo group connects its own workers only: over the loopback interface, whatever the
    machine's name resolves to (``GLOO_SOCKET_IFNAME``, for the default group's formation only)."""
    if backend != "gloo" or "GLOO_SOCKET_IFNAME" in os.environ:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)


def is_sharded(value: Any) -> bool:
    """Whether ``value`` is an FSDP2-sharded module, or an optimizer over DTensor parameters."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without distributed tensors shards nothing
        return False
    if isinstance(value, FSDPModule):
        return True
    if isinstance(value, torch.optim.Optimizer):
        return any(isinstance(p, DTensor) for g in value.param_groups for p in g["params"])
    return False


def local(t: Any) -> Any:
    """The part of ``t`` this worker holds: a DTensor's local shard (a view), any other value itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None and isinstance(t, torch.Tensor) else t


#: A gradient shard this big (and contiguous) is averaged in place, with no copy; smaller ones are packed.
_IN_PLACE_BYTES = 1 << 20
#: The most bytes packed into one flat buffer, and the most such buffers in flight: what the averaging
#: adds to a step's memory is bounded by their product, not by the model's size (a non-contiguous
#: shard bigger than a bucket excepted: it is packed alone).
_BUCKET_BYTES, _BUCKETS_IN_FLIGHT = 8 << 20, 2


def average_gradient_shards(ctx: Any, params: list[torch.nn.Parameter]) -> None:
    """Average each parameter's local gradient shard over the hosts (the round's cross-host group of this
    local rank): a sum, then a division by the number of hosts.

    A contiguous shard of ``_IN_PLACE_BYTES`` or more is reduced where it lies (no
    copy: a model's weight matrices, most of its bytes; FSDP2's shards are
    contiguous); smaller or non-contiguous ones are packed per dtype into flat
    buffers of up to ``_BUCKET_BYTES`` (a bigger non-contiguous one alone in a buffer
    of its size), at most ``_BUCKETS_IN_FLIGHT`` at a time, so the step holds no
    gradient-sized buffer of its own. Every host's local rank *i* holds the same
    shard shapes, so all issue the same allreduces. A failed wait abandons the round's
    group (``ctx.wait``): allreduces still in flight may write into gradients until
    its sockets close, and the step is rolled back; its gradients are computed anew.

    Every parameter of ``params`` (the optimizer's trainable ones) takes part: one
    without a gradient in this step (a branch this host's data did not run) is given
    zeros first, as the replicas' buckets do. Left out, the hosts would issue
    allreduces of different sizes, and the average would fail or mix shards. A mask of
    which parameters each host had a gradient for rides in the first packed bucket (no
    collective of its own when the model has a small shard of the first parameter's
    dtype); a parameter no host had one for gets its ``.grad`` back as None, as on a
    single host, so the optimizer updates the same parameters however many hosts the
    round has (AdamW would decay it, and start its moments, on zeros). Its zeros still
    travel, as DDP's unused parameters' do: a mask agreed first would cost every step a
    collective, and on a GPU a wait for backward, before any gradient could travel.
    """
    info = ctx.info
    if info is None or info.cross_size <= 1 or not params:
        return
    first = local(params[0])  # a gradient has its parameter's dtype and device (torch checks it)
    # Filled on the device, not copied there from a list: a blocking copy to a GPU waits for backward.
    mask = torch.ones(len(params), dtype=first.dtype, device=first.device)
    filled = []
    with torch.no_grad():
        for i, p in enumerate(params):
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # a DTensor as the parameter is: its local shard is zeros
                mask[i: i + 1].zero_()
                filled.append(i)
    _average(ctx, [mask] + [local(p.grad) for p in params])
    if filled:  # a host that had every gradient learns nothing from the mask: every parameter stays trained
        used = mask.tolist()  # averaged: above zero exactly where some host had a gradient
        for i in filled:
            if not used[i] > 0:
                params[i].grad = None


def _average(ctx: Any, grads: list[torch.Tensor]) -> None:
    """Average ``grads`` in place over the cross-host group (see :func:`average_gradient_shards`)."""
    info = ctx.info
    group = ctx.cross_group("gradient allreduce")
    pending: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []  # (work, reduced tensor, packed shards)

    def finish_one() -> None:
        work, reduced, packed = pending.pop(0)
        ctx.wait(work, "gradient allreduce", host=False)
        reduced.div_(info.cross_size)
        offset = 0
        for g in packed:
            g.copy_(reduced[offset: offset + g.numel()].view_as(g))
            offset += g.numel()

    def launch(in_place: torch.Tensor | None, packed: list[torch.Tensor]) -> None:
        while packed and sum(1 for _, _, p in pending if p) >= _BUCKETS_IN_FLIGHT:
            finish_one()  # before this bucket's buffer is made
        reduced = in_place if in_place is not None else torch.cat([b.reshape(-1) for b in packed])
        pending.append((group.allreduce([reduced]), reduced, packed))

    with torch.no_grad():
        small: dict[tuple[torch.dtype, torch.device], list[list[torch.Tensor]]] = {}
        filled: dict[tuple[torch.dtype, torch.device], int] = {}  # bytes in each dtype's last bucket
        for g in grads:
            nbytes, key = g.numel() * g.element_size(), (g.dtype, g.device)
            if g.is_contiguous() and nbytes >= _IN_PLACE_BYTES:
                launch(g, [])
                continue
            buckets = small.setdefault(key, [[]])
            if buckets[-1] and filled[key] + nbytes > _BUCKET_BYTES:
                buckets.append([])
            filled[key] = (filled[key] if len(buckets[-1]) else 0) + nbytes
            buckets[-1].append(g)
        for bucket in (b for buckets in small.values() for b in buckets if b):
            launch(None, bucket)
        while pending:
            finish_one()


def agree_before_update(ctx: Any) -> None:
    """Every worker of the round agrees, after its gradient average and before its update, with one
    one-element allreduce over the round's group; it carries the membership flag, which the commit
    then reads instead of making its own (as a replica's gradient bucket carries it).

    A worker lost after its backward fails only its own local rank's cross-host average: without
    this, a host-mate whose average completed would update and commit a step that its host-mate,
    whose average failed, rolls back from, and their host would hold shards of two commits
    (:func:`mixed_hosts`). Here the first one's agreement fails too (the driver aborts the round),
    before its update, so it rolls back exactly as well: every host stays at one commit.

    One host (``cross_size`` 1) skips it, and its commits agree on the flag themselves: its workers
    average nothing across hosts, so none can update a step a host-mate rolls back from while another
    host keeps the state (a lost worker takes its host out, and with it the job's only copy of the
    shards), and on a GPU the wait would hold the CPU until backward ends before it queues the update.
    """
    info = ctx.info
    if ctx.standalone or info is None or info.size <= 1 or info.cross_size <= 1:
        return
    flag = torch.full((1,), 1.0 if ctx.update_pending() else 0.0, device=ctx.device)
    ctx.wait(ctx.group("the step's agreement").allreduce([flag]), "the step's agreement")
    ctx.carry_update_flag(flag)


def _layout(value: Any) -> list:
    """What must be the same on every worker: a sharded model's parameters (names, full shapes, dtypes,
    placements) and FSDP2 units, or an optimizer's class and the full shapes of its parameter groups."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(value, torch.nn.Module):
        params = [(n, tuple(p.shape), str(p.dtype), str(getattr(p, "placements", "")))
                  for n, p in value.named_parameters()]
        return [params, [n for n, m in value.named_modules() if isinstance(m, FSDPModule)]]
    return [type(value).__name__, [[(tuple(p.shape), str(p.dtype)) for p in g["params"]] for g in value.param_groups]]


def check_layout(ctx: Any, values: list[Any], commit: tuple[int, int] = (0, 1)) -> set[int]:
    """Every worker of every host must shard the same model the same way (``hvd.shard``): checked at each
    state sync, before a forward pass, with one small allreduce over the round's workers.

    The job's layout is that of the workers that hold the newest commit exactly (rank 0's host: the trained
    state), however many newcomers build another model; only when no worker holds a commit (commit 0, the
    initial state, everywhere), or its holders hold it only because they loaded it from a checkpoint (DCP
    loads it into any FSDP-unit layout: ``commit``'s flag 2), is it the layout most workers have (rank 0's on
    a tie). A worker whose layout differs raises a one-line ``StateSyncError`` naming it, where FSDP2 would hang or fail in a collective, as
    a newcomer that cannot take the state does: ``elastic.run`` prints it and exits 1, its host leaves and is
    blacklisted, and the others roll back and go on without it.
    The same allreduce carries each worker's host and ``commit`` (its live ``commit_seq``, and whether it
    holds that commit exactly: 0, 1, or 2 when only by a checkpoint load): returned, the hosts (cross ranks)
    whose shards are not one commit (:func:`mixed_hosts`), the same set on every worker.
    """
    info = ctx.info
    if info is None or info.size <= 1 or not values:
        return set()
    digest = hashlib.blake2b(repr([_layout(v) for v in values]).encode(), digest_size=7).digest()
    seen = torch.zeros(info.size, 4, dtype=torch.int64)
    # 56 bits of digest: a positive int64.
    seen[info.rank] = torch.tensor([int.from_bytes(digest, "big"), info.cross_rank, commit[0], int(commit[1])])
    seen = on_device(seen)
    ctx.wait(ctx.group("the sharded layout check").allreduce([seen]), "the sharded layout check")
    rows = seen.tolist()
    layouts = [row[0] for row in rows]
    usual, whose = reference_layout(rows)
    if layouts[info.rank] != usual:
        raise StateSyncError(f"hvd.shard: this worker (rank {info.rank}) shards another model or layout than "
                             f"{whose} (rank {layouts.index(usual)}'s): parameter names, shapes and dtypes, the "
                             "FSDP2 units and the optimizer's parameters must be the same on every worker of every "
                             "host")
    return mixed_hosts([(host, seq, bool(holds)) for _, host, seq, holds in rows])


def reference_layout(rows: list[list[int]]) -> tuple[int, str]:
    """The job's layout among the rows ``[layout, host, live commit_seq, holds it exactly]`` of a round's workers
    (by rank; holds: 0 no, 1 yes, 2 only by a checkpoint load), and whose it is, in words: the layout of the workers
    that hold the newest commit (never commit 0, the initial state) by training, else the one most workers have;
    rank 0's on a tie."""
    newest = max((seq for _, _, seq, holds in rows if holds), default=0)
    holders = [row[0] for row in rows if newest > 0 and row[2] == newest and row[3] == 1]
    layouts = holders or [row[0] for row in rows]
    counts = {h: layouts.count(h) for h in layouts}
    usual = max(counts, key=lambda h: (counts[h], h == rows[0][0]))
    if holders:
        return usual, f"the {counts[usual]} worker(s) that hold the training state (commit {newest})"
    return usual, f"{counts[usual]} of the round's {len(rows)} workers"


def mixed_hosts(rows: Iterable[tuple[int, int, bool]]) -> set[int]:
    """The hosts whose workers do not all hold one same commit exactly, from each worker's
    ``(cross rank, live commit_seq, holds it exactly)``.

    A host's shards are one model only when they are one commit. A collective can
    complete on some workers and fail on others: a worker lost after its backward
    leaves a host-mate whose cross-host average completed (it updated and committed
    step k+1) beside one whose average failed (it rolled back to step k); in place,
    nothing of step k is left on the first. That host holds no commit of the job.
    """
    held: dict[int, set[int]] = {}
    for host, seq, holds in rows:
        held.setdefault(host, set()).add(seq if holds else -1)
    return {host for host, seqs in held.items() if len(seqs) > 1 or -1 in seqs}


def check_hosts(ctx: Any, values: list[Any]) -> None:
    """A sharded state sync's first check (:func:`check_layout`), and what follows from mixed hosts.

    A worker of a mixed host no longer holds a commit (``ledger.lost_commit``): its host
    then takes every shard from host 0, and the driver never makes it rank 0. When host 0
    itself is mixed (the driver made its newest worker rank 0, as for replicas, before
    anyone could tell), nothing of it may be sent: every worker raises ``CollectiveError``
    at once and rejoins, and the driver takes the state from a host that holds one commit,
    or the latest checkpoint, or ends the job with the state lost. Never a mix.
    """
    ledger = ctx.ledger
    seq = ledger.live_commit_seq
    loaded = ledger.holds_commit and getattr(ctx, "loaded_commit", None) == seq and seq > 0
    mixed = check_layout(ctx, values, (seq, 2 if loaded else int(ledger.holds_commit)))
    if ctx.info.cross_rank in mixed:
        ledger.lost_commit("its host's workers hold different commits (a worker was lost mid-step)")
    if 0 in mixed:
        ctx._abandon_round()
        raise CollectiveError(f"the workers of rank 0's host hold different commits of their shards (hosts "
                              f"{sorted(mixed)} of round {ctx.info.round}); none of them may give the state")


#: Words of the errors a collective raises when a peer is gone (lowercase).
_COMMUNICATION = ("gloo", "nccl", "connection", "peer", "socket", "timed out", "timeout", "c10d", "process group",
                  "processgroup", "broken pipe", "distbackend", "distnetwork")


def peer_lost(ctx: Any, exc: BaseException) -> bool:
    """Whether ``exc``, raised by torch inside the training function of a sharded worker, is a collective
    that failed because a peer was lost (a host-mate died in an FSDP2 all-gather or reduce-scatter); on an
    NCCL round's group, one started as the heartbeat thread aborted it (``rounds.on_device``).

    The driver aborts the round when it loses a member, usually just after the
    host-mate's socket closed: the abort is waited for up to two heartbeat
    timeouts, for an error that reads as communication's (Gloo's, NCCL's, a
    socket's, torch's ``DistError``). Any other error is the training function's
    own (a shape mismatch is a ``RuntimeError`` too), and is raised at once.
    """
    nccl = getattr(ctx, "_nccl_group", None)
    if getattr(ctx, "host_group", None) is None and (nccl is None or nccl() is None) or ctx.standalone or ctx.info is None:
        return False
    if not isinstance(exc, RuntimeError):
        return False
    text = f"{type(exc).__name__}: {exc}".lower()
    if not isinstance(exc, getattr(dist, "DistError", ())) and not any(word in text for word in _COMMUNICATION):
        return False
    round_ = ctx.info.round
    deadline = time.monotonic() + 2 * ctx.heartbeat_timeout_s
    while time.monotonic() < deadline:
        if ctx._aborted(round_):
            ctx._abandon_round()
            return True
        time.sleep(0.05)
    return False
