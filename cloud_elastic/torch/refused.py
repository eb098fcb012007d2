"""Horovod's public names that cannot apply to a cloud-elastic job: they exist, so a script that names
them at module level imports, and calling one raises :class:`UnsupportedError` in one line saying
what to use instead (docs/porting.md, "Name by name").

``global_process_set`` is the one process set there is, the whole job; making another
(``ProcessSet(ranks)``, ``add_process_set``) is refused. The collectives take it as ``process_set=``
(``torch/collectives.py``).
"""

from __future__ import annotations

from typing import Any, Callable

from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.unsupported import NO_PROCESS_SETS as _SETS, UnsupportedError

__all__ = ["allreduce_async", "allreduce_async_", "grouped_allreduce_async", "grouped_allreduce_async_",
           "sparse_allreduce_async", "allgather_async", "grouped_allgather_async", "broadcast_async",
           "broadcast_async_", "alltoall_async", "reducescatter_async", "grouped_reducescatter_async", "poll",
           "synchronize", "start_timeline", "stop_timeline", "ProcessSet", "global_process_set", "add_process_set",
           "remove_process_set"]

_ASYNC = "no asynchronous handles"


def _refused(name: str, why: str, instead: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        del args, kwargs
        raise UnsupportedError(f"hvd.{name} is not supported by cloud-elastic ({why}): {instead}")

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Not supported: raises UnsupportedError ({why}): {instead}."
    return refused


def _async(name: str) -> Callable[..., Any]:
    plain = name.replace("_async", "")
    return _refused(name, _ASYNC, f"call hvd.{plain}, which returns its result")


allreduce_async = _async("allreduce_async")
allreduce_async_ = _async("allreduce_async_")
grouped_allreduce_async = _async("grouped_allreduce_async")
grouped_allreduce_async_ = _async("grouped_allreduce_async_")
allgather_async = _async("allgather_async")
grouped_allgather_async = _async("grouped_allgather_async")
broadcast_async = _async("broadcast_async")
broadcast_async_ = _async("broadcast_async_")
alltoall_async = _async("alltoall_async")
reducescatter_async = _async("reducescatter_async")
grouped_reducescatter_async = _async("grouped_reducescatter_async")
sparse_allreduce_async = _refused("sparse_allreduce_async", "no sparse allreduce",
                                  "call hvd.allreduce on tensor.to_dense()")
poll = _refused("poll", _ASYNC, "the collectives without _async return their results")
synchronize = _refused("synchronize", _ASYNC, "the collectives without _async return their results")
start_timeline = _refused("start_timeline", "no timeline", "profile with torch.profiler")
stop_timeline = _refused("stop_timeline", "no timeline", "profile with torch.profiler")
add_process_set = _refused("add_process_set", _SETS, "leave process_set out")
remove_process_set = _refused("remove_process_set", _SETS, "leave process_set out")


class ProcessSet:
    """Not supported: constructing one raises UnsupportedError. ``global_process_set`` is the whole job."""

    process_set_id: int | None = None

    def __init__(self, ranks_or_comm: Any = None) -> None:
        del ranks_or_comm
        raise UnsupportedError(f"hvd.ProcessSet is not supported by cloud-elastic ({_SETS}): leave process_set out")


class _WholeJob(ProcessSet):
    """``hvd.global_process_set``: every worker of the current round, as Horovod's."""

    process_set_id = 0

    def __init__(self) -> None:  # noqa: D107 - the one set there is; ProcessSet's refusal does not apply
        pass

    @property
    def ranks(self) -> list[int]:
        return list(range(get_context().info.size))

    def size(self) -> int:
        return get_context().info.size

    def rank(self) -> int:
        return get_context().info.rank

    def included(self) -> bool:
        get_context()  # raises before init(), as the other two
        return True

    def __str__(self) -> str:
        return "ProcessSet(process_set_id=0, ranks=<every worker of the round>)"


global_process_set: ProcessSet = _WholeJob()
