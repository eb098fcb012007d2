"""Healing from peers: a replica's state sync comes from every worker that holds rank 0's commit, each a part.

``TorchState.sync`` knows which workers need rank 0's commit (a newcomer, a spare,
a worker that could not restore it) from ``commit.sync_facts``; every other
worker *holds* it, bit for bit, rank 0 among them. The tensors are packed as
:func:`collectives.broadcast_tensors_` packs them (:func:`collectives.pack_chunks`,
the same messages on every worker), the packed bytes are cut into one contiguous
range per holder (:func:`assign`, cut at element boundaries, so several holders
share even one big tensor), and each holder sends its range to each receiver
point to point, all holders at once. A worker that neither holds a part nor
needs one takes no part; with no receiver, nothing is sent at all. A model's
buffers come from rank 0 alone (:meth:`Heal.buffers`): holders share its
parameters and optimizer state bit for bit, but not, say, BatchNorm's running
statistics, which are each worker's own.

Tensors travel as their bytes in a dtype NCCL carries too (:func:`_wire`: an int16 as float16 bits, a complex
as real pairs), so a state heals on NCCL as on Gloo. Memory in flight is bounded: a holder builds one piece at a time; a receiver
takes one piece from each holder at a time (a *wave*), straight into its tensors
when a piece is one tensor's slice or big parts of several (:func:`_separate`: one message a part, nothing packed),
else through a buffer of at most 32 MiB.

:meth:`Heal.post` starts the same sends and receives without waiting (the follow window's pieces, which move
while the next step computes): :meth:`InFlight.land` waits for them later and copies what came into place. It
holds a landing buffer for everything posted, so its caller bounds what one post moves (``commit.follow``: one
commit's pieces, at most twice ``CLOUD_ELASTIC_FOLLOW_MB``; more goes through :meth:`Heal.tensors`).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from cloud_elastic.worker.comm import collectives
from cloud_elastic.worker.comm.collectives import on_device
from cloud_elastic.worker.comm.dtypes import carrier, to_wire
from cloud_elastic.worker.comm.skeleton import _checked_slots, _dtype, _is_slot, _join_tensors, _split_tensors, _TENSOR, allocate
from cloud_elastic.worker.comm.statecodec import StateSyncError
from cloud_elastic.worker.context import get_context

__all__ = ["Piece", "assign", "Heal", "InFlight", "skeleton"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Piece:
    """Elements ``start`` to ``stop`` (excluded) of the flat message ``chunk``."""

    chunk: int
    start: int
    stop: int


def assign(chunks: Sequence[tuple[int, int]], holders: int) -> list[list[Piece]]:
    """Each holder's pieces of ``chunks`` (``(elements, bytes per element)`` each), balanced by bytes.

    The chunks' bytes, end to end, are cut into ``holders`` contiguous ranges of
    equal size (the last ones a byte longer when it does not divide), each cut moved
    down to an element boundary: holder *h* gets what lies in range *h*, in chunk
    order, so a big chunk is shared by several holders and no holder gets more than
    its share plus one element. The same on every worker (integers only).
    """
    if holders < 1:
        raise ValueError(f"assign: no holder to send {len(chunks)} chunk(s)")
    total = sum(n * size for n, size in chunks)
    cuts = [total * h // holders for h in range(holders + 1)]
    pieces: list[list[Piece]] = [[] for _ in range(holders)]
    offset = 0
    for index, (n, size) in enumerate(chunks):
        def element(cut: int) -> int:
            return min(n, max(0, (cut - offset) // size))

        for h in range(holders):
            start, stop = element(cuts[h]), element(cuts[h + 1])
            if stop > start:
                pieces[h].append(Piece(index, start, stop))
        offset += n * size
    return pieces


def _parts(members: list[torch.Tensor], start: int, stop: int):
    """(tensor, its first element, its stop, position in the piece) of each member overlapping the piece."""
    offset = 0
    for t in members:
        lo, hi = max(start, offset), min(stop, offset + t.numel())
        if hi > lo:
            yield t, lo - offset, hi - offset, lo - start
        offset += t.numel()


#: A piece that spans several tensors travels as one message per tensor's part when every part is at least this
#: big (nothing packed on the holder: an Adam piece is a parameter's slice and its moments'; nothing unpacked on a
#: receiver that lands in place); smaller parts are packed into one message, which costs less than several.
SEPARATE_BYTES = 64 * 1024


def _separate(parts: list[tuple[torch.Tensor, int, int, int]]) -> bool:
    """Whether a piece's ``parts`` (:func:`_parts`, alike on holders and receivers) go as messages of their own."""
    return len(parts) > 1 and all((b - a) * t.element_size() >= SEPARATE_BYTES for t, a, b, _at in parts)


def _messages(members: list[torch.Tensor], piece: Piece) -> list[torch.Tensor]:
    """What a holder sends of ``piece``, in order: its tensors' slices themselves (one part, or parts that go
    separately) or one buffer packing the parts."""
    parts = list(_parts(members, piece.start, piece.stop))
    views = [on_device(t.reshape(-1)[a:b]) for t, a, b, _at in parts]
    return views if len(views) == 1 or _separate(parts) else [torch.cat(views)]


class Heal:
    """One replica sync: who holds rank 0's commit ``seq``, who needs it, and what this worker moved."""

    def __init__(self, receivers: Sequence[int], size: int, seq: int | None) -> None:
        self.receivers = list(receivers)
        #: Every worker that does not need the commit holds it (rank 0 first): they share the sending.
        self.holders = [rank for rank in range(size) if rank not in self.receivers]
        self.seq = seq
        self.bytes = 0  # sent (a holder) or received (a receiver)
        self.pieces = 0  # this holder's pieces
        self.all_pieces = 0  # every holder's
        self.sources: set[int] = set()  # the holders a receiver took a part from
        #: Rank 0's skeletons of the states :meth:`state_dict` syncs, in order (see there).
        self.skeletons: list[Any] = []

    def parameters(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """A model's parameters (of its ``state_dict()``): holders send them, receivers take them in place."""
        self.tensors(collectives.parameter_tensors(state_dict), "parameters")

    def buffers(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """A model's buffers (the rest of its ``state_dict()``), from rank 0 alone: a buffer need not be the same on
        every holder (BatchNorm's running statistics are each worker's own), and parts of several holders' would
        make a state that no worker has."""
        self.tensors(collectives.parameter_tensors(state_dict), "buffers", from_root=True)

    def state_dict(self, state: Any, name: str = "optimizer state", *, limit: int) -> Any:
        """Rank 0's ``state`` (plain data and tensors) on a receiver; None elsewhere (a holder passes its own).

        Its skeleton (tensors replaced by shapes, :func:`skeleton`) came from rank 0 to
        every worker before, in the sync's one broadcast of its small parts
        (``TorchState._small_state``), and waits in :attr:`skeletons`, in the order the
        states are synced: a holder orders its own tensors by it (:func:`_pick`), a
        receiver allocates them by it, at most ``limit`` bytes (``skeleton.allocate``: a skeleton that
        announces more, or is malformed, is refused before anything is allocated).
        """
        ctx = get_context()
        if not self.receivers:
            return None
        if not self.skeletons:
            raise StateSyncError(f"{name}: no skeleton came from rank 0 for it")
        shape = self.skeletons.pop(0)
        me = ctx.info.rank
        if me in self.holders:
            self.tensors(_pick(shape, state, name), name)
            return None
        tensors = allocate(shape, name, limit)
        self.tensors(tensors, name)
        return _join_tensors(shape, tensors)

    def tensors(self, tensors: list[torch.Tensor], name: str, *, from_root: bool = False) -> None:
        """Holders send their ``tensors`` (rank 0 alone: ``from_root``), receivers receive into theirs (same dtypes
        and shapes on every worker)."""
        ctx = get_context()
        me = ctx.info.rank
        holders = self.holders[:1] if from_root else self.holders  # rank 0 is always the first holder
        if not self.receivers or (me not in self.receivers and me not in holders):
            return
        tensors = [_wire(t) for t in tensors]  # views: a receiver still receives into its own tensors
        chunks = [[tensors[i] for i in chunk] for chunk in collectives.pack_chunks(tensors, by_device=False)]
        plan = assign([(sum(t.numel() for t in c), c[0].element_size()) for c in chunks], len(holders))
        self.all_pieces += sum(len(p) for p in plan)
        what = f"healing {name} from peers"
        with torch.no_grad():
            if me in holders:
                self._send(ctx, chunks, plan[holders.index(me)], what)
            else:
                self._receive(ctx, tensors, chunks, plan, holders, what)

    def post(self, tensors: list[torch.Tensor], name: str) -> "InFlight":
        """As :meth:`tensors` (every holder a part), without waiting: the sends and receives are under way when it
        returns, and :meth:`InFlight.land` finishes them. A receiver receives into buffers of its own, never into
        ``tensors`` (copied there by ``land``): a receive that a failed round leaves behind can write nothing that
        the next round's sync gives. A holder's ``tensors`` must not change until ``land`` returned."""
        ctx = get_context()
        me = ctx.info.rank
        flight = InFlight(f"healing {name} from peers")
        _recent.append(flight)
        if not self.receivers or (me not in self.receivers and me not in self.holders):
            return flight
        tensors = [_wire(t) for t in tensors]
        chunks = [[tensors[i] for i in chunk] for chunk in collectives.pack_chunks(tensors, by_device=False)]
        plan = assign([(sum(t.numel() for t in c), c[0].element_size()) for c in chunks], len(self.holders))
        self.all_pieces += sum(len(p) for p in plan)
        with torch.no_grad():
            if me in self.holders:
                for piece in plan[self.holders.index(me)]:
                    for buf in _messages(chunks[piece.chunk], piece):
                        flight.kept.append(buf)
                        flight.works += [ctx.point_to_point(flight.what, lambda g, r=rank, m=buf: g.send([m], r, 0))
                                         for rank in self.receivers]
                        self.bytes += buf.numel() * buf.element_size() * len(self.receivers)
                    self.pieces += 1
                return flight
            for holder, pieces in zip(self.holders, plan):
                for piece in pieces:  # in the order that holder sends them: Gloo matches one peer's in order
                    members = chunks[piece.chunk]
                    buf = torch.empty(piece.stop - piece.start, dtype=members[0].dtype, device=ctx.device)
                    parts = list(_parts(members, piece.start, piece.stop))
                    into = [buf[at: at + b - a] for _t, a, b, at in parts] if _separate(parts) else [buf]
                    flight.works += [ctx.point_to_point(flight.what, lambda g, m=m, h=holder: g.recv([m], h, 0))
                                     for m in into]
                    flight.copies += [(buf[at: at + b - a], t.view(-1)[a:b]) for t, a, b, at in parts]
                    self.bytes += buf.numel() * buf.element_size()
                    self.sources.add(holder)
        return flight

    def _send(self, ctx: Any, chunks: list[list[torch.Tensor]], mine: list[Piece], what: str) -> None:
        for piece in mine:  # one piece at a time: a holder keeps at most one packed buffer
            for buf in _messages(chunks[piece.chunk], piece):
                for work in [ctx.point_to_point(what, lambda g, r=rank: g.send([buf], r, 0))
                             for rank in self.receivers]:
                    ctx.wait(work, what, host=False)
                self.bytes += buf.numel() * buf.element_size() * len(self.receivers)
            self.pieces += 1

    def _receive(self, ctx: Any, tensors: list[torch.Tensor], chunks: list[list[torch.Tensor]],
                 plan: list[list[Piece]], holders: list[int], what: str) -> None:
        # Received into the tensors themselves where they are contiguous on the group's device, else into copies.
        landing = {id(t): on_device(t) for t in tensors}
        for wave in range(max(len(p) for p in plan)):
            posted = []
            for holder, pieces in zip(holders, plan):
                if wave >= len(pieces):
                    continue
                piece = pieces[wave]
                members = [landing[id(t)] for t in chunks[piece.chunk]]
                parts = list(_parts(members, piece.start, piece.stop))
                if len(parts) == 1 or _separate(parts):  # straight into the tensors
                    buf, into = None, [t.view(-1)[a:b] for t, a, b, _at in parts]
                else:
                    buf = torch.empty(piece.stop - piece.start, dtype=members[0].dtype, device=ctx.device)
                    into = [buf]
                works = [ctx.point_to_point(what, lambda g, m=m, h=holder: g.recv([m], h, 0)) for m in into]
                posted.append((works, buf, parts, holder))
            for works, buf, parts, holder in posted:
                for work in works:
                    ctx.wait(work, what, host=False)
                if buf is not None:
                    for t, a, b, at in parts:
                        t.view(-1)[a:b].copy_(buf[at: at + b - a])
                self.bytes += sum((b - a) * t.element_size() for t, a, b, _at in parts)
                self.sources.add(holder)
        for t in tensors:
            if landing[id(t)] is not t:
                t.copy_(landing[id(t)])

    def report(self, worker_id: str) -> None:
        """One INFO line of what this worker sent or received in this sync (nothing when it moved nothing)."""
        amount = f"{self.bytes / 1e6:.1f} MB" if self.bytes >= 100_000 else f"{self.bytes / 1e3:.1f} kB"
        if self.pieces:
            log.info("worker %s: sent %s of commit %s (pieces %d of %d) to rank(s) %s", worker_id, amount, self.seq,
                     self.pieces, self.all_pieces, self.receivers)
        elif self.sources:
            log.info("worker %s: received %s of commit %s from %d holder(s) %s", worker_id, amount, self.seq,
                     len(self.sources), sorted(self.sources))


class InFlight:
    """The sends or receives :meth:`Heal.post` started; :meth:`land` waits for them and puts what came in place."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.works: list[Any] = []
        #: A receiver's (landing buffer's slice, its tensor's slice), copied by :meth:`land`.
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        #: A holder's buffers being sent (packed where a piece spans small parts of several tensors), alive until sent.
        self.kept: list[torch.Tensor] = []

    def land(self, ctx: Any) -> None:
        """Wait for every send or receive (a failure is the round's, as any collective's) and copy what came."""
        works, copies = self.works, self.copies
        self.works, self.copies = [], []
        for work in works:
            ctx.wait(work, self.what, host=False)  # a follower holds no commit until its digests match
        with torch.no_grad():
            for landed, into in copies:
                # Its version counter stays: ``DistributedOptimizer._ce_check_outside`` would read a parameter's
                # as the script's own change since the commit (and copy the parameters at every commit after).
                with torch.autograd._unsafe_preserve_version_counter(into):
                    into.copy_(landed)
        self.kept = []


#: The last posts, referenced whether or not they landed: one that a failed round left behind, never landed, keeps
#: its landing buffers and Gloo's works until its group is long gone (two posts later at the least).
_recent: deque[InFlight] = deque(maxlen=2)


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a dtype that NCCL's send and recv carry, a view of the same memory: torch's NCCL
    dtype map lacks int16, uint16, uint32, uint64 and complex numbers ("not supported for NCCL process group"),
    which Gloo's send and recv carry. Same-width bits (``dtypes``) or complex as real pairs: nothing is copied."""
    if tensor.is_complex():
        return torch.view_as_real(tensor)
    return to_wire(tensor, carrier(tensor.dtype, "heal", reduces=False))


def skeleton(state: Any) -> Any:
    """``state`` with each tensor replaced by its shape, dtype and index (what :meth:`Heal.state_dict` needs)."""
    return _split_tensors(state, copy=False)[0]


def _pick(skeleton: Any, own: Any, name: str) -> list[torch.Tensor]:
    """A holder's own tensors in the order of rank 0's ``skeleton`` (found by the same keys).

    A holder of rank 0's very commit has the same structure; one that does not
    raises here, loudly, rather than send the receivers wrong bytes.
    """
    _checked_slots(skeleton, name)  # a peer's: a tree of well-formed slots, walked below without revisiting
    found: dict[int, torch.Tensor] = {}
    _walk(skeleton, own, "", found, name)
    return [found[i] for i in range(len(found))]


def _walk(slot: Any, value: Any, where: str, found: dict[int, torch.Tensor], name: str) -> None:
    """:func:`_pick`'s walk. A module function, not a closure calling itself: such a closure is a reference
    cycle (the function, its own cell) that kept ``found``, a copy's worth of the state, alive after every heal
    until Python's cyclic collector ran (on a GPU: the optimizer's moments, held beside the restored ones)."""
    if _is_slot(slot):
        shape, dtype = tuple(slot["shape"]), _dtype(slot["dtype"])
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape or value.dtype != dtype:
            raise StateSyncError(f"{name}: this worker holds rank 0's commit, but its {where or 'state'} is not "
                                 f"a {dtype} tensor of shape {list(shape)} as rank 0's")
        found[slot[_TENSOR]] = value.detach()
    elif isinstance(slot, dict):
        for key, sub in slot.items():
            if not isinstance(value, dict) or key not in value:
                if not _holds_tensor(sub):
                    continue  # nothing to send (an empty entry that reading a defaultdict on rank 0 added)
                raise StateSyncError(f"{name}: this worker holds rank 0's commit, but its state has no {where}[{key!r}]")
            _walk(sub, value[key], f"{where}[{key!r}]", found, name)
    elif isinstance(slot, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(slot):
            raise StateSyncError(f"{name}: this worker holds rank 0's commit, but its {where} differs from rank 0's")
        for i, (sub, v) in enumerate(zip(slot, value)):
            _walk(sub, v, f"{where}[{i}]", found, name)


def _holds_tensor(slot: Any) -> bool:
    """Whether a part of a skeleton has a tensor in it."""
    if _is_slot(slot):
        return True
    if isinstance(slot, dict):
        return any(_holds_tensor(sub) for sub in slot.values())
    if isinstance(slot, (list, tuple)):
        return any(_holds_tensor(sub) for sub in slot)
    return False
