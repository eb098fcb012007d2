"""``DistributedOptimizer``'s gradient buckets: which gradients are allreduced together, and how.

Laid out as DDP lays them out (see :func:`make_buckets`). A packed bucket
copies its gradients into one flat buffer, reduces it and hands each
parameter its slice as its gradient; a solo bucket reduces one large
gradient in place. The first packed bucket carries one extra element, this
worker's "membership update pending" flag (0 or 1), whose sum tells every
worker the same thing at the same step. A sparse gradient is made dense
first, packed or solo (Horovod's ``sparse_as_dense``).

With a casting compression (``hvd.Compression.fp16``/``bf16``) a bucket
also owns a 16-bit *wire* buffer, allocated once: the gradients are cast
into it (scaled in the same pass), it is what the allreduce sends (half the
bytes of float32), and the result is cast back into the flat buffer (or the
solo gradient). The flag rides unscaled in the wire buffer: a sum of 0s and
1s is exact in float16 up to 2048 workers and in bfloat16 up to 256, and
only ``> 0`` is ever asked of it, which no rounding of a sum of non-negative
numbers can change. Another compressor's ``compress``/``decompress`` are
called on the bucket each step; the flag then does not ride (the commit
pays its own one-element allreduce). Without compression nothing of this
runs: a step is bitwise what it was.
"""

from __future__ import annotations

from typing import Any

import torch

from cloud_elastic.worker.comm.compression import NoneCompressor, cast_into, casts
from cloud_elastic.worker.comm.ops import Scaling

__all__ = ["Bucket", "make_buckets", "BUCKET_BYTES", "check_groups"]

BUCKET_BYTES = 25 * 1024 * 1024
#: The first bucket is small, as in DDP, so communication starts early in backward.
_FIRST_BUCKET_BYTES = 1024 * 1024
#: A gradient this large (or as large as a bucket) is allreduced alone, in place: copying it into a
#: bucket costs more than the collective saved (see ``make_buckets``).
_SOLO_BYTES = 8 * 1024 * 1024


class Bucket:
    """Parameters whose gradients are allreduced together.

    A packed bucket copies its gradients into ``flat`` and reduces that; a
    solo bucket holds one large parameter and reduces its ``.grad`` in place
    (``flat`` is None). ``wire`` is the 16-bit buffer a casting compression
    sends instead; ``codec`` another compressor (None: neither).
    """

    def __init__(self, params: list[torch.nn.Parameter], carries_flag: bool, solo: bool = False,
                 compression: Any = NoneCompressor) -> None:
        self.params = params
        self.offsets: list[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        self.carries_flag = carries_flag
        self.solo = solo
        self.flat: torch.Tensor | None = None
        #: Each packed parameter's slice of ``flat``, shaped like it: made once, handed out as its
        #: gradient every step (slicing anew each step is O(tensors) Python work).
        self.views: list[torch.Tensor] = []
        extra = 1 if carries_flag else 0
        if not solo:
            self.flat = torch.zeros(total + extra, dtype=params[0].dtype, device=params[0].device)
            self.views = [self.flat[off : off + p.numel()].view_as(p) for p, off in zip(params, self.offsets)]
        self.wire: torch.Tensor | None = None
        self.wire_views: list[torch.Tensor] = []
        self.codec: Any = None
        if casts(compression, params[0].dtype):
            self.wire = torch.empty(total + extra, dtype=compression.wire_dtype, device=params[0].device)
            self.wire_views = [self.wire[off : off + p.numel()].view_as(p) for p, off in zip(params, self.offsets)]
        elif compression is not NoneCompressor and getattr(compression, "wire_dtype", None) is None:
            self.codec = compression  # not a cast (a cast leaves tensors already 16-bit as they are)
        #: The tensor whose allreduce is in flight: ``flat``/``wire``, a solo gradient, or what ``codec`` made.
        self.reduced: torch.Tensor | None = None
        self._solo_grad: torch.Tensor | None = None
        self._codec_ctx: Any = None
        self.ready = 0
        self.work: Any = None
        self.launched = False
        #: Position in launch order (set by make_buckets).
        self.index = 0

    def clear(self) -> None:
        """Forget this step (its allreduce done, or abandoned after a failure)."""
        self.ready = 0
        self.work = None
        self.launched = False
        self.reduced = self._solo_grad = self._codec_ctx = None

    @property
    def compressed(self) -> bool:
        """Whether a 16-bit cast is what goes on the wire (an average then divides before the sum)."""
        return self.wire is not None

    def launch_tensor(self, update_flag: float, scaling: Scaling) -> torch.Tensor:
        """Gather this step's gradients, scaled by ``scaling.before``, into the tensor to allreduce; return it."""
        if self.solo:
            self.reduced = self._solo_launch(scaling)
        elif self.wire is not None:
            for p, wire_view in zip(self.params, self.wire_views):
                if p.grad is None:
                    wire_view.zero_()
                else:
                    cast_into(wire_view, _dense(p.grad), scaling.before)
            if self.carries_flag:
                self.wire[-1:].fill_(update_flag)  # see below
            self.reduced = self.wire
        else:
            assert self.flat is not None
            dsts, srcs = [], []
            for p, view in zip(self.params, self.views):
                grad = p.grad
                if grad is None:
                    view.zero_()
                elif grad.is_sparse:
                    dsts.append(view)
                    srcs.append(_dense(grad))
                elif grad.data_ptr() != view.data_ptr():  # not already accumulated in place
                    dsts.append(view)
                    srcs.append(grad)
            if dsts:
                # One call for the bucket: on a GPU a copy launched per gradient costs the host
                # more than the device (112 launches a step for the GPU benchmark's transformer).
                torch._foreach_copy_(dsts, srcs)
            scaling.apply_before(self.flat[: self.numel])
            if self.carries_flag:
                # fill_ takes the value as a kernel argument; ``flat[-1] = flag`` copies a host scalar
                # from pageable memory, which on a GPU waits for the stream: a stall in every backward.
                self.flat[-1:].fill_(update_flag)
            self.reduced = self._encoded(self.flat[: self.numel]) if self.codec is not None else self.flat
        return self.reduced

    def _solo_launch(self, scaling: Scaling) -> torch.Tensor:
        p = self.params[0]
        grad = p.grad
        if grad is None:  # no gradient this step: contribute zeros, as packed buckets do
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        elif grad.is_sparse or not grad.is_contiguous():
            p.grad = _dense(grad).contiguous()
        grad = self._solo_grad = p.grad
        if self.wire is not None:
            cast_into(self.wire.view_as(grad), grad, scaling.before)
            return self.wire
        scaling.apply_before(grad)
        return self._encoded(grad) if self.codec is not None else grad

    def _encoded(self, tensor: torch.Tensor) -> torch.Tensor:
        sent, self._codec_ctx = self.codec.compress(tensor)
        return sent.contiguous()

    def finish(self, scaling: Scaling) -> torch.Tensor | None:
        """After the allreduce: leave the reduced gradients as the parameters' ``.grad``; return the summed flag.

        ``scaling.divide_after``/``after`` are applied in the parameters' own
        precision, after any cast back; the flag (None if this bucket carries
        none) is taken before, unscaled, as a one-element tensor on the bucket's
        device. It is not read here: ``.item()`` on a GPU would stall the training
        thread until the allreduce is done, every step, before it could queue the
        optimizer's update; the commit reads it (``WorkerContext.updates_agreed``).
        """
        reduced = self.reduced
        assert reduced is not None
        flag = reduced[-1:].clone() if self.carries_flag else None  # the buffer is reused next step
        grads = self._solo_grad if self.solo else self.flat[: self.numel]  # type: ignore[index]
        assert grads is not None
        if self.wire is not None:
            grads.copy_(self.wire[: self.numel].view_as(grads))
        elif self.codec is not None:
            grads.copy_(self.codec.decompress(reduced, self._codec_ctx).view_as(grads))
        scaling.apply_after(grads)
        if self.solo:
            self.params[0].grad = grads  # reduced in place: already the parameter's gradient
        else:
            for p, view in zip(self.params, self.views):
                # The averaged gradient is handed over as a view of the bucket: no copy
                # back. zero_grad() drops it (or zeroes it in place, which then
                # accumulates straight into the bucket) before the next backward.
                if p.grad is not view:
                    p.grad = view
        self.reduced = self._solo_grad = self._codec_ctx = None
        return flag


def _dense(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` as a dense tensor: a sparse one (``nn.Embedding(sparse=True)``) is reduced dense, as Horovod's
    ``sparse_as_dense=True`` does (a sparse gradient has no storage to copy into a bucket from)."""
    return grad.to_dense() if grad.is_sparse else grad


def make_buckets(params: list[torch.nn.Parameter], bucket_bytes: int, compression: Any = NoneCompressor) -> list[Bucket]:
    """Reverse registration order (gradients of the last layers are ready first), laid out as DDP does.

    A bucket closes once it holds its cap (1 MiB for the first, so communication
    starts early in backward; ``bucket_bytes`` after), the gradient that crossed
    it included. A parameter of ``_SOLO_BYTES`` (8 MiB) or of a whole bucket gets a
    solo bucket: its gradient is reduced in place, not copied. Smaller ones are
    packed even when large, and a solo one does not close the packed bucket being
    filled: a transformer's 12 layers then cost 40 collectives a step, not 74 (each
    NCCL collective costs the host tens of microseconds, and a GPU step is often
    bound by its host). On Gloo, side by side against DDP: with 4 MiB weights
    packing them was faster (0.98x DDP's step, 1.02x with each reduced alone: a
    collective costs more than the copy); with 16 MiB weights reducing them alone
    was (0.71x and 0.88x against 1.05x packed into 25 MiB buckets: the copy costs more).
    The first packed bucket of a floating-point dtype carries the membership
    flag, unless the compression is neither none nor a cast (its output may
    not sum exactly); with none, the commit's membership check costs its own
    one-element allreduce instead.
    """
    buckets: list[Bucket] = []
    current: list[torch.nn.Parameter] = []
    size = 0
    packed = 0  # packed buckets closed so far
    flag_placed = compression is not NoneCompressor and getattr(compression, "wire_dtype", None) is None

    def close() -> None:
        nonlocal current, size, flag_placed, packed
        if current:
            carries = not flag_placed and current[0].is_floating_point()
            flag_placed = flag_placed or carries
            buckets.append(Bucket(current, carries_flag=carries, compression=compression))
            current, size, packed = [], 0, packed + 1

    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if nbytes >= min(bucket_bytes, _SOLO_BYTES):
            # The open packed bucket stays open: closing it here would cut a transformer's small
            # gradients (biases, norms) into a bucket per layer, doubling the step's collectives.
            buckets.append(Bucket([p], carries_flag=False, solo=True, compression=compression))
            continue
        if current and (p.dtype != current[0].dtype or p.device != current[0].device):
            close()
        current.append(p)
        size += nbytes
        if size >= (min(bucket_bytes, _FIRST_BUCKET_BYTES) if not packed else bucket_bytes):
            close()  # as DDP does: a bucket closes once it holds its cap (the gradient that crossed it included)
    close()
    for i, bucket in enumerate(buckets):
        bucket.index = i
    return buckets


def check_groups(num_groups: Any, groups: Any) -> None:
    """Refuse what Horovod's ``DistributedOptimizer`` refuses in ``num_groups`` and ``groups``, in one line.

    Both only say how Horovod fuses gradients into collectives (``groups``: how many fused groups, or which
    parameters go together); buckets here are by size, so a valid value changes nothing but is still checked,
    so that a script that Horovod would stop is stopped here too.
    """
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be a non-negative integer, got {num_groups!r}")
    if groups is None:
        return
    if isinstance(groups, list):
        seen: set[int] = set()
        for group in groups:
            for param in group if isinstance(group, (list, tuple)) else (group,):
                if not isinstance(param, torch.Tensor):
                    raise ValueError(f"groups must be lists of torch.Tensor, got a {type(param).__name__} in one")
                if id(param) in seen:
                    raise ValueError("a parameter can only appear once in groups")
                seen.add(id(param))
    elif isinstance(groups, bool) or not isinstance(groups, (int, float)) or not groups > 0:  # Horovod: groups > 0
        raise ValueError(f"groups must be a positive integer or a list of lists of torch.Tensor, got {groups!r}")
