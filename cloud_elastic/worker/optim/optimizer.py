"""``DistributedOptimizer``: gradient averaging that overlaps the backward pass.

Like DDP's reducer, small gradients are packed into buckets (about 25 MB,
the last layers first, since their gradients are ready first); a bucket's
asynchronous allreduce starts from a gradient hook as soon as all of its
gradients are accumulated, while backward continues on earlier layers.
A gradient of 8 MiB or more is not packed: it is allreduced in place, in
the tensor autograd produced (see ``buckets``).
Buckets are always launched in the same order on every worker (a ready
bucket waits for the ones before it), because Gloo matches collectives by
the order they are issued. ``step()`` waits for the buckets, writes the
averaged gradients back and runs the wrapped optimizer.

The first packed bucket carries one extra element: this worker's "membership update
pending" flag. Its sum tells every worker the same thing at the same step,
so ``commit()`` needs no collective of its own to agree on whether to
interrupt (see :meth:`WorkerContext.updates_agreed`). With
``compression=hvd.Compression.fp16`` (or ``bf16``) each bucket is sent as
16-bit floats, the flag included, exactly (see ``buckets``).

As in Horovod, the returned object is an instance of a subclass of the
wrapped optimizer's class, so LR schedulers and ``isinstance`` checks work.
It is a ``CommitParticipant`` (``worker.commit.participant``): a ``TorchState``
holding it binds to it the commits its ``step()`` copies.

Which parameters are averaged follows the optimizer: a parameter unfrozen
(``requires_grad`` set again) or added with ``add_param_group`` after wrapping
joins the buckets, one frozen leaves them (:meth:`_DistributedOptimizer._ce_rebuild`).
Every worker runs the same loop, so every worker lays out the same buckets at
the same step, and the replicas stay identical.

A parameter changed in place outside the optimizer between a commit and the
next update (a WGAN clip under ``torch.no_grad()``, prototypes normalised each
step, ``nn.Embedding(max_norm=...)``) is not the commit any more: once one is
seen, every commit copies the parameters when it is made (see
:meth:`_DistributedOptimizer._ce_check_outside`).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any, Callable, Iterable, Iterator

import torch

from cloud_elastic.worker import sharded

from cloud_elastic.worker.optim import closure as _closure, zerocopy
from cloud_elastic.worker.comm import followers
from cloud_elastic.worker.optim.buckets import BUCKET_BYTES, Bucket, check_groups, make_buckets
from cloud_elastic.worker.comm.compression import Compression, check_compression
from cloud_elastic.worker.commit.handlers import ModelHandler
from cloud_elastic.worker.commit.participant import BoundCommit
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.comm.ops import Average, Scaling, Sum, average_scaling, check_op
from cloud_elastic.worker.unsupported import UnsupportedError, check_process_set

__all__ = ["DistributedOptimizer"]

log = logging.getLogger(__name__)


#: id(parameter) -> the DistributedOptimizer whose hook averages its gradient: the newest one made over it.
_OWNERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _take_over(opt: Any, p: torch.nn.Parameter) -> None:
    """Hook ``p`` for ``opt``, and unhook the optimizer that averaged it before (a replaced
    ``DistributedOptimizer``, e.g. for a new learning-rate schedule): two would each count its
    gradients, and the old one, never stepped again, would hold its buckets for nothing."""
    previous = _OWNERS.get(id(p))
    if previous is not None and previous is not opt:
        ref, handle = previous._ce_handles.get(id(p), (None, None))
        if ref is not None and ref() is p:
            handle.remove()
            del previous._ce_handles[id(p)]
    opt._ce_handles[id(p)] = (weakref.ref(p), p.register_post_accumulate_grad_hook(opt._ce_hook))
    _OWNERS[id(p)] = opt


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixin whose methods are copied onto a subclass of the user's optimizer class.

    Implements ``CommitParticipant`` (``_ce_snapshots``, ``_ce_param_ids``, ``_ce_param_ptrs``).
    """

    def __init__(self, params: Any, named_parameters: Any, backward_passes_per_step: int, op: str, bucket_bytes: int,
                 compression: Any, predivide: float | None) -> None:
        super(self.__class__, self).__init__(params)  # the wrapped class's __init__, as Horovod does
        self._ce_passes = backward_passes_per_step
        self._ce_closures = False  # it stepped with a closure (``optim.closure``): no follow window
        self._ce_op = op
        self._ce_predivide = predivide
        #: How a bucket is scaled before and after its allreduce, by whether it is sent compressed (per round).
        self._ce_scalings: dict[bool, Scaling] = {}
        all_params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        #: Over an FSDP2-sharded model (``hvd.shard``): local gradient shards averaged across hosts in step().
        self._ce_sharded = sharded.is_sharded(self)
        if self._ce_sharded:
            if getattr(get_context(), "host_group", None) is None:
                raise ValueError("a DistributedOptimizer over DTensor parameters needs the model sharded with "
                                 "hvd.shard(model) first")
            if backward_passes_per_step != 1 or compression is not Compression.none or op != Average:
                raise ValueError("over a sharded model, DistributedOptimizer averages uncompressed gradients once "
                                 "per step (backward_passes_per_step=1, no compression, op=hvd.Average)")
        if named_parameters is not None:
            named = list(named_parameters)
            names = {id(p): n for n, p in named}
            missing = [p for p in all_params if id(p) not in names]
            if missing:
                raise ValueError("named_parameters does not cover every parameter of the optimizer")
        self._ce_bucket_bytes = bucket_bytes
        self._ce_compression = compression
        self._ce_buckets: list[Bucket] = []
        self._ce_where: dict[int, tuple[Bucket, int]] = {}
        self._ce_counts: dict[int, int] = {}
        self._ce_next = 0
        self._ce_round = -1
        self._ce_synchronized = False
        self._ce_skip = False
        #: The commits of each TorchState holding this optimizer that its step copies or touches.
        self._ce_snapshots: list[BoundCommit] = []
        #: A parameter was seen changed in place outside this optimizer between a commit and its update:
        #: commits copy the parameters when they are made, not at the next update (see _ce_check_outside).
        self._ce_outside = False
        #: The parameters' version counters when a kept commit deferred their copies (``_ce_param_ptrs``).
        self._ce_versions: list[int] | None = None
        #: Read once (WorkerSettings), not from the environment at every step.
        self._ce_zero_copy = get_context().settings.zero_copy_commit
        #: id(parameter) -> (a weak reference to it, the handle of this optimizer's hook on it).
        self._ce_handles: dict[int, tuple[Any, Any]] = {}
        self._ce_rebuild(all_params)

    def _ce_rebuild(self, params: list[torch.nn.Parameter]) -> None:
        """Average the gradients of ``params`` (those that train, in the groups' order) from the next step on.

        Nothing may be in flight. Newly trained parameters are hooked; a frozen one keeps
        its hook, which ignores it while it is outside every bucket.
        """
        self._ce_params = params
        #: The trained parameters' ids in order: a change tells the layout to follow (``_ce_trainable``).
        self._ce_order = [id(p) for p in params]
        #: ``id()`` of each parameter this optimizer updates (a commit kept in place leaves them out).
        self._ce_param_ids = frozenset(self._ce_order)
        #: (param_groups signature, per-bucket (group, parameter) pairs, unbucketed pairs): rebuilt only
        #: when the groups or the buckets change, so a step's bookkeeping does not rescan every tensor.
        self._ce_pairs_cache: tuple[Any, list[list[tuple[dict, torch.Tensor]]], list[tuple[dict, torch.Tensor]]] | None = None
        self._ce_versions = None
        if self._ce_sharded:
            return
        self._ce_buckets = make_buckets(params, self._ce_bucket_bytes, self._ce_compression) if params else []
        self._ce_where = {id(p): (bucket, i) for bucket in self._ce_buckets for i, p in enumerate(bucket.params)}
        for p in params:
            ref, _ = self._ce_handles.get(id(p), (None, None))
            if ref is None or ref() is not p or _OWNERS.get(id(p)) is not self:
                _take_over(self, p)

    def _ce_trainable(self) -> list[torch.nn.Parameter] | None:
        """The parameters that train now, if they are not the ones averaged so far (else None).

        Asked once per step: a scan of ``requires_grad`` costs far less than the step.
        """
        if [id(p) for group in self.param_groups for p in group["params"] if p.requires_grad] == self._ce_order:
            return None
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def _ce_follow_trainable(self) -> None:
        """Between steps (nothing in flight): bucket the parameters that train now."""
        if not self._ce_sharded and not self._ce_counts and not self._ce_next:
            params = self._ce_trainable()
            if params is not None:
                self._ce_rebuild(params)

    def _ce_reduce_new(self, params: list[torch.nn.Parameter]) -> None:
        """Allreduce, in one more collective, the gradients of the trained ``params`` outside every bucket.

        For the step in which they started to train after its backward had begun (no
        ``zero_grad()`` since): every worker changed the same parameters at the same
        step, so every worker sends the same layout. A parameter without a gradient
        sends zeros, as in a bucket. The layout follows them from the next step on.
        """
        new = [p for p in params if id(p) not in self._ce_where]
        by_kind: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in new:
            by_kind.setdefault((p.dtype, p.device), []).append(p)
        ctx = get_context()
        scaling = self._ce_scalings[False]
        for group in by_kind.values():
            grads = [torch.zeros_like(p) if p.grad is None else p.grad.to_dense() for p in group]
            flat = torch.cat([g.reshape(-1) for g in grads])
            scaling.apply_before(flat)
            if followers.is_follower(ctx):
                flat.zero_()
            ctx.ledger.window.collective("a gradient allreduce")
            ctx.wait(ctx.pg.allreduce([flat]), "gradient allreduce", host=False)
            scaling.apply_after(flat)
            offset = 0
            for p in group:
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        self._ce_rebuild(params)

    # ----------------------------------------------------------------- hooks
    def _ce_reset_if_new_round(self) -> None:
        ctx = get_context()
        info, size = ctx.info, followers.averaging_size(ctx)  # a follower's zeros do not count (``commit.follow``)
        if info.round != self._ce_round or size != getattr(self, "_ce_averaged_over", None):
            if info.round != self._ce_round:
                self._ce_clear()
            self._ce_round, self._ce_averaged_over = info.round, size
            self._ce_scalings = {compressed: average_scaling(self._ce_op, size, compressed, self._ce_predivide)
                                 for compressed in (False, True)}

    def _ce_clear(self) -> None:
        for bucket in self._ce_buckets:
            bucket.clear()
        self._ce_counts.clear()
        self._ce_next = 0
        self._ce_synchronized = False

    def _ce_hook(self, p: torch.nn.Parameter) -> None:
        self._ce_reset_if_new_round()
        if self._ce_synchronized:  # a backward after synchronize() and no step() (a NaN loss, an AMP overflow):
            self._ce_clear()  # as Horovod's synchronize() resets its counters, it starts the next step's buckets
        where = self._ce_where.get(id(p))
        if where is None:
            return  # frozen when the buckets were laid out: averaged by synchronize (_ce_reduce_new)
        count = self._ce_counts.get(id(p), 0) + 1
        self._ce_counts[id(p)] = count
        if count > self._ce_passes:
            # Its allreduce has started: this gradient would be silently left out of it (Horovod raises too).
            raise AssertionError(
                f"a gradient was computed more than backward_passes_per_step={self._ce_passes} times before step(): "
                "pass backward_passes_per_step to DistributedOptimizer to accumulate them, or call this "
                "optimizer's zero_grad() to drop the ones a later loss produced")
        if count != self._ce_passes:
            return
        bucket, _ = where
        bucket.ready += 1
        if bucket.ready == len(bucket.params):  # only a bucket filling up can let the next one launch
            self._ce_launch_ready()

    def _ce_launch_ready(self, force: bool = False) -> None:
        ctx = get_context()
        while self._ce_next < len(self._ce_buckets):
            bucket = self._ce_buckets[self._ce_next]
            if not force and bucket.ready < len(bucket.params):
                return
            if self._ce_next == 0:
                ctx.ledger.window.collective("a gradient allreduce")  # of a step after an update not yet committed?
            flag = 1.0 if bucket.carries_flag and ctx.update_pending() else 0.0
            sent = bucket.launch_tensor(flag, self._ce_scalings[bucket.compressed])
            if followers.is_follower(ctx):  # it contributes nothing but its membership flag (``commit.follow``)
                sent.zero_()
                if bucket.carries_flag:
                    sent[-1:].fill_(flag)
            bucket.work = ctx.pg.allreduce([sent])
            bucket.launched = True
            self._ce_next += 1

    # ------------------------------------------------------------ public API
    def synchronize(self) -> None:
        """Wait for every bucket and write the averaged gradients back into ``.grad``.

        Afterwards, as in Horovod, the next backward starts the next step's allreduces (a step skipped for
        a NaN loss or an AMP overflow, then ``model.zero_grad()``); a ``step()`` before any steps on these."""
        self._ce_reset_if_new_round()
        if self._ce_synchronized:
            return
        if self._ce_sharded:
            trainable = self._ce_trainable()
            if trainable is not None:  # a parameter unfrozen, or a group added: averaged from this step on
                self._ce_rebuild(trainable)
            sharded.average_gradient_shards(get_context(), self._ce_params)
            sharded.agree_before_update(get_context())
            self._ce_synchronized = True
            return
        self._ce_check_outside()
        self._ce_launch_ready(force=True)  # buckets whose params got no gradient this step
        # Deferred commit copies overlap the allreduces in flight; those a zero-copy update will fill stay queued.
        keep = zerocopy.tradeable_ptrs(self) if self._ce_zero_copy_step() is not None else frozenset()
        for snapshot in self._ce_snapshots:
            snapshot.flush(keep)
        self._ce_wait_buckets()
        trainable = self._ce_trainable()
        if trainable is not None:
            self._ce_reduce_new(trainable)

    def _ce_wait_buckets(self, after_bucket: Callable[[Bucket], None] | None = None) -> None:
        """Wait for the buckets in order, hand out their averaged gradients, then call ``after_bucket``."""
        ctx = get_context()
        for bucket in self._ce_buckets:
            ctx.wait(bucket.work, "gradient allreduce", host=False)
            flag = bucket.finish(self._ce_scalings[bucket.compressed])
            if flag is not None:
                ctx.carry_update_flag(flag)
            if after_bucket is not None:
                after_bucket(bucket)
        self._ce_synchronized = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients since the last ``step()``, and the allreduces they started.

        A gradient can reach this optimizer's parameters after its ``step()``: in a GAN
        loop the generator's loss flows back through the discriminator, and its backward
        fills the discriminator's gradients (and launches their allreduces) after the
        discriminator's update. The loop's next ``zero_grad()`` means to drop them; the
        allreduces already launched are waited for (every worker launched the same ones)
        and dropped with them, so the next ``step()`` averages only what came after.
        """
        self._ce_reset_if_new_round()
        if self._ce_counts or self._ce_next:
            ctx = get_context()
            for bucket in self._ce_buckets[: self._ce_next]:
                ctx.wait(bucket.work, "gradient allreduce", host=False)
            self._ce_clear()
        super(self.__class__, self).zero_grad(set_to_none=set_to_none)
        self._ce_follow_trainable()  # unfrozen or added since the last step: bucketed before this backward

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Horovod's: from the next step on, allreduce each gradient once it was computed ``passes`` times.

        Between steps only (after ``step()``, ``zero_grad()`` or ``synchronize()``): a gradient of the step under
        way was counted against the old number, and its bucket may have been sent already."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {passes!r}")
        if self._ce_sharded and passes != 1:
            raise ValueError("over a sharded model, DistributedOptimizer averages gradients once per step "
                             "(backward_passes_per_step=1)")
        self._ce_reset_if_new_round()
        if self._ce_counts and not self._ce_synchronized:
            raise ValueError(f"set_backward_passes_per_step({passes}) in the middle of a step: its gradients were "
                             f"counted for backward_passes_per_step={self._ce_passes}; call it after step() or "
                             "zero_grad()")
        self._ce_passes = passes

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Run ``step()`` without synchronizing (after an explicit ``synchronize()``)."""
        self._ce_skip = True
        try:
            yield
        finally:
            self._ce_skip = False

    def _ce_param_ptrs(self) -> frozenset[int]:
        """Where this optimizer's parameters live now (zero-copy commits alternate two storages).

        Asked by a kept commit of a model, to defer the copies of these parameters to the next
        update: none once they are known to change outside it (they are then copied at the
        commit). Their version counters are taken here, so the next step sees such a change.
        """
        if self._ce_outside:
            return frozenset()
        # The parameters with their counters: a rebuild (a parameter unfrozen) changes _ce_params, not them.
        self._ce_versioned = list(self._ce_params)
        self._ce_versions = [p._version for p in self._ce_versioned]
        return frozenset(p.data_ptr() for p in self._ce_params)

    def _ce_check_outside(self) -> None:
        """Before this step's update (and its deferred copies): was a parameter changed in place since the commit?

        A clip under ``torch.no_grad()``, a normalisation, an ``Embedding(max_norm=...)``
        forward: the live parameters then no longer are a commit kept in place, nor what a
        kept commit deferred copying. Every worker runs the same loop and sees it at the same
        step. From then on every commit copies the parameters when it is made (kept, not in
        place; not deferred), so a failure anywhere restores it exactly. The commit before
        this step is restorable only if it was kept whole aside (the loop's first window).
        """
        if self._ce_outside:
            return
        window = get_context().ledger.window
        seen = ""
        for snapshot in self._ce_snapshots:
            if (isinstance(snapshot, ModelHandler) and snapshot.in_place and not snapshot._touched
                    and snapshot._changed_since_commit()):
                seen = ("a failure before this update restores it from the copy kept in its first window"
                        if not window.confirmed else
                        "a failure before this update cannot restore the last commit exactly on this worker")
                for opt in snapshot.optimizers:
                    opt._ce_outside = True
        if (not seen and self._ce_versions is not None and any(s.pending for s in self._ce_snapshots)
                and [p._version for p in self._ce_versioned] != self._ce_versions):
            seen = "the last commit holds the changed values"
        if not seen:
            return
        self._ce_outside = True
        window.learn(has_collectives=True)  # kept commits, as for a collective in the window
        log.warning("cloud-elastic: a parameter was changed in place outside the optimizer since the last commit "
                    "(e.g. a clip or normalisation under torch.no_grad(), or nn.Embedding(max_norm=...)); from now on "
                    "every commit copies the parameters when it is made, so a failure restores the commit exactly "
                    "(%s)", seen)

    def _ce_swap_update(self) -> zerocopy.Update | None:
        _, unbucketed = self._ce_pairs()
        return zerocopy.swap_update_for(self, self._ce_zero_copy, (p for _, p in unbucketed))

    def _ce_zero_copy_step(self) -> zerocopy.Update | None:
        """The out-of-place update, for the update right after a kept commit only (None otherwise).

        Only that update has commit copies to trade away. The others find nothing
        pending and run torch's own step, in place, after every gradient is in: the
        out-of-place path costs milliseconds more CPU per step on a model of a few
        hundred tensors, for no copy saved (docs/benchmarks.md, "Commit cost per optimizer").
        A commit kept in host memory (GPU tensors) has no buffer on the device to trade.
        """
        if not any(snapshot.pending for snapshot in self._ce_snapshots):
            return None
        if any(snapshot.on_host for snapshot in self._ce_snapshots):
            return None
        return self._ce_swap_update()

    def _ce_pairs(self) -> tuple[list[list[tuple[dict, torch.Tensor]]], list[tuple[dict, torch.Tensor]]]:
        """Per bucket, its (group, parameter) pairs; and the pairs of parameters outside every bucket."""
        signature = tuple((id(g), id(g["params"]), len(g["params"])) for g in self.param_groups)
        cache = self._ce_pairs_cache
        if cache is None or cache[0] != signature:
            group_of = {id(p): group for group in self.param_groups for p in group["params"]}
            bucketed = [[(group_of[id(p)], p) for p in bucket.params] for bucket in self._ce_buckets]
            unbucketed = [(g, p) for g in self.param_groups for p in g["params"] if id(p) not in self._ce_where]
            cache = self._ce_pairs_cache = (signature, bucketed, unbucketed)
        return cache[1], cache[2]

    def step(self, closure: Any = None) -> Any:
        # This class's step() is already wrapped by torch's step-hook machinery; call the
        # wrapped class's step() unwrapped, or every step pre/post hook would run twice.
        base_step = type(self).__mro__[1].step
        if getattr(base_step, "hooked", False):
            base_step = base_step.__wrapped__
        self._ce_reset_if_new_round()
        # With a closure each of its calls is averaged (``optim.closure``); none launched before: nothing to wait for.
        fresh = closure is not None and _closure.idle(self)
        closure = _closure.averaged(self, closure) if closure is not None else None
        followers.land(get_context())  # a follow window's piece moved while this step computed; it lands first
        # The step is counted once it returns, by torch's step post-hook that hvd.init registers for every
        # optimizer (context.init): one whose allreduce fails was not trained (docs/events.md, steps_lost).
        window = get_context().ledger.window
        if window.open:
            # Another update ran since the last commit (a second optimizer after one backward, as
            # in a GAN loop): this step's gradient allreduces, launched before it, are waited for
            # inside its window, where a failure can no longer be undone in place.
            window.collective("a gradient allreduce waited for after another optimizer's update")
        in_place = [s for s in self._ce_snapshots if s.in_place]
        if in_place or self._ce_sharded:  # over shards no copy is deferred to the step, in place or kept alike
            return self._ce_step_in_place(base_step, in_place, closure, fresh)
        if not fresh:
            self._ce_launch_ready(force=True)  # this step's own allreduces are not in the window the update opens
        window.update(kept=True)
        update = self._ce_zero_copy_step() if closure is None else None
        if update is not None and not self._ce_skip and not self._ce_synchronized and self._ce_trainable() is None:
            self._ce_check_outside()
            self._ce_step_overlapped(update)
            self._ce_clear()
            return None
        if fresh:
            self._ce_check_outside()
        elif not (self._ce_skip and self._ce_synchronized):  # a backward since synchronize(): average it
            self.synchronize()
        taken: dict[int, Any] = {}
        if update is not None:
            ptrs = zerocopy.tradeable_ptrs(self)
            for snapshot in self._ce_snapshots:
                taken.update(snapshot.take(ptrs))
        for snapshot in self._ce_snapshots:
            snapshot.flush()
        with followers.received_only(get_context(), self):  # a follower updates only what it received
            if taken:
                assert update is not None
                update(self, taken)
                result = None
            else:
                result = base_step(self, closure)
        self._ce_clear()
        return result

    def _ce_step_in_place(self, base_step: Callable[..., Any], in_place: list[BoundCommit], closure: Any,
                          fresh: bool = False) -> Any:
        """The transactional step (the last commit kept nothing of what the update writes; see ``CommitWindow``).

        Every gradient is in before anything changes, so a failure in this
        step's allreduces leaves the live state at the commit, which then needs
        no copy; the update is the wrapped optimizer's own, in place, as under DDP.
        Over shards (``hvd.shard``) every step runs here: a kept commit of shards
        was copied whole at the commit (``in_place`` is then empty).
        """
        if fresh:  # a closure's first backward is still to come (``optim.closure``): nothing to average yet
            if not self._ce_sharded:
                self._ce_check_outside()
        elif not (self._ce_skip and self._ce_synchronized):  # a backward since synchronize(): average it
            self.synchronize()
        if in_place:  # NCCL: the GPU has the whole average before the update writes over the commit (rounds.on_device)
            get_context().confirm_on_device("the step's gradient allreduce")
        for snapshot in self._ce_snapshots:
            snapshot.flush()  # a commit of another TorchState kept as a snapshot
        get_context().ledger.window.update(kept=not in_place)
        for snapshot in in_place:
            snapshot.touch()
        try:
            with followers.received_only(get_context(), self):  # a follower updates only what it received
                return base_step(self, closure)
        finally:
            self._ce_clear()

    def _ce_step_overlapped(self, update: zerocopy.Update) -> None:
        """Synchronize and step at once: each bucket's parameters are updated as soon as its allreduce completes.

        The update of early buckets then overlaps the allreduces still in
        flight. Every parameter of a bucket is given a gradient (zeros if it
        had none), so the storages the update writes are known before the
        first wait; the commit copies of everything else are done first.
        """
        self._ce_launch_ready(force=True)
        ptrs = zerocopy.tradeable_ptrs(self, self._ce_params)
        for snapshot in self._ce_snapshots:
            snapshot.flush(ptrs)
        taken: dict[int, Any] = {}
        for snapshot in self._ce_snapshots:
            taken.update(snapshot.take(ptrs))
        bucketed, unbucketed = self._ce_pairs()
        ctx = get_context()
        if followers.is_follower(ctx):  # it updates only what it received (``commit.follow``)
            bucketed = [[(g, p) for g, p in pairs if not followers.pending(ctx, p)] for pairs in bucketed]
            unbucketed = [(g, p) for g, p in unbucketed if not followers.pending(ctx, p)]
        try:
            self._ce_wait_buckets(lambda bucket: update(self, taken, bucketed[bucket.index]))
            # Parameters outside every bucket (no requires_grad when wrapped) but given a
            # .grad anyway: torch's step updates them, so this does too (their commit copies are done).
            update(self, taken, unbucketed)
        finally:
            # After a failed wait, the parameters not yet updated still hold the committed
            # values: their snapshots get them now, so a restore is exact.
            zerocopy.settle(taken)


def DistributedOptimizer(  # noqa: N802 (Horovod's name)
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: str = Average,
    gradient_predivide_factor: float | None = None,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
    *,
    bucket_cap_mb: float = BUCKET_BYTES / (1024 * 1024),
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so ``step()`` applies gradients averaged (``op=hvd.Sum``: summed) over all workers.

    ``compression``: ``hvd.Compression.fp16``/``bf16`` send float32/float64
    gradients as 16-bit floats (half the bytes); an average then divides by
    the world size before the sum, as DDP's fp16 compression hook does, so
    the sum cannot overflow. Any class with Horovod's ``compress``/``decompress``
    is accepted. ``gradient_predivide_factor`` ``f`` (Average only) divides
    gradients by ``f`` before the sum and by ``size / f`` after, as in Horovod.
    ``op=hvd.Adasum``, and a ``process_set`` but the whole job (None, ``hvd.global_process_set``), raise
    UnsupportedError. The parameters are Horovod's, in its order; ``bucket_cap_mb`` (keyword only) is ours.
    ``num_groups`` and ``groups`` are checked as Horovod checks them and change nothing: they only say how
    Horovod fuses gradients into collectives, and here fusion is by size (``bucket_cap_mb``), with the same
    results. ``sparse_as_dense`` may be either: sparse gradients are always reduced dense, as with True.
    Call it after ``init()``; bad arguments raise a one-line ValueError or TypeError.
    """
    check_process_set(process_set, "DistributedOptimizer")
    check_groups(num_groups, groups)
    if isinstance(optimizer, torch.optim.SparseAdam):
        # Gradients are reduced dense (Horovod's sparse_as_dense=True), which every other optimizer takes; handing
        # a sparse one back dense-or-sparse by rank or by step split the replicas' optimizer states (5b465d3).
        raise UnsupportedError("DistributedOptimizer reduces sparse gradients dense (as Horovod's sparse_as_dense=True) "
                               "and torch.optim.SparseAdam takes sparse gradients only: use torch.optim.Adam or AdamW")
    op = check_op(op, allowed=(Average, Sum))
    compression = check_compression(compression)
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if gradient_predivide_factor is not None:
        if op != Average and gradient_predivide_factor != 1.0:
            raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor} applies only to op=hvd.Average "
                             "(only 1.0, Horovod's default, goes with other ops)")
        if op != Average:
            gradient_predivide_factor = None  # Horovod's default, passed explicitly: no split to apply to a sum
        elif not gradient_predivide_factor > 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, backward_passes_per_step, op, int(bucket_cap_mb * 1024 * 1024),
                  compression, None if gradient_predivide_factor is None else float(gradient_predivide_factor))
    # Re-running __init__ on the groups creates state from the class's defaults (Adagrad's
    # initial_accumulator_value), and would drop state the user loaded before wrapping: keep theirs.
    wrapped.state.update(optimizer.state)
    # From here on only the wrapper's state changes: a TorchState refuses ``optimizer`` (``commit.handlers``).
    optimizer._ce_wrapped_by = weakref.ref(wrapped)
    # Its defaults are the class's too (SGD's momentum 0), not the ones the user built the optimizer with: a
    # group added later with add_param_group takes its missing hyperparameters from these.
    wrapped.defaults = dict(optimizer.defaults)
    return wrapped
