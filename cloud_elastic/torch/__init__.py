"""The worker API, with Horovod's names: ``import cloud_elastic.torch as hvd``.

A Horovod elastic script ports by changing its imports::

    import cloud_elastic.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    @hvd.elastic.run
    def train(state):
        ...
        state.commit()

    train(hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0))

Run as a plain ``python`` script (not under ``cloud-elastic run``), it works
as a single process: rank 0 of 1. What is the same as Horovod and what
differs, name by name: docs/porting.md. Every public name of ``horovod.torch``
exists here; those that cannot apply to an elastic job raise ``UnsupportedError``
when called (``torch/refused.py``).
"""

from __future__ import annotations

from typing import Any

from cloud_elastic.torch import elastic
from cloud_elastic.torch.functions import allgather_object, ccl_built, ddl_built, grouped_allgather, grouped_reducescatter
from cloud_elastic.torch.refused import (
    ProcessSet,
    add_process_set,
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_async,
    broadcast_async_,
    global_process_set,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    poll,
    reducescatter_async,
    remove_process_set,
    sparse_allreduce_async,
    start_timeline,
    stop_timeline,
    synchronize,
)
from cloud_elastic.worker.comm.builds import (
    cuda_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from cloud_elastic.torch.collectives import (
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    broadcast_object,
    grouped_allreduce,
    grouped_allreduce_,
    reducescatter,
)
from cloud_elastic.worker.comm.collectives import broadcast_optimizer_state, broadcast_parameters, join
from cloud_elastic.worker.comm.compression import Compression, Compressor
from cloud_elastic.worker.context import current as _current_context, get_context, is_initialized, slot_before_joining
from cloud_elastic.worker.context import init as _init
from cloud_elastic.worker.exceptions import (
    CollectiveError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    WorkerRemoved,
)
from cloud_elastic.worker.comm.ops import Adasum, Average, Max, Min, Product, Sum, UnsupportedError
from cloud_elastic.worker.optim.optimizer import DistributedOptimizer
from cloud_elastic.worker.sharded import shard
from cloud_elastic.worker.comm.statecodec import StateSyncError
from cloud_elastic.worker.comm.sync_batchnorm import SyncBatchNorm

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather", "broadcast",
    "broadcast_", "broadcast_object", "broadcast_parameters", "broadcast_optimizer_state", "reducescatter", "alltoall",
    "barrier", "join", "DistributedOptimizer", "shard", "SyncBatchNorm", "Compression", "Compressor", "elastic",
    "HostsUpdatedInterrupt", "HorovodInternalError", "CollectiveError", "WorkerRemoved", "StateSyncError",
    "UnsupportedError", "Average", "Sum", "Adasum", "Min", "Max", "Product", "nccl_built", "gloo_built", "mpi_built",
    "cuda_built", "rocm_built", "gloo_enabled", "mpi_enabled", "mpi_threads_supported", "ddl_built", "ccl_built",
    "allgather_object", "grouped_allgather", "grouped_reducescatter", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "allreduce_async", "allreduce_async_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "sparse_allreduce_async", "allgather_async", "grouped_allgather_async",
    "broadcast_async", "broadcast_async_", "alltoall_async", "reducescatter_async", "grouped_reducescatter_async",
    "poll", "synchronize", "start_timeline", "stop_timeline",
]


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Connect to the driver and join the first round (idempotent); after ``shutdown()``, serve again.

    ``comm`` (an MPI communicator or a list of ranks) and ``process_sets`` are Horovod's; anything but
    None raises UnsupportedError: every worker of the job takes part, in one set. A worker started while the job is already training (a newcomer, a spare, a replacement) connects and
    checks its device here, but joins at its first call that needs the round (``rank()``, ``size()``, a
    collective, ``elastic.run``, ``shard``): the script's set-up before that call runs while the job trains
    on, instead of stopping it. ``local_rank()`` (the GPU) is known before.
    """
    if comm is not None or process_sets is not None:
        given = "comm" if comm is not None else "process_sets"
        raise UnsupportedError(f"hvd.init({given}=...) is not supported by cloud-elastic (no MPI communicators, no "
                               "process sets: every worker of the job takes part): call hvd.init()")
    try:
        _init()
    except WorkerRemoved as exc:
        import sys

        print(f"cloud-elastic: leaving the job: {exc}", file=sys.stderr, flush=True)
        sys.exit(0)


def shutdown() -> None:
    """As Horovod's: ``is_initialized()`` is then False, and every call that needs the job (``rank()``, a
    collective, ``elastic.run``) raises ValueError until ``init()`` again, which serves with the same
    registration and round.

    Heartbeats go on until the process exits, so a worker that works on after ``shutdown()`` (an evaluation,
    an upload) is not given up as silent by the driver. A worker that has not joined its first round yet does
    not join one for this.
    """
    ctx = _current_context()
    if ctx is not None:
        ctx.shut_down = True


def rank() -> int:
    """This worker's rank in the current round (0 is the oldest worker)."""
    return get_context().info.rank


def size() -> int:
    """Number of workers in the current round."""
    return get_context().info.size


def local_rank() -> int:
    """This worker's slot on its host, i.e. its GPU: fixed from its first round to its exit.

    No two live workers of a host share one, so ``torch.cuda.set_device(hvd.local_rank())``
    stays right across failures; after one, a host's local ranks may have a gap. Known before the
    worker joins its first round, so asking for it does not make the worker join (see ``init``).
    """
    slot = slot_before_joining() if is_initialized() else None  # after shutdown(): get_context's ValueError
    return slot if slot is not None else get_context().info.local_rank


def local_size() -> int:
    """One more than the highest local rank on this host in the current round (so ``local_rank() < local_size()``).

    It is the number of this host's workers whenever its slots are filled from 0 up.
    """
    return get_context().info.local_size


def cross_rank() -> int:
    """Position of this host among the hosts with a worker of the same local rank (in rank order)."""
    return get_context().info.cross_rank


def cross_size() -> int:
    """Number of hosts with a worker of this local rank."""
    return get_context().info.cross_size
