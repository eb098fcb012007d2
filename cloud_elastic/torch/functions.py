"""Horovod names made of the existing collectives: ``allgather_object``, ``grouped_allgather``,
``grouped_reducescatter``, and the build queries ``ddl_built`` and ``ccl_built``.

Each gives Horovod's result. The grouped calls run one collective per tensor (Horovod fuses them),
so they cost that many round trips (``grouped_reducescatter`` one more, which checks all the tensors'
dtypes and shapes); as every collective here, each raises ``HorovodInternalError``
when a peer is lost, and takes ``process_set=`` as ``torch/collectives.py`` says.
"""

from __future__ import annotations

import ctypes
import pickle
from typing import Any, Sequence

import torch

from cloud_elastic.worker.comm.collectives import allgather
from cloud_elastic.worker.comm.compression import Compression
from cloud_elastic.worker.comm.ops import Average
from cloud_elastic.worker.comm.partitioned import reducescatter_each
from cloud_elastic.worker.unsupported import check_process_set

__all__ = ["allgather_object", "grouped_allgather", "grouped_reducescatter", "ddl_built", "ccl_built"]


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Every worker's ``obj``, in rank order (a list of ``hvd.size()`` objects, this worker's a copy too).

    Objects are pickled, as ``broadcast_object`` does (Horovod: cloudpickle): this trusts the round's
    members. Two allgathers, as Horovod's: the lengths, then the bytes.
    """
    what = name or type(obj).__name__
    payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64), name=f"{what}.sz").tolist()
    gathered = allgather(payload, name=f"{what}.t").contiguous()
    objects, start = [], 0
    for length in lengths:
        objects.append(pickle.loads(ctypes.string_at(gathered.data_ptr() + start, length)))  # no numpy needed
        start += length
    return objects


def _tensor_list(tensors: Any, call: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"hvd.{call}: expected a list of torch.Tensors, got {type(tensors).__name__}")
    return list(tensors)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: Any = None) -> list[torch.Tensor]:
    """``hvd.allgather`` of each tensor, in order (one collective each); the results carry no gradient."""
    check_process_set(process_set, "grouped_allgather")
    return [allgather(t, name) for t in _tensor_list(tensors, "grouped_allgather")]


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None, compression: Any = Compression.none,
                          op: str = Average, process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """``hvd.reducescatter`` of each tensor, in order (one collective each, after one allgather that checks them
    all: a mismatch in any is a ValueError on every worker); the results carry no gradient."""
    check_process_set(process_set, "grouped_reducescatter")
    return reducescatter_each(_tensor_list(tensors, "grouped_reducescatter"), name, compression, op,
                              prescale_factor, postscale_factor)


def ddl_built() -> bool:
    """False: cloud-elastic's collectives never run on IBM DDL (they run on Gloo or NCCL)."""
    return False


def ccl_built() -> bool:
    """False: cloud-elastic's collectives never run on oneCCL (they run on Gloo or NCCL)."""
    return False
