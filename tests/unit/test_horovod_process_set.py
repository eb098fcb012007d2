"""``process_set=``: Horovod scripts pass ``hvd.global_process_set`` explicitly; every call that takes it in
Horovod 0.28.1 takes it here (by keyword or in Horovod's position) and gives the same result; any other set
is refused in one line. One worker (a plain ``python`` script)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

import cloud_elastic.torch as hvd

pytestmark = pytest.mark.timeout(60)

T = torch.tensor([1.0, 2.0, 3.0, 4.0])

#: Every horovod.torch call of 0.28.1 that takes process_set (the *_async ones, refused here, aside): its
#: position in Horovod's signature, and a call with it.
CALLS = {
    "allreduce": (7, lambda ps: hvd.allreduce(T, op=hvd.Sum, process_set=ps)),
    "allreduce_": (6, lambda ps: hvd.allreduce_(T.clone(), op=hvd.Sum, process_set=ps)),
    "grouped_allreduce": (7, lambda ps: hvd.grouped_allreduce([T], op=hvd.Sum, process_set=ps)[0]),
    "grouped_allreduce_": (6, lambda ps: hvd.grouped_allreduce_([T.clone()], op=hvd.Sum, process_set=ps)[0]),
    "allgather": (2, lambda ps: hvd.allgather(T, process_set=ps)),
    "grouped_allgather": (2, lambda ps: hvd.grouped_allgather([T], process_set=ps)[0]),
    "broadcast": (3, lambda ps: hvd.broadcast(T, 0, process_set=ps)),
    "broadcast_": (3, lambda ps: hvd.broadcast_(T.clone(), 0, process_set=ps)),
    "alltoall": (3, lambda ps: hvd.alltoall(T, process_set=ps)),
    "reducescatter": (4, lambda ps: hvd.reducescatter(T, op=hvd.Sum, process_set=ps)),
    "grouped_reducescatter": (4, lambda ps: hvd.grouped_reducescatter([T], op=hvd.Sum, process_set=ps)[0]),
    "barrier": (0, lambda ps: hvd.barrier(process_set=ps) or T),
    "broadcast_object": (3, lambda ps: torch.tensor(hvd.broadcast_object([1.0, 2.0, 3.0, 4.0], 0, process_set=ps))),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_global_process_set_is_accepted_where_horovod_takes_it_and_changes_nothing(name):
    hvd.init()
    position, call = CALLS[name]
    for process_set in (hvd.global_process_set, None):
        assert torch.equal(call(process_set), T), (name, process_set)
    assert list(inspect.signature(getattr(hvd, name)).parameters).index("process_set") == position


@pytest.mark.parametrize("name", sorted(CALLS))
def test_any_other_process_set_is_refused_in_one_line(name):
    hvd.init()
    for other in (SimpleNamespace(process_set_id=1), [0, 1]):
        with pytest.raises(hvd.UnsupportedError) as exc:
            CALLS[name][1](other)
        assert str(exc.value) == (f"hvd.{name}(process_set=...) is not supported by cloud-elastic for any set but "
                                  "hvd.global_process_set (no process sets: every collective spans the whole job): "
                                  "leave process_set out")


def test_process_set_in_horovods_position_is_read_as_the_process_set():
    hvd.init()
    # reducescatter(tensor, name, compression, op, process_set, prescale_factor, postscale_factor)
    assert torch.equal(hvd.reducescatter(T, None, hvd.Compression.none, hvd.Sum, hvd.global_process_set, 2.0), T * 2)
    assert torch.equal(hvd.allgather(T, "x", hvd.global_process_set), T)
    with pytest.raises(hvd.UnsupportedError, match=r"^hvd\.broadcast\(process_set=\.\.\.\)"):
        hvd.broadcast(T, 0, "x", [0])


def test_distributed_optimizer_takes_the_global_process_set_only():
    hvd.init()

    def sgd() -> torch.optim.Optimizer:
        return torch.optim.SGD([torch.nn.Parameter(T.clone())], lr=0.1)

    for process_set in (hvd.global_process_set, None):
        optimizer = hvd.DistributedOptimizer(sgd(), process_set=process_set)
        param = optimizer.param_groups[0]["params"][0]
        param.grad = torch.ones(4)
        optimizer.step()
        assert torch.allclose(param.detach(), T - 0.1)
    with pytest.raises(hvd.UnsupportedError, match=r"^hvd\.DistributedOptimizer\(process_set=\.\.\.\) is not "):
        hvd.DistributedOptimizer(sgd(), process_set=SimpleNamespace(process_set_id=2))


def test_every_wrapped_collective_pickles_by_name_as_itself():
    # A partial of hvd.allreduce sent to a process pool, or Spark's cloudpickle of a training function using it:
    # each name must pickle by reference to the very function hvd exports (wraps() had pointed pickle elsewhere).
    import functools
    import pickle

    import cloud_elastic.torch as hvd
    from cloud_elastic.torch import collectives

    for name in (n for n in collectives.__all__ if n != "takes_process_set"):
        fn = getattr(hvd, name)
        assert pickle.loads(pickle.dumps(fn)) is fn, name
        assert pickle.loads(pickle.dumps(functools.partial(fn))).func is fn, name
