"""Reduction ops with Horovod's names, and where an average divides.

``Average``, ``Sum``, ``Min``, ``Max`` and ``Product`` map to torch's
``ReduceOp`` (an average is a sum divided by the world size). ``Adasum``
exists so scripts that name it at module level import, but reducing with it
raises :class:`UnsupportedError`: cloud-elastic has no Adasum reduction.

Horovod's ops are integers; these are strings, so ``op == hvd.Average``
and passing them around work as in Horovod.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from cloud_elastic.worker.unsupported import UnsupportedError

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "UnsupportedError", "check_op", "reduce_op", "Scaling",
           "average_scaling", "scale_"]

Average = "average"
Sum = "sum"
Adasum = "adasum"
Min = "min"
Max = "max"
Product = "product"

_TORCH_OPS = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX,
              Product: dist.ReduceOp.PRODUCT}


def check_op(op: str | None, average: bool | None = None, allowed: tuple[str, ...] = tuple(_TORCH_OPS)) -> str:
    """The op a call means (Horovod's rules: ``op`` wins, else the deprecated ``average``, else Average).

    Raises UnsupportedError for Adasum and ValueError, in one line, for anything
    not in ``allowed``.
    """
    if op is None:
        op = Sum if average is False else Average
    elif average is not None:
        raise ValueError("pass either op= or the deprecated average=, not both")
    if op == Adasum:
        raise UnsupportedError("op=hvd.Adasum is not supported by cloud-elastic (no Adasum reduction): use "
                               "op=hvd.Average and scale the learning rate by hvd.size()")
    if op not in allowed:
        names = ", ".join(f"hvd.{name.capitalize()}" for name in allowed)
        raise ValueError(f"unknown reduction op {op!r}: use one of {names}")
    return op


def reduce_op(op: str) -> dist.ReduceOp:
    """torch's ReduceOp for a checked op (Average is a SUM followed by a division)."""
    return _TORCH_OPS[op]


@dataclass(frozen=True)
class Scaling:
    """What multiplies a tensor before its reduction, and what divides and multiplies it after.

    ``apply_before``/``apply_after`` skip factors of 1, so an unscaled reduction
    is bitwise what it was: a sum, then one ``div_`` by the divisor.
    """

    before: float = 1.0
    divide_after: float = 1.0
    after: float = 1.0

    def apply_before(self, tensor: torch.Tensor) -> None:
        """Multiply ``tensor`` in place by ``before`` (nothing when it is 1)."""
        if self.before != 1.0:
            scale_(tensor, self.before)

    def apply_after(self, tensor: torch.Tensor) -> None:
        """Divide ``tensor`` in place by ``divide_after``, then multiply it by ``after`` (skipping factors of 1)."""
        if self.divide_after != 1.0:
            tensor.div_(self.divide_after)  # an average: floating point only (``collectives.check_reducible``)
        if self.after != 1.0:
            scale_(tensor, self.after)


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """``tensor *= factor`` in place, an integer tensor as Horovod scales it (its C++ ``ScaleBuffer``).

    There the product is a double, stored back into the integer type (rounded toward zero, as a C++
    conversion does); torch's ``mul_`` would refuse a float factor on an integer tensor.
    """
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:
        tensor.copy_(tensor.double().mul_(factor))  # a float-to-integer copy_ truncates toward zero


def average_scaling(op: str, size: int, compressed: bool, predivide: float | None = None, prescale: float = 1.0,
                    postscale: float = 1.0) -> Scaling:
    """Where the division of an average happens, and the caller's own pre/post factors.

    * not compressed: the sum, then ``/ size`` (Horovod's and DDP's order);
    * compressed (sent as 16-bit floats) without ``predivide``: ``/ size`` before
      the sum, as DDP's fp16 compression hook does, so the sum cannot exceed the
      largest value sent (fp16 overflows past 65504);
    * ``predivide`` (``gradient_predivide_factor``) ``f``: ``/ f`` before the
      sum and ``* f / size`` after, as Horovod splits it.

    Other ops are never divided; ``prescale``/``postscale`` always apply.
    """
    if op != Average or size <= 1:
        return Scaling(before=prescale, after=postscale)
    if predivide is not None and predivide != 1.0:
        return Scaling(before=prescale / predivide, divide_after=size / predivide, after=postscale)
    if compressed and predivide is None:
        return Scaling(before=prescale / size, after=postscale)
    return Scaling(before=prescale, divide_after=float(size), after=postscale)
