"""Whether the workers' tensors agree in dtype and shape, told on every worker in one line.

Gloo matches collectives by issue order and trusts each side's sizes: tensors that
differ give garbage, a closed connection or a C++ abort (``EnforceNotMet``), and
Horovod's coordinator raises ``Mismatched ... tensor shapes`` instead. These
calls check here, each before its tensors travel: ``allgather`` and ``alltoall``
in the exchange of sizes or counts they do anyway (dimension 0 may differ);
``reducescatter`` with one small allgather of its own (it exchanges nothing
else first, and every dimension must match); ``broadcast_parameters`` and
``grouped_reducescatter`` with one small allgather for all their tensors (two
when they differ, to name the tensor). A mismatch raises the same ValueError on
every worker, so none waits for a peer.

The gathered rows come to the host in one copy: the decision to raise is made
in Python before the tensors travel, so on NCCL each check costs one device
sync (``alltoall``'s ``tolist`` of its counts does too).

A tensor is described by one row of int64: its dtype's code, its number of
dimensions, its first :data:`_DIMS` dimensions (-1 past its last) and a digest
of the rest, so that rows of different tensors differ.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch

from cloud_elastic.worker.context import get_context

__all__ = ["shape_row", "gather_rows_of", "check_gathered", "check_same_tensors"]

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
           torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)
_DIMS = 6
#: Columns of a row: dtype, ndim, the first _DIMS dimensions, the digest of the dimensions past them.
WIDTH = 3 + _DIMS
FIRST = 2  # the column of dimension 0


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1  # fits an int64


def shape_row(t: torch.Tensor) -> list[int]:
    """``t``'s dtype and shape as a row (see the module)."""
    dims = list(t.shape)
    code = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else _digest(str(t.dtype))
    return [code, len(dims)] + (dims + [-1] * _DIMS)[:_DIMS] + [_digest(repr(dims[_DIMS:])) if len(dims) > _DIMS else 0]


def _describe(row: Sequence[int], any_first: bool = False) -> str:
    """``row`` as ``float32 (3, 4)``; with ``any_first``, dimension 0 as ``*``."""
    code, ndim = int(row[0]), int(row[1])
    dtype = str(_DTYPES[code]).replace("torch.", "") if 0 <= code < len(_DTYPES) else "another dtype"
    dims: list[Any] = [int(d) for d in row[FIRST: FIRST + min(ndim, _DIMS)]] + (["..."] if ndim > _DIMS else [])
    if any_first and dims:
        dims[0] = "*"
    return f"{dtype} ({', '.join(map(str, dims))}{',' if len(dims) == 1 else ''})"


def gather_rows_of(rows: list[list[int]], what: str) -> list[torch.Tensor]:
    """Every worker's ``rows`` (the same number on each), by rank: one allgather of int64."""
    ctx = get_context()
    mine = torch.tensor(rows, dtype=torch.int64, device=ctx.device).reshape(-1)
    out = [torch.empty_like(mine) for _ in range(ctx.info.size)]
    ctx.wait(ctx.group(what).allgather([out], [mine]), what)
    return list(torch.stack(out).cpu().reshape(len(out), len(rows), WIDTH))  # one copy to the host, not one a rank


def check_gathered(rows: Sequence[Sequence[int]], call: str, any_first: bool = True) -> None:
    """ValueError when the rows (one a worker, by rank) differ but in dimension 0 (``allgather``'s rule).

    Without ``any_first`` dimension 0 must match too (``reducescatter``'s rule).
    """
    compared = [list(r[:FIRST]) + list(r[FIRST + 1:]) if any_first else list(r) for r in rows]
    if all(c == compared[0] for c in compared):
        return
    each = "; ".join(f"rank {rank}: {_describe(r, any_first=any_first)}" for rank, r in enumerate(rows))
    raise ValueError(f"hvd.{call}: mismatched tensors across workers ({each}): every worker must pass the same "
                     f"dtype and the same shape{' past dimension 0' if any_first else ''}")


def check_same_tensors(tensors: Sequence[torch.Tensor], names: Sequence[str | None], call: str,
                       hint: str = "e.g. build the model alike on each") -> None:
    """ValueError on every worker unless every worker's ``tensors`` have the same dtypes and shapes, in order.

    One allgather of three numbers (a digest of all rows, the count, the elements); only when they differ, a
    second one finds the first tensor that differs, to name it.
    """
    if get_context().info.size <= 1:
        return
    rows = [shape_row(t) for t in tensors]
    total = _digest(repr(rows))
    what = call
    summary = gather_rows_of([[total, len(rows), sum(t.numel() for t in tensors)] + [0] * (WIDTH - 3)], what)
    if all(int(s[0, 0]) == total for s in summary):
        return
    most = max(int(s[0, 1]) for s in summary)
    padded = rows + [[-1] * WIDTH] * (most - len(rows))
    every = gather_rows_of(padded, what)
    first = next(i for i in range(most) if any(not torch.equal(e[i], every[0][i]) for e in every))
    name = f" {names[first]!r}" if first < len(names) and names[first] else ""
    each = "; ".join(f"rank {rank}: " + (_describe(e[first].tolist()) if int(e[first, 1]) >= 0 else "none")
                     for rank, e in enumerate(every))
    counts = ", ".join(str(int(s[0, 1])) for s in summary)
    raise ValueError(f"hvd.{call}: the workers' tensors differ (tensors per rank: {counts}); tensor {first}{name}: "
                     f"{each}. Every worker must pass the same tensors, {hint}")
