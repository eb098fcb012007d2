"""What a sharded checkpoint's ``metadata.json`` may claim about its tensors, checked before anything is allocated.

A load allocates each optimizer tensor at the size the metadata gives (``dcp.optimizer_target``), before DCP reads a
byte, and the metadata's digest is only the manifest's, which whoever writes the storage can rewrite too. So a
metadata file that claims any size must not be believed: :func:`check_layout` requires that

* each tensor has at most :data:`MAX_DIMS` dimensions;
* each tensor's chunks lie inside it, do not overlap and cover it exactly (so their sizes add up to the tensor's);
* each chunk with elements has a storage entry, at least as long as the chunk's bytes (an entry is the chunk's
  ``torch.save`` archive, which holds them uncompressed: ``safety.check_archive``);
* each non-tensor item has a storage entry (its value's archive): DCP writes one for each, so an item without one
  was added to the file after DCP wrote it, and must not pass for an item of another model (which would stop the
  job as a checkpoint that does not fit, where this one is only unusable and the previous one may be fine);
* the storage entries of one file do not overlap.

Then the bytes a load allocates for a tensor are at most the bytes the shard files hold, which
``dcp._VerifyingReader`` compares with their size on the storage before it returns the metadata. The check's own
work grows in proportion to the numbers the file holds, plus at most :data:`SWEEP_BUDGET`. Pure: the values are the
metadata's, already type-checked by ``dcp.decode_metadata``.

:func:`check_name` bounds each item's name, tensor or not, at :data:`MAX_NAME` characters and :data:`MAX_NAME_PARTS`
parts between dots: a load looks it up in the live state's keys (``dcp.unexpected_items``), and a save refuses a name
its load would (``dcp.encode_metadata``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

__all__ = ["MAX_DIMS", "MAX_NAME", "MAX_NAME_PARTS", "SWEEP_BUDGET", "Region", "Tensor", "check_layout",
           "check_name"]


@dataclass(frozen=True)
class Tensor:
    """One tensor item as the metadata claims it: its element size in bytes, its size, its chunks
    (``(offsets, sizes)``)."""

    itemsize: int
    size: tuple[int, ...]
    chunks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]


@dataclass(frozen=True)
class Region:
    """One storage entry: the item (and chunk offsets, None for a non-tensor item) whose bytes ``file`` holds
    from ``at`` for ``length`` bytes."""

    fqn: str
    offset: tuple[int, ...] | None
    file: str
    at: int
    length: int


#: The most dimensions an item may claim: torch's own bound (a reduction over a tensor of more raises "only tensors
#: with up to 64 dims are supported"). A forged claim of tens of thousands would otherwise cost time to check.
MAX_DIMS = 64
#: The longest item name, and the most parts between its dots, that a metadata file may claim (and a save write):
#: torch DCP's names are a state's keys joined by dots (``optimizer.state.layers.31.mlp.weight.exp_avg``), a few
#: hundred characters and a dozen parts at most in real models.
MAX_NAME = 4096
MAX_NAME_PARTS = 256
#: Coordinates the sweep of :func:`_overlap` may compare for one metadata file (about a second here): two chunks of
#: ``n`` dimensions cost ``n``.
SWEEP_BUDGET = 4_000_000


def check_layout(tensors: Mapping[str, Tensor], regions: Sequence[Region], budget: int = SWEEP_BUDGET,
                 others: Iterable[str] = ()) -> None:
    """ValueError, in one line, unless the claims hold (see the module docstring); ``budget``: the sweep's, for the
    whole file; ``others``: the names of the non-tensor items."""
    entries = {(r.fqn, r.offset): r for r in regions}
    for fqn in others:
        if (fqn, None) not in entries:
            raise ValueError(f"item {_name(fqn)}: a non-tensor item without a storage entry, which DCP never writes")
    left = [budget]
    for fqn, tensor in tensors.items():
        if tensor.itemsize <= 0:
            raise ValueError(f"item {_name(fqn)}: its dtype has no known size")
        if len(tensor.size) > MAX_DIMS:
            raise ValueError(f"item {_name(fqn)}: its size has {len(tensor.size):,} dimensions, over the {MAX_DIMS} "
                             "a tensor may have")
        _check_chunks(fqn, tensor, left)
        for offsets, sizes in tensor.chunks:
            count = _volume(sizes)
            if count == 0:
                continue
            entry = entries.get((fqn, offsets))
            if entry is None:
                raise ValueError(f"item {_name(fqn)}: its chunk at {list(offsets)} has no storage entry")
            if count * tensor.itemsize > entry.length:
                raise ValueError(f"item {_name(fqn)}: its chunk at {list(offsets)} holds {count * tensor.itemsize:,} "
                                 f"bytes, its storage entry only {entry.length:,}")
    _check_regions(regions)


def check_name(fqn: str) -> None:
    """ValueError, in one line, unless the item name ``fqn`` has at most :data:`MAX_NAME` characters and
    :data:`MAX_NAME_PARTS` parts."""
    if len(fqn) > MAX_NAME:
        raise ValueError(f"item {_name(fqn)}: its name has {len(fqn):,} characters, over the {MAX_NAME:,} an item's "
                         "may have")
    if fqn.count(".") >= MAX_NAME_PARTS:
        raise ValueError(f"item {_name(fqn)}: its name has {fqn.count('.') + 1:,} parts, over the {MAX_NAME_PARTS} "
                         "an item's may have")


def _check_chunks(fqn: str, tensor: Tensor, budget: list[int]) -> None:
    size, chunks = tensor.size, tensor.chunks
    total = 0
    for offsets, sizes in chunks:
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise ValueError(f"item {_name(fqn)}: its chunk at {list(offsets)[:8]} has {len(sizes)} dimensions, its "
                             f"size {len(size)}")
        if any(o + s > d for o, s, d in zip(offsets, sizes, size)):
            raise ValueError(f"item {_name(fqn)}: its chunk at {list(offsets)} of {list(sizes)} is outside its size "
                             f"{list(size)}")
        total += _volume(sizes)
    if total != _volume(size):
        raise ValueError(f"item {_name(fqn)}: its chunks hold {total:,} elements, its size {list(size)} "
                         f"{_volume(size):,}")
    try:
        overlap = _overlap(chunks, len(size), budget)
    except ValueError as exc:
        raise ValueError(f"item {_name(fqn)}: {exc}") from None
    if overlap:
        raise ValueError(f"item {_name(fqn)}: its chunks overlap")


def _overlap(chunks: Sequence[tuple[tuple[int, ...], tuple[int, ...]]], ndim: int, budget: list[int]) -> bool:
    """Whether two chunks with elements share one.

    The chunks of a DTensor form a grid (each dimension split at the same points for every chunk), so they are
    first cut along every chunk's bounds and each cell is marked once: work and memory in proportion to the
    chunks. Chunks that cut it into many more cells than there are chunks are compared in a sweep, which spends
    ``budget[0]`` coordinates compared, shared by the whole metadata: ValueError when it runs out (a forged file
    could otherwise make each load compare hundreds of thousands of chunks with each other)."""
    boxes = [(o, s) for o, s in chunks if _volume(s) > 0]
    if ndim == 0 or len(boxes) < 2:
        return ndim == 0 and len(boxes) > 1
    cuts = [sorted({o[d] for o, _ in boxes} | {o[d] + s[d] for o, s in boxes}) for d in range(ndim)]
    if _volume([len(c) - 1 for c in cuts]) <= 4 * len(boxes) + 64:
        return _marked_twice(boxes, cuts)
    axis = max(range(ndim), key=lambda d: len({o[d] for o, _ in boxes}))
    boxes.sort(key=lambda box: box[0][axis])
    active: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for offsets, sizes in boxes:
        active = [(o, s) for o, s in active if o[axis] + s[axis] > offsets[axis]]
        budget[0] -= len(active) * ndim + 1  # the filter above costs at most the previous chunk's charge, plus one
        if budget[0] < 0:
            raise ValueError(f"its chunks are too many, and too far from a grid, to check ({len(chunks):,} in one "
                             "item)")
        for o, s in active:
            if all(o[d] < offsets[d] + sizes[d] and offsets[d] < o[d] + s[d] for d in range(ndim)):
                return True
        active.append((offsets, sizes))
    return False


def _marked_twice(boxes: Sequence[tuple[tuple[int, ...], tuple[int, ...]]], cuts: list[list[int]]) -> bool:
    """Whether a cell of the grid ``cuts`` lies in two ``boxes`` (each a whole number of cells); at most one
    step a cell."""
    where = [{v: i for i, v in enumerate(c)} for c in cuts]
    strides = [1] * len(cuts)  # suffix products, in one pass: a product per dimension costs the square of them
    for d in range(len(cuts) - 2, -1, -1):
        strides[d] = strides[d + 1] * (len(cuts[d + 1]) - 1)
    seen = bytearray(_volume([len(c) - 1 for c in cuts]))
    for offsets, sizes in boxes:
        spans = [range(where[d][o] * strides[d], where[d][o + s] * strides[d], strides[d])
                 for d, (o, s) in enumerate(zip(offsets, sizes))]
        for cell in itertools.product(*spans):
            flat = sum(cell)
            if seen[flat]:
                return True
            seen[flat] = 1
    return False


def _check_regions(regions: Sequence[Region]) -> None:
    by_file: dict[str, list[Region]] = {}
    for region in regions:
        by_file.setdefault(region.file, []).append(region)
    for name, found in by_file.items():
        found.sort(key=lambda r: r.at)
        for before, after in zip(found, found[1:]):
            if before.at + before.length > after.at:
                raise ValueError(f"the storage entries of {_name(after.fqn)} and {_name(before.fqn)} overlap in "
                                 f"{name[:80]!r}")


def _volume(sizes: Sequence[int]) -> int:
    count = 1
    for s in sizes:
        count *= s
    return count


def _name(fqn: str) -> str:
    return repr(fqn if len(fqn) <= 80 else fqn[:77] + "...")
