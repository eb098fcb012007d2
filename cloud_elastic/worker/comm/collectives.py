"""Collectives with Horovod's names, on the current round's process group.

Every call starts its collective through :meth:`WorkerContext.group` and
waits through :meth:`WorkerContext.wait`, so a collective of a round the
driver aborted fails at once, and a failed or abandoned one raises
:class:`CollectiveError` instead of hanging. Tensors may live on CPU or GPU;
with NCCL, CPU tensors are staged through the worker's device and results
come back on the caller's device; a dtype Gloo or NCCL lacks (int16) travels as
one they carry (``dtypes``). Unlike Horovod's, these are not autograd
functions: results carry no gradient. Reductions that split a tensor over
the workers (``reducescatter``, ``alltoall``) are in ``partitioned``.
"""

from __future__ import annotations

import ctypes
import io
import pickle
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import torch
import torch.distributed as dist

from cloud_elastic.worker.comm import shapes, statecodec
from cloud_elastic.worker.comm.skeleton import _join_tensors, _split_tensors, allocate, state_limit
from cloud_elastic.worker.comm.compression import Compression, casts, check_compression, encode
from cloud_elastic.worker.comm.dtypes import carrier, from_wire, to_wire
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.comm.ops import Adasum, Average, Max, Min, Product, Sum, UnsupportedError, average_scaling, check_op, reduce_op
from cloud_elastic.worker.comm import followers

__all__ = [
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "allreduce",
    "allreduce_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "allgather",
    "barrier",
    "join",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_state",
    "broadcast_parameters",
    "broadcast_optimizer_state",
]


def on_device(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when contiguous on the round's device, else a contiguous copy there."""
    ctx = get_context()
    if tensor.device != ctx.device:
        return tensor.to(ctx.device)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def check_reducible(op: str, tensor: Any, call: str) -> None:
    """A one-line TypeError, before anything is launched, for what ``call`` cannot reduce: a non-tensor, an
    average of integers, a dtype no collective carries (``dtypes.carrier``: int16 travels as int32)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"hvd.{call}: expected a torch.Tensor, got {type(tensor).__name__}")
    if op == Average and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"hvd.{call}: cannot average a {tensor.dtype} tensor; use op=hvd.Sum (or a floating-point tensor)")
    _reduced_as(tensor.dtype, op, call)


def _reduced_as(dtype: torch.dtype, op: str, call: str) -> torch.dtype:
    """The dtype a reduction by ``op`` carries a ``dtype`` tensor as (complex numbers: only summed, as Gloo can)."""
    return carrier(dtype, call, reduces=True, complex_native=op in (Sum, Average))


def _reduce_options(op: str) -> Any:
    opts = dist.AllreduceOptions()
    opts.reduceOp = reduce_op(op)
    return opts


def _allreduce_packed(tensors: list[torch.Tensor], op: str, what: str) -> None:
    """Reduce each of ``tensors`` (contiguous, on the group's device) in place: one collective per dtype.

    Tensors of one dtype and device are packed into one flat buffer (in the
    dtype it travels as: ``dtypes.carrier``); every collective is launched
    before the first wait, in the order of ``tensors`` (the same on every
    worker, as Gloo matches collectives by issue order), and none before
    every dtype is known to travel.
    """
    ctx = get_context()
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    wires = [_reduced_as(members[0].dtype, op, "allreduce") for members in groups.values()]
    packed = [(to_wire(members[0].view(-1) if len(members) == 1 else torch.cat([m.reshape(-1) for m in members]),
                       wire), members) for wire, members in zip(wires, groups.values())]
    if followers.is_follower(ctx):  # its values must not count (``commit.follow``): the op's identity
        for flat, _ in packed:
            followers.identity_fill(flat, op)
    works = [ctx.group(what).allreduce([flat], _reduce_options(op)) for flat, _ in packed]
    for work, (flat, members) in zip(works, packed):
        ctx.wait(work, what)
        if len(members) > 1 or flat.dtype != members[0].dtype:  # copy_ casts a widened sum back
            offset = 0
            for m in members:
                m.copy_(flat[offset: offset + m.numel()].view_as(m))
                offset += m.numel()


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` in place across all workers and return it.

    ``op``: ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``;
    ``Adasum`` raises UnsupportedError. The tensor is multiplied by
    ``prescale_factor`` before the reduction and by ``postscale_factor``
    after it (an average divides by the world size after the sum).
    """
    op = check_op(op, average)
    check_reducible(op, tensor, "allreduce_")
    ctx = get_context()
    scaling = average_scaling(op, followers.averaging_size(ctx), False, prescale=prescale_factor, postscale=postscale_factor)
    target = tensor.detach()  # same storage: a parameter (a leaf that requires grad) is averaged in place too
    work_tensor = on_device(target)
    scaling.apply_before(work_tensor)
    _allreduce_packed([work_tensor], op, f"allreduce {name or ''}".strip())
    scaling.apply_after(work_tensor)
    if work_tensor is not target:
        target.copy_(work_tensor)
    return tensor


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, compression: Any = Compression.none,
              op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Return the reduction (``op``, default the average) of ``tensor`` over all workers; ``tensor`` is unchanged.

    ``compression`` (``hvd.Compression.fp16``/``bf16``, or any class with
    Horovod's ``compress``/``decompress``) is applied to what is sent; the
    result has ``tensor``'s dtype. A 16-bit cast divides an average by the
    world size *before* the sum, so the sum cannot overflow (see
    ``ops.average_scaling``). Other arguments as :func:`allreduce_`.
    """
    return _reduce_each("allreduce", [tensor], average, name, compression, op, prescale_factor, postscale_factor)[0]


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = Compression.none, op: str | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` over all workers, in one collective per dtype; return the results.

    As :func:`allreduce` for each tensor (the inputs are unchanged); the
    tensors are packed into one flat buffer per dtype, which is what Horovod's
    grouping guarantees: they are reduced together.
    """
    return _reduce_each("grouped_allreduce", tensors, average, name, compression, op, prescale_factor, postscale_factor)


def _reduce_each(call: str, tensors: Sequence[torch.Tensor], average: bool | None, name: str | None, compression: Any,
                 op: str | None, prescale_factor: float, postscale_factor: float) -> list[torch.Tensor]:
    op = check_op(op, average)
    compression = check_compression(compression)
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"hvd.{call}: expected a non-empty list of tensors")
    for t in tensors:
        check_reducible(op, t, call)
    ctx = get_context()
    scalings = [average_scaling(op, followers.averaging_size(ctx), casts(compression, t.dtype), prescale=prescale_factor,
                                postscale=postscale_factor) for t in tensors]
    encoded = [encode(t, compression, s.before, ctx.device) for t, s in zip(tensors, scalings)]
    _allreduce_packed([e.tensor for e in encoded], op, f"allreduce {name or ''}".strip())
    results = []
    for t, e, s in zip(tensors, encoded, scalings):
        result = e.decode()
        s.apply_after(result)
        results.append(result.to(t.device))
    return results


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """:func:`grouped_allreduce` in place: each tensor receives its result; return ``tensors``."""
    tensors = list(tensors)
    results = _reduce_each("grouped_allreduce_", tensors, average, name, None, op, prescale_factor, postscale_factor)
    for t, result in zip(tensors, results):
        t.detach().copy_(result)  # detached: a parameter may be one of them, as in allreduce_
    return tensors


def barrier() -> None:
    """Return once every worker of the round has called it (a one-element allreduce).

    Like every collective here it fails with CollectiveError when a peer is
    lost, instead of waiting for it.
    """
    ctx = get_context()
    token = torch.zeros(1, device=ctx.device)
    ctx.wait(ctx.group("barrier").allreduce([token]), "barrier")


def join(device: int = -1) -> int:
    """Not supported: raises UnsupportedError (see docs/porting.md).

    Horovod's coordinator tells a joined worker which allreduces its peers
    run, so it can contribute zeros to each. Here collectives are matched by
    issue order with no coordinator: a joined worker cannot know its peers'
    collectives, and a guess that differs in size aborts Gloo.
    """
    del device
    raise UnsupportedError("hvd.join() is not supported by cloud-elastic (no coordinator can tell a joined worker its "
                           "peers' allreduces): give every worker the same number of batches, e.g. with "
                           "hvd.elastic.ElasticSampler, which pads shards to equal length")


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Concatenate every worker's ``tensor`` along dimension 0 (first dims may differ).

    Tensors whose dtype or shape past dimension 0 differ raise ValueError on every worker (told in the
    sizes exchange that precedes the gather, at no extra collective).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"hvd.allgather: expected a torch.Tensor, got {type(tensor).__name__}")
    wire = carrier(tensor.dtype, "allgather", reduces=False)
    ctx = get_context()
    size = ctx.info.size
    local = on_device(tensor.detach())
    if local.dim() == 0:
        local = local.reshape(1)
    rows = [r[0].tolist() for r in shapes.gather_rows_of([shapes.shape_row(local)], "allgather sizes")]
    shapes.check_gathered(rows, "allgather")
    counts = [int(r[shapes.FIRST]) for r in rows]
    longest = max(counts)
    padded = local
    if local.shape[0] < longest:
        pad = torch.zeros((longest - local.shape[0],) + tuple(local.shape[1:]), dtype=local.dtype, device=local.device)
        padded = torch.cat([local, pad])
    padded = to_wire(padded, wire)
    outs = [torch.empty_like(padded) for _ in range(size)]
    ctx.wait(ctx.pg.allgather([outs], [padded]), f"allgather {name or ''}".strip())
    result = from_wire(torch.cat([o[:n] for o, n in zip(outs, counts)]), tensor.dtype)
    return result.to(tensor.device)


def _my_rank(ctx: Any, cross: bool) -> int:
    """This worker's rank in the round's group, or with ``cross`` in its cross-host group (``hvd.shard``)."""
    return ctx.info.cross_rank if cross else ctx.info.rank


def _takes_part(ctx: Any, cross: bool, root_rank: int, receivers: Sequence[int] | None) -> bool:
    """Whether this worker sends or receives in a broadcast to ``receivers`` (None: to every worker)."""
    if receivers is None:
        return True
    return bool(receivers) and (_my_rank(ctx, cross) == root_rank or _my_rank(ctx, cross) in receivers)


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None, *, cross: bool = False,
               receivers: Sequence[int] | None = None, meanwhile: Callable[[], None] | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s value, in place; return it.

    ``cross``: over this worker's cross-host group (sharded training: the same local
    rank of every host, ``root_rank`` a host index), a no-op with one host.
    ``receivers``: the ranks that need the value (None: every one). Given, the root
    sends it to each of them point to point, all at once, and the other workers take
    no part: their ``tensor`` is left as it is (see :func:`needing`).
    ``meanwhile``: on the root, called once the value is on its way, before the wait for it to be sent.
    """
    wire = carrier(tensor.dtype, "broadcast", reduces=False, complex_native=True)
    ctx = get_context()
    if cross and ctx.info.cross_size <= 1:
        return tensor
    if not _takes_part(ctx, cross, root_rank, receivers):
        return tensor
    me = _my_rank(ctx, cross)
    target = tensor.detach()  # as in allreduce_: a parameter may be broadcast in place
    staged = on_device(target)
    work_tensor = to_wire(staged, wire)  # a view of staged's bits: what lands in it lands in staged
    what = f"broadcast {name or ''}".strip()
    if receivers is None:
        group = (ctx.cross_group if cross else ctx.group)(what)
        opts = dist.BroadcastOptions()
        opts.rootRank = root_rank
        _wait_after(ctx, [group.broadcast([work_tensor], opts)], what, meanwhile if me == root_rank else None)
    elif me == root_rank:
        _wait_after(ctx, [ctx.point_to_point(what, lambda g, r=rank: g.send([work_tensor], r, 0), cross=cross)
                          for rank in receivers], what, meanwhile)
    else:
        ctx.wait(ctx.point_to_point(what, lambda g: g.recv([work_tensor], root_rank, 0), cross=cross), what)
    if staged is not target:
        target.copy_(staged)
    return tensor


def _wait_after(ctx: Any, works: list[Any], what: str, meanwhile: Callable[[], None] | None) -> None:
    try:  # ``works`` are waited for even when ``meanwhile`` raised
        if meanwhile is not None:
            meanwhile()
    finally:
        for work in works:
            ctx.wait(work, what)


def gather_rows(row: torch.Tensor, name: str) -> torch.Tensor | None:
    """Every worker's ``row`` (same shape and dtype on all), stacked by rank, on rank 0; None elsewhere.

    One gather: each worker sends to rank 0 once, all at once (an allreduce of the
    same rows would pass through every worker in turn).
    """
    ctx = get_context()
    size, me = ctx.info.size, ctx.info.rank
    if size <= 1:
        return row.unsqueeze(0).clone()
    work_tensor = on_device(row)
    outputs = [[torch.empty_like(work_tensor) for _ in range(size)]] if me == 0 else []
    opts = dist.GatherOptions()
    opts.rootRank = 0
    ctx.wait(ctx.group(name).gather(outputs, [work_tensor], opts), name)
    return torch.stack([t.cpu() for t in outputs[0]]) if me == 0 else None


def needing(needs: bool, name: str, *, cross: bool = False) -> list[int]:
    """The ranks whose ``needs`` is true, on every worker of the group (one small allreduce).

    A state sync asks it before sending: a worker that already holds the root's
    commit takes no part in the transfer (``receivers`` of :func:`broadcast_`).
    ``cross``: over the cross-host group, as :func:`broadcast_`.
    """
    ctx = get_context()
    size, me = (ctx.info.cross_size, ctx.info.cross_rank) if cross else (ctx.info.size, ctx.info.rank)
    if size <= 1:
        return []
    flags = torch.zeros(size, dtype=torch.int64)
    flags[me] = int(needs)
    work_tensor = on_device(flags)
    what = f"which workers need the {name}"
    ctx.wait((ctx.cross_group if cross else ctx.group)(what).allreduce([work_tensor]), what)
    return [rank for rank, flag in enumerate(work_tensor.tolist()) if flag]


def broadcast(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None) -> torch.Tensor:
    """Return ``root_rank``'s value of ``tensor``."""
    return broadcast_(tensor.detach().clone(), root_rank, name)


def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None) -> Any:
    """Return ``root_rank``'s ``obj`` on every worker.

    Objects are pickled, as in Horovod and ``torch.distributed``: this trusts
    the round's members (only holders of the job secret can form a round, see
    ``worker/rounds/signed_store.py``) and the network between them. ``sync()`` never uses
    it (see :func:`broadcast_state`); the control plane never pickles.
    """
    ctx = get_context()
    if ctx.info.rank == root_rank:
        buf = io.BytesIO()
        pickle.dump(obj, buf, protocol=pickle.HIGHEST_PROTOCOL)
        payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name)
    if ctx.info.rank != root_rank:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name)
    if ctx.info.rank == root_rank:
        return obj
    payload = payload.contiguous()
    return pickle.loads(ctypes.string_at(payload.data_ptr(), payload.numel()))  # no numpy needed


def broadcast_state(obj: Any = None, root_rank: int = 0, name: str = "state", *, cross: bool = False,
                    receivers: Sequence[int] | None = None) -> Any:
    """Return ``root_rank``'s ``obj`` on every worker, never unpickling anything foreign.

    Used by ``sync()``: encoded with ``torch.save`` and decoded with
    ``weights_only=True`` (see ``statecodec``). If the root's object cannot be
    carried that way, every worker raises a ``StateSyncError`` (the root's own
    decode of the bytes runs while they are on their way, naming the part to blame).
    ``cross`` and ``receivers``: as :func:`broadcast_` (a worker that takes no
    part gets its own ``obj`` back, and does not learn of a root's error).
    """
    ctx = get_context()
    if cross and ctx.info.cross_size <= 1:
        return obj
    if not _takes_part(ctx, cross, root_rank, receivers):
        return obj
    root = _my_rank(ctx, cross) == root_rank
    error = ""
    data = b""
    refused: list[statecodec.StateSyncError | None] = []  # the root's own decode of it, run on its way (below)
    if root:
        try:
            data = statecodec.encode(obj, name, check=False)
        except statecodec.StateSyncError as exc:
            error = str(exc)[:_INLINE_BYTES // 4]  # one collective carries it (4: the most bytes a character takes)
            data = error.encode()
    # One collective for a state of up to _INLINE_BYTES (the usual sync's attributes, a sampler, a skeleton):
    # its length, then its first bytes; only a bigger state takes a second for the rest.
    head = torch.zeros(8 + _INLINE_BYTES, dtype=torch.uint8)
    if root:
        head[:8] = torch.tensor([-len(data) if error else len(data)], dtype=torch.int64).view(torch.uint8)
        first = data[:_INLINE_BYTES]
        if first:
            head[8: 8 + len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)
    check = (lambda: refused.append(statecodec.refusal(obj, data, name))) if root and not error else None
    broadcast_(head, root_rank, name, cross=cross, receivers=receivers, meanwhile=check)
    n = int(head[:8].view(torch.int64).item())
    if root:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    else:
        statecodec.check_length(n, name, _INLINE_BYTES)  # before allocating by it: the header came from the network
        payload = torch.empty(abs(n), dtype=torch.uint8)
        payload[: min(abs(n), _INLINE_BYTES)] = head[8: 8 + min(abs(n), _INLINE_BYTES)]
    if abs(n) > _INLINE_BYTES:
        rest = payload[_INLINE_BYTES:]
        broadcast_(rest, root_rank, name, cross=cross, receivers=receivers)
    if n < 0:  # the root could not encode it: everyone fails alike, nobody waits for a peer
        raise statecodec.StateSyncError(error or ctypes.string_at(payload.data_ptr(), payload.numel()).decode(errors="replace"))
    if refused and refused[0] is not None:  # every receiver's decode of the same bytes fails alike
        raise refused[0]
    if root:
        return obj
    return statecodec.decode(ctypes.string_at(payload.data_ptr(), payload.numel()), name)


#: A state of at most this many bytes is broadcast in one collective with its length (see :func:`broadcast_state`).
_INLINE_BYTES = 64 * 1024
#: Tensors are broadcast packed into flat buffers of at most this many bytes (one collective each).
_PACK_BYTES = 32 * 1024 * 1024
#: A tensor at least this big is broadcast alone, in place (no packing copies).
_ALONE_BYTES = 4 * 1024 * 1024


def pack_chunks(tensors: Sequence[torch.Tensor], *, by_device: bool = True) -> list[list[int]]:
    """How :func:`broadcast_tensors_` packs ``tensors``: lists of indices into them, one a message.

    A tensor of 4 MiB or more is a message alone (first, in order); the others are
    packed by dtype (and device, with ``by_device``) in flat buffers of up to 32 MiB,
    in order. Decided by dtype, shape and order only, so every worker that holds
    tensors of the same dtypes and shapes packs them alike (``heal`` relies on it:
    its receivers' tensors may live on another device than its senders').
    """
    groups: dict[Any, list[list[int]]] = {}
    sizes: dict[Any, int] = {}
    big = []
    for i, t in enumerate(tensors):
        key = (t.dtype, t.device) if by_device else t.dtype
        nbytes = t.numel() * t.element_size()
        if nbytes >= _ALONE_BYTES:
            big.append([i])
            continue
        chunks = groups.setdefault(key, [[]])
        if chunks[-1] and sizes.get(key, 0) + nbytes > _PACK_BYTES:
            chunks.append([])
            sizes[key] = 0
        chunks[-1].append(i)
        sizes[key] = sizes.get(key, 0) + nbytes
    return big + [chunk for chunks in groups.values() for chunk in chunks]


def broadcast_tensors_(tensors: list[torch.Tensor], root_rank: int = 0, name: str = "tensors", *,
                       cross: bool = False, receivers: Sequence[int] | None = None) -> None:
    """Overwrite each of ``tensors`` with ``root_rank``'s value, in place, in as few collectives as fit.

    Tensors of one dtype and device travel packed in flat buffers of up to
    32 MiB: a state sync of a few dozen tensors is then a few collectives, not
    one each (each costs about a millisecond on loopback even when tiny). A
    tensor of 4 MiB or more travels alone, into its place: packing it would copy
    it twice more for no gain (see :func:`pack_chunks`).
    ``cross`` and ``receivers``: as :func:`broadcast_`.
    """
    ctx = get_context()
    if cross and ctx.info.cross_size <= 1:
        return
    if ctx.info is not None and not _takes_part(ctx, cross, root_rank, receivers):
        return
    root = ctx.info is None or _my_rank(ctx, cross) == root_rank
    with torch.no_grad():
        for chunk in pack_chunks(tensors):
            members = [tensors[i] for i in chunk]
            if len(members) == 1:
                t = members[0]
                buf = t if t.is_contiguous() else t.contiguous()
                broadcast_(buf, root_rank, name, cross=cross, receivers=receivers)
                if buf is not t and not root:
                    t.copy_(buf)
                continue
            if root:
                flat = torch.cat([t.reshape(-1) for t in members])
            else:
                flat = torch.empty(sum(t.numel() for t in members), dtype=members[0].dtype, device=members[0].device)
            broadcast_(flat, root_rank, name, cross=cross, receivers=receivers)
            if not root:
                offset = 0
                for t in members:
                    t.copy_(flat[offset: offset + t.numel()].view(t.shape))
                    offset += t.numel()


Params = Union[Mapping[str, torch.Tensor], Iterable[Union[torch.Tensor, tuple[str, torch.Tensor]]]]


def broadcast_parameters(params: Params, root_rank: int = 0) -> None:
    """Overwrite ``params`` with ``root_rank``'s, in place: a ``state_dict()``, ``named_parameters()``, or
    tensors (``model.parameters()``, a list of them), as Horovod accepts.

    Every worker's tensors must agree in number, dtype and shape: otherwise every worker raises ValueError
    naming the first that differs (checked by one small allgather before they travel).
    """
    named = named_tensors(params, "broadcast_parameters")
    _refuse_shards("broadcast_parameters", ((name, t) for name, t in named))
    tensors = [t for _, t in named]
    shapes.check_same_tensors(tensors, [n for n, _ in named], "broadcast_parameters")
    broadcast_tensors_(tensors, root_rank, "parameters")


def _refuse_shards(call: str, named: Iterable[tuple[str | None, torch.Tensor]]) -> None:
    """ValueError, in one line and before any collective, for a shard of a model sharded with ``hvd.shard``
    (a DTensor): packing it for a broadcast would gather it over its host, whose other workers, in the
    broadcast, never join; ``hvd.elastic.run``'s state sync gives every host host 0's shards instead."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without distributed tensors shards nothing
        return
    for name, t in named:
        if isinstance(t, DTensor):
            what = f"{name!r} is" if name else "its parameters are"
            raise ValueError(f"hvd.{call}: {what} sharded with hvd.shard (a DTensor); a sharded model and its "
                             "optimizer are synced by hvd.elastic.run's TorchState, which gives every host host "
                             "0's shards: drop this call")


def parameter_tensors(params: Params) -> list[torch.Tensor]:
    """The tensors of ``params`` (as :func:`broadcast_parameters` takes them), detached, in the order they travel."""
    return [t for _, t in named_tensors(params, "broadcast_parameters")]


def named_tensors(params: Params, call: str) -> list[tuple[str | None, torch.Tensor]]:
    """(name, detached tensor) of each tensor of ``params``: a mapping (sorted by name; values that are not
    tensors, such as a module's extra state, are left out, as from any ``(name, value)`` pair), or an iterable
    of tensors and ``(name, tensor)`` pairs. TypeError, in one line, for anything else."""
    if isinstance(params, torch.Tensor):
        raise TypeError(f"hvd.{call}: expected a state_dict(), named_parameters() or a list of tensors, "
                        "got a single tensor (wrap it in a list)")
    items = sorted(params.items()) if isinstance(params, Mapping) else params
    out: list[tuple[str | None, torch.Tensor]] = []
    for item in items:
        if isinstance(item, torch.Tensor):
            out.append((None, item.detach()))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
            if isinstance(item[1], torch.Tensor):
                out.append((item[0], item[1].detach()))
        else:
            raise TypeError(f"hvd.{call}: expected tensors or (name, tensor) pairs, got a {type(item).__name__}")
    return out


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0, model: Any = None) -> None:
    """Make every worker's optimizer state equal to ``root_rank``'s.

    ``model`` is Horovod 0.28's, accepted and not needed: Horovod finds sparse embeddings with it, to make their zero
    gradients sparse in the ``step()`` it runs to create a missing state; none runs here (the root's state is sent).

    Workers that joined late may not have created their state yet (momentum
    buffers appear on the first step), so the structure is agreed first: the
    root broadcasts its state dict with tensors replaced by shapes, every
    worker allocates the same tensors, then the tensors are broadcast. The
    root's state is left as it is: loading a copy of itself would replace its
    state objects, and a commit kept in place, which holds those very objects,
    could no longer be restored if the sync were cut short (``commits``).
    """
    _refuse_shards("broadcast_optimizer_state", ((None, p) for g in optimizer.param_groups for p in g["params"]))
    root = get_context().info.rank == root_rank
    synced = broadcast_state_dict(optimizer.state_dict() if root else None, root_rank, limit=state_limit(optimizer))
    if not root:
        optimizer.load_state_dict(synced)


def broadcast_state_dict(state: Any, root_rank: int = 0, name: str = "optimizer state", *, cross: bool = False,
                         receivers: Sequence[int] | None = None, limit: int) -> Any:
    """``root_rank``'s ``state`` (a state dict of plain data and tensors; other workers pass None) on every worker.

    The skeleton (tensors replaced by shapes) goes first, through :func:`broadcast_state`; every worker then
    allocates the same tensors, at most ``limit`` bytes of them (``skeleton.allocate``: a skeleton announcing
    more is refused), and they are broadcast packed (:func:`broadcast_tensors_`). Returned on every
    worker, the root included, with tensors of its own (CPU copies). ``cross`` and ``receivers``: as
    :func:`broadcast_`; a worker that takes no part gets its own ``state`` back.
    """
    ctx = get_context()
    if not _takes_part(ctx, cross, root_rank, receivers):
        return state
    root = _my_rank(ctx, cross) == root_rank
    skeleton, tensors = _split_tensors(state) if root else (None, [])
    skeleton = broadcast_state(skeleton, root_rank, name, cross=cross, receivers=receivers)
    if not root:
        tensors = allocate(skeleton, name, limit)
    broadcast_tensors_(tensors, root_rank, name, cross=cross, receivers=receivers)
    return _join_tensors(skeleton, tensors)
