"""The worker's collectives as ``hvd`` names them, each taking Horovod's ``process_set=``.

Horovod scripts pass ``process_set=hvd.global_process_set`` explicitly. The one set there is, the whole
job, is accepted (so is None, Horovod's own global set, and the argument in Horovod's position); any
other set raises ``UnsupportedError`` in one line (:func:`~cloud_elastic.worker.unsupported.check_process_set`).
Everything else is the worker's function (``worker/comm/collectives.py``, ``worker/comm/partitioned.py``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

from cloud_elastic.worker.comm import collectives as _worker, partitioned as _partitioned
from cloud_elastic.worker.unsupported import check_process_set

__all__ = ["takes_process_set", "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather",
           "broadcast", "broadcast_", "broadcast_object", "barrier", "alltoall", "reducescatter"]

F = TypeVar("F", bound=Callable[..., Any])


def takes_process_set(fn: F, position: int) -> F:
    """``fn`` with Horovod's ``process_set`` parameter, the ``position``-th of Horovod's signature (0-based;
    ``fn``'s parameters before it are Horovod's, in its order), checked and not passed on."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    where = min(position, sum(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in params))
    params.insert(where, inspect.Parameter("process_set", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None))

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > position:
            process_set, args = args[position], args[:position] + args[position + 1:]
        else:
            process_set = kwargs.pop("process_set", None)
        check_process_set(process_set, fn.__name__)
        return fn(*args, **kwargs)

    call.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    # Found by pickle (Spark's cloudpickle, a partial sent to a pool) under this module's name, where it lives:
    # wraps() copied the worker function's module, whose same-named function is not this one.
    call.__module__ = __name__
    return call  # type: ignore[return-value]


# Positions of process_set in Horovod 0.28.1's horovod.torch signatures.
allreduce = takes_process_set(_worker.allreduce, 7)
allreduce_ = takes_process_set(_worker.allreduce_, 6)
grouped_allreduce = takes_process_set(_worker.grouped_allreduce, 7)
grouped_allreduce_ = takes_process_set(_worker.grouped_allreduce_, 6)
allgather = takes_process_set(_worker.allgather, 2)
broadcast = takes_process_set(_worker.broadcast, 3)
broadcast_ = takes_process_set(_worker.broadcast_, 3)
broadcast_object = takes_process_set(_worker.broadcast_object, 3)
barrier = takes_process_set(_worker.barrier, 0)
alltoall = takes_process_set(_partitioned.alltoall, 3)
reducescatter = takes_process_set(_partitioned.reducescatter, 4)
