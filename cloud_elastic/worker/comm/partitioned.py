"""Collectives that give each worker a different part: ``reducescatter`` and ``alltoall`` (Horovod's names).

Both split along dimension 0 and run on torch's ``alltoall_base``, started
through :meth:`WorkerContext.group` and waited for through
:meth:`WorkerContext.wait` like every other collective, so a lost peer
aborts them. ``reducescatter`` is not torch's ``reduce_scatter``: Gloo's has
no future (``Work::getFuture not implemented`` in the torch this project
pins), so it could not be waited for in slices and abandoned when the driver
aborts the round. Instead each worker sends every peer that peer's rows
(one alltoall: the same bytes per worker as a ring reduce-scatter) and
reduces what it receives itself. Neither is an autograd function.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from cloud_elastic.worker.comm import followers, shapes
from cloud_elastic.worker.comm.collectives import on_device, check_reducible
from cloud_elastic.worker.comm.compression import Compression, casts, check_compression, encode
from cloud_elastic.worker.comm.dtypes import carrier, from_wire, to_wire
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.comm.ops import Average, Max, Min, Product, Sum, average_scaling, check_op

__all__ = ["reducescatter", "alltoall"]


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = Compression.none,
                  op: str = Average, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` over all workers and return this worker's rows of the result.

    Rows are split as Horovod splits them: each rank gets ``dim0 // size``,
    and the first ``dim0 % size`` ranks one more. ``tensor`` must have the
    same dtype and shape on every worker, else ValueError on every worker
    (told in one small allgather before the rows travel); it is left
    unchanged. ``op``, ``compression`` and the scale factors mean what they
    mean for :func:`allreduce`.
    """
    op, compression = _checked_args(tensor, op, compression)
    what = f"reducescatter {name or ''}".strip()
    if get_context().info.size > 1:
        # Each worker sizes what it receives from its own shape and the rows move as bits: another dtype of the same
        # width was misread silently (int16 as float16), another shape of the same bytes summed crosswise, other
        # bytes aborted the process in Gloo (EnforceNotMet). Nothing else is exchanged before the rows, so this
        # costs one allgather of a row of int64 per worker.
        rows = [r[0].tolist() for r in shapes.gather_rows_of([shapes.shape_row(tensor)], f"{what} shapes")]
        shapes.check_gathered(rows, "reducescatter", any_first=False)
    return _scatter(tensor, what, compression, op, prescale_factor, postscale_factor)


def reducescatter_each(tensors: Sequence[torch.Tensor], name: str | None = None, compression: Any = Compression.none,
                       op: str = Average, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """:func:`reducescatter` of each of ``tensors``, in order: ``grouped_reducescatter``.

    All the tensors' dtypes and shapes are checked in one allgather (not one
    each: that doubled the round trips of a group of small tensors), so a
    mismatch in any of them, or another number of tensors, is a ValueError
    on every worker that names the first tensor that differs, before any
    rows travel.
    """
    checked = [_checked_args(t, op, compression) for t in tensors]
    shapes.check_same_tensors(tensors, [None] * len(tensors), "grouped_reducescatter", hint="in the same order")
    what = f"reducescatter {name or ''}".strip()
    return [_scatter(t, what, c, o, prescale_factor, postscale_factor) for t, (o, c) in zip(tensors, checked)]


def _checked_args(tensor: torch.Tensor, op: str, compression: Any) -> tuple[str, Any]:
    """``op`` and ``compression`` checked, or the one-line error this worker raises before any collective."""
    op = check_op(op)
    compression = check_compression(compression)
    check_reducible(op, tensor, "reducescatter")
    if tensor.dim() == 0:
        raise ValueError("hvd.reducescatter: expected a tensor of at least one dimension (it splits dimension 0)")
    return op, compression


def _scatter(tensor: torch.Tensor, what: str, compression: Any, op: str, prescale_factor: float,
             postscale_factor: float) -> torch.Tensor:
    """The reduce-scatter itself, once every worker's dtype and shape is known to match."""
    ctx = get_context()
    size, rank = ctx.info.size, ctx.info.rank
    # A follower's rows count for nothing, as in an allreduce (``commit.follow``): it sends the op's identity, and
    # an average divides by the round's active members (review h6: its rows were summed and counted).
    scaling = average_scaling(op, followers.averaging_size(ctx), casts(compression, tensor.dtype),
                              prescale=prescale_factor, postscale=postscale_factor)
    sent = encode(tensor, compression, scaling.before, ctx.device)
    rows = sent.tensor
    if followers.is_follower(ctx):
        rows = rows.clone()  # encode may hand back the caller's own tensor
        followers.identity_fill(rows, op)
    moved = to_wire(rows, carrier(rows.dtype, "reducescatter", reduces=False))  # rows move as bits
    # Horovod's split: dim0 // size rows each, the first dim0 % size ranks one more (as tensor_split does).
    counts = [len(chunk) for chunk in torch.tensor_split(torch.empty(sent.tensor.shape[0], device="meta"), size)]
    received = torch.empty((size * counts[rank],) + tuple(sent.tensor.shape[1:]), dtype=moved.dtype,
                           device=sent.tensor.device)
    ctx.wait(ctx.group(what).alltoall_base(received, moved, [counts[rank]] * size, counts), what)
    # Reduced in the dtype an allreduce carries it as (torch cannot sum or compare uint16 or uint32), cast back:
    # exact, as ``dtypes`` says. Complex numbers come here only to be summed (check_reducible).
    wide = to_wire(from_wire(received, sent.tensor.dtype),
                   carrier(sent.tensor.dtype, "reducescatter", reduces=True, complex_native=True))
    mine = from_wire(_REDUCE[op](wide.view((size, counts[rank]) + tuple(sent.tensor.shape[1:]))), sent.tensor.dtype)
    result = sent.decode(mine)
    scaling.apply_after(result)
    return result.to(tensor.device)


#: How a worker reduces the (size, rows, ...) stack of its rows from every peer, per op (Average: sum, then divide).
_REDUCE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    Average: lambda t: t.sum(0, dtype=t.dtype), Sum: lambda t: t.sum(0, dtype=t.dtype), Min: lambda t: t.amin(0),
    Max: lambda t: t.amax(0), Product: lambda t: t.prod(0, dtype=t.dtype),
}


def alltoall(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None,
             name: str | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Send ``splits[i]`` rows of ``tensor`` (dimension 0, in order) to worker ``i``; return what arrived.

    Without ``splits`` the rows are split equally (their number must be a
    multiple of the world size) and only the gathered tensor is returned;
    with ``splits`` (one count per worker, summing to at most the rows),
    ``(tensor, received_splits)`` as in Horovod, ``received_splits`` an int32
    tensor. Rows may differ in number between workers; the other dimensions
    and the dtype must match, else ValueError on every worker (told in the
    exchange of the counts, as for ``allgather``).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"hvd.alltoall: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() == 0:
        raise ValueError("hvd.alltoall: expected a tensor of at least one dimension (it splits dimension 0)")
    wire = carrier(tensor.dtype, "alltoall", reduces=False)
    ctx = get_context()
    size = ctx.info.size
    rows = tensor.shape[0]
    send = _send_counts(splits, rows, size)
    what = f"alltoall {name or ''}".strip()
    # Each worker learns how many rows every peer sends it (its rows and splits are its own), and each peer's
    # dtype and shape: rows of another dtype of the same width would arrive as bits and be misread silently.
    row = shapes.shape_row(tensor)
    counts = torch.tensor([[n] + row for n in send], dtype=torch.int64, device=ctx.device)
    received = torch.empty_like(counts)
    ctx.wait(ctx.group(what).alltoall_base(received, counts, [], []), what)
    shapes.check_gathered([r[1:] for r in received.tolist()], "alltoall")
    recv = [int(n) for n in received[:, 0].tolist()]
    local = to_wire(on_device(tensor.detach()[: sum(send)]), wire)
    out = torch.empty((sum(recv),) + tuple(local.shape[1:]), dtype=local.dtype, device=local.device)
    ctx.wait(ctx.group(what).alltoall_base(out, local, recv, send), what)
    out = from_wire(out, tensor.dtype).to(tensor.device)
    if splits is None:
        return out
    return out, torch.tensor(recv, dtype=torch.int32)


def _send_counts(splits: Sequence[int] | torch.Tensor | None, rows: int, size: int) -> list[int]:
    if splits is None:
        if rows % size:
            raise ValueError(f"hvd.alltoall: {rows} rows do not split equally over {size} workers; pass splits=")
        return [rows // size] * size
    counts = [int(n) for n in (splits.reshape(-1).tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(counts) != size or any(n < 0 for n in counts) or sum(counts) > rows:
        raise ValueError(f"hvd.alltoall: splits must be {size} non-negative row counts summing to at most {rows}; "
                         f"got {counts}")
    return counts
