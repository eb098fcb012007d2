"""Which dtypes the collectives carry, and as what (:func:`carrier`).

Gloo carries bool, uint8, int8, int32, int64, float16, bfloat16, float32 and float64 in
every collective; int16, uint16, uint32, uint64 and the float8 types in none but
``send``/``recv`` ("Invalid scalar type"); complex numbers only in a broadcast and in an
allreduce by sum. Its refusal surfaces in the wait, not at the launch, where it looks like a
lost peer's failure: the round rolled back and re-formed, and failed alike, forever (and the
abandoned group took every later collective of the process with it). torch's NCCL dtype map
lacks the same integer types. So a tensor of another dtype travels as one Gloo and NCCL carry:

* in a reduction, int16 and uint16 as int32, uint32 as int64, cast back after: every value
  fits, a min or max is the same, and a sum or product cast back wraps modulo 2**16 (2**32)
  exactly as one computed in the narrow type does (Horovod reduces int16 natively);
* in a copy (broadcast, allgather, alltoall: values moved, never combined), as its bits, a
  view of the same width (uint8, float16, int32 or int64): no copy, no extra byte.

What neither covers (a min of complex numbers, a sum of uint64 or float8, an allgather of
complex128) is a one-line TypeError in the calling worker before anything is launched.
"""

from __future__ import annotations

import torch

__all__ = ["carrier", "to_wire", "from_wire"]

#: What Gloo (and NCCL) carry as they are, in every collective.
_NATIVE = frozenset({torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                     torch.float32, torch.float64})
#: What a reduction widens a dtype to (see the module's docstring for why the result is exact).
_WIDER = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64}
#: The carried dtype of each width, for a copy: Gloo and NCCL copy its bytes and never look at them.
_BITS = {1: torch.uint8, 2: torch.float16, 4: torch.int32, 8: torch.int64}


def carrier(dtype: torch.dtype, call: str, *, reduces: bool, complex_native: bool = False) -> torch.dtype:
    """The dtype a ``dtype`` tensor travels as in ``hvd.{call}``: ``dtype`` itself when carried as it is, a wider
    one in a reduction (``reduces``), one of its width in a copy; TypeError, in one line, when none can carry it.

    ``complex_native``: the collective carries complex numbers as they are (a broadcast; an allreduce by sum).
    """
    if dtype in _NATIVE or (dtype.is_complex and complex_native):
        return dtype
    if reduces and dtype in _WIDER:
        return _WIDER[dtype]
    if not reduces and dtype.itemsize in _BITS:
        return _BITS[dtype.itemsize]
    what = "reduce" if reduces else "carry"
    raise TypeError(f"hvd.{call}: cannot {what} a {dtype} tensor (neither Gloo nor NCCL carries it); cast it to one "
                    "of bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64"
                    + (" (complex numbers: only a sum or an average)" if dtype.is_complex and reduces else ""))


def to_wire(tensor: torch.Tensor, wire: torch.dtype) -> torch.Tensor:
    """``tensor`` as ``wire`` (from :func:`carrier`): itself, a view of its bits, or a wider copy."""
    if tensor.dtype == wire:
        return tensor
    return tensor.view(wire) if wire.itemsize == tensor.dtype.itemsize else tensor.to(wire)


def from_wire(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What :func:`to_wire` made of a ``dtype`` tensor (or received as such), as ``dtype`` again."""
    if tensor.dtype == dtype:
        return tensor
    return tensor.view(dtype) if dtype.itemsize == tensor.dtype.itemsize else tensor.to(dtype)
