"""Gradient compression with Horovod's interface: ``hvd.Compression.none``, ``.fp16`` and ``.bf16``.

A compressor is a class with ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``, as in Horovod; ``hvd.allreduce`` and
``DistributedOptimizer`` accept any such class. The two casting ones send
floating-point tensors wider than 16 bits as 16-bit floats (half the bytes
of float32) and give results back in the original dtype:

* ``fp16`` keeps 11 significant bits but overflows past 65504;
* ``bf16`` (which Horovod lacks) keeps float32's range with 8 significant bits.

Tensors that are not floating point, or already 16-bit, are sent as they are
(Horovod's fp16 would also cast bfloat16 to float16, losing range for no bytes).
``DistributedOptimizer`` recognises the casting ones by ``wire_dtype`` and
casts each bucket into a buffer it reuses instead of calling ``compress``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression", "check_compression",
           "casts", "cast_into", "Encoded", "encode"]


class Compressor:
    """Horovod's compressor interface: ``compress`` returns the tensor to send and what ``decompress`` needs."""

    #: The dtype a casting compressor sends floating-point tensors as (None: not a cast).
    wire_dtype: torch.dtype | None = None

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return the tensor to send and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Return the received tensor as the caller's."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default): tensors are sent as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _CastCompressor(Compressor):
    """Send floating-point tensors wider than ``wire_dtype`` as ``wire_dtype``; give them back in their dtype."""

    wire_dtype: torch.dtype

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if casts(cls, tensor.dtype):
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Send floating-point tensors as float16 (half the bytes of float32; overflows past 65504)."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Send floating-point tensors as bfloat16 (half the bytes of float32, its range, 8 significant bits)."""

    wire_dtype = torch.bfloat16


class Compression:
    """The compressors, by Horovod's names (``bf16`` is cloud-elastic's own)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def casts(compression: Any, dtype: torch.dtype) -> bool:
    """Whether ``compression`` is a cast that makes ``dtype`` smaller on the wire."""
    wire = getattr(compression, "wire_dtype", None)
    return (wire is not None and dtype.is_floating_point and not dtype.is_complex
            and torch.finfo(dtype).bits > torch.finfo(wire).bits)


def check_compression(compression: Any) -> Any:
    """``compression`` itself, or NoneCompressor for None; a one-line TypeError for anything else."""
    if compression is None:
        return NoneCompressor
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"compression={compression!r}: use hvd.Compression.none, .fp16 or .bf16, or a class with "
                        "Horovod's compress()/decompress() methods")
    return compression


def cast_into(dst: torch.Tensor, src: torch.Tensor, factor: float = 1.0) -> None:
    """``dst = src * factor`` in one pass; computed in ``src``'s precision, rounded once to ``dst``'s dtype.

    An integer ``src`` is scaled as Horovod scales it: the product in double precision, stored back rounded
    toward zero (``ops.scale_``; torch's ``mul`` would refuse a float factor into an integer ``dst``).
    """
    if factor == 1.0:
        dst.copy_(src)
    elif src.is_floating_point() or src.is_complex():
        torch.mul(src, factor, out=dst)
    else:
        dst.copy_(src.double().mul_(factor))  # a float-to-integer copy_ truncates toward zero


#: ``Encoded.ctx`` of a tensor a casting compressor sent: ``decode`` casts it back.
_CAST = object()


@dataclass
class Encoded:
    """A tensor made ready to send: scaled, compressed, in memory of its own (never the caller's)."""

    tensor: torch.Tensor
    compression: Any
    ctx: Any
    dtype: torch.dtype

    def decode(self, received: torch.Tensor | None = None) -> torch.Tensor:
        """The reduced tensor (``received``, default: ``tensor`` reduced in place) in the caller's dtype."""
        received = self.tensor if received is None else received
        if self.ctx is _CAST:
            return received.to(self.dtype)
        return self.compression.decompress(received, self.ctx)


def encode(tensor: torch.Tensor, compression: Any, factor: float, device: torch.device) -> Encoded:
    """A contiguous copy of ``tensor`` on ``device``, multiplied by ``factor``, then compressed.

    A casting compressor's cast is done with the multiplication, in the
    tensor's own precision (one rounding, no float32 temporary); any other
    compressor's ``compress`` gets the scaled copy.
    """
    src = tensor.detach()
    if casts(compression, src.dtype):
        sent = torch.empty(src.shape, dtype=compression.wire_dtype, device=device)
        cast_into(sent, src, factor)
        return Encoded(sent, compression, _CAST, src.dtype)
    copy = torch.empty(src.shape, dtype=src.dtype, device=device)
    cast_into(copy, src, factor)
    sent, ctx = compression.compress(copy)
    return Encoded(sent.contiguous(), compression, ctx, src.dtype)
