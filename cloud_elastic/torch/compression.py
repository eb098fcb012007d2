"""Horovod's ``horovod.torch.compression``: ``from horovod.torch.compression import Compression`` ports by its
import alone."""

from __future__ import annotations

from cloud_elastic.worker.comm.compression import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
