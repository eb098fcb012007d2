"""Every public name of ``horovod.torch`` exists on ``cloud_elastic.torch``: made of the existing collectives
where that gives Horovod's result, else refused at the call in one line (docs/porting.md, "Name by name");
and ``hvd.shutdown()`` un-initializes as Horovod's does. Across workers: tests/integration/test_horovod_shutdown.py.
"""

from __future__ import annotations

import pytest
import torch

import cloud_elastic.torch as hvd

pytestmark = pytest.mark.timeout(60)

#: ``horovod/torch/__init__.py`` of Horovod 0.28.1 (commit 2626dc87a3a8eb8fb7d2216198ce45bce0f9e65a): every
#: name it imports from its own modules (the names a script reaches as ``hvd.<name>``).
HOROVOD_TORCH = [
    "elastic", "Compression", "allgather_object", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_async",
    "broadcast_", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize", "init",
    "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size", "cross_size", "rank",
    "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "HorovodInternalError", "DistributedOptimizer", "SyncBatchNorm",
]
#: ``horovod/torch/elastic/__init__.py`` of the same commit: its ``__all__``.
HOROVOD_TORCH_ELASTIC = ["TorchState", "ElasticSampler", "run"]

#: The names refused at the call, each with what it is called with in Horovod.
REFUSED = {
    "allreduce_async": (torch.ones(1),), "allreduce_async_": (torch.ones(1),),
    "grouped_allreduce_async": ([torch.ones(1)],), "grouped_allreduce_async_": ([torch.ones(1)],),
    "sparse_allreduce_async": (torch.ones(1), "g", hvd.Average), "allgather_async": (torch.ones(1),),
    "grouped_allgather_async": ([torch.ones(1)],), "broadcast_async": (torch.ones(1), 0),
    "broadcast_async_": (torch.ones(1), 0), "alltoall_async": (torch.ones(2),),
    "reducescatter_async": (torch.ones(2),), "grouped_reducescatter_async": ([torch.ones(2)],),
    "poll": (object(),), "synchronize": (object(),), "start_timeline": ("/tmp/timeline.json",),
    "stop_timeline": (), "ProcessSet": ([0, 1],), "add_process_set": ([0, 1],), "remove_process_set": (object(),),
}


def test_every_public_name_of_horovod_torch_exists_and_is_exported():
    assert [n for n in HOROVOD_TORCH if not hasattr(hvd, n)] == []
    assert [n for n in HOROVOD_TORCH if n not in hvd.__all__] == []
    assert [n for n in HOROVOD_TORCH_ELASTIC if not hasattr(hvd.elastic, n)] == []


def test_horovods_submodules_port_by_their_import_alone():
    """Review h6 (2026-12-01): ``from horovod.torch.mpi_ops import Sum`` (or ``.optimizer``, ``.compression``,
    ``.sync_batch_norm``) had no counterpart, so such a script did not port by changing ``horovod`` to
    ``cloud_elastic``."""
    from cloud_elastic.torch import compression, mpi_ops, optimizer, sync_batch_norm

    assert [n for n in HOROVOD_TORCH if getattr(mpi_ops, n, None) is not getattr(hvd, n)] == []
    assert optimizer.DistributedOptimizer is hvd.DistributedOptimizer
    assert compression.Compression is hvd.Compression and compression.Compressor is hvd.Compressor
    assert compression.FP16Compressor.compress(torch.ones(2))[0].dtype == torch.float16
    assert sync_batch_norm.SyncBatchNorm is hvd.SyncBatchNorm


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_name_that_cannot_apply_raises_unsupported_error_in_one_line_naming_it(name):
    with pytest.raises(hvd.UnsupportedError) as exc:
        getattr(hvd, name)(*REFUSED[name])
    text = str(exc.value)
    assert "\n" not in text and f"hvd.{name} is not supported by cloud-elastic" in text, text
    assert isinstance(exc.value, NotImplementedError)


def test_init_refuses_an_mpi_communicator_or_process_sets_in_one_line():
    for kwargs in ({"comm": [0, 1]}, {"process_sets": [object()]}, {"process_sets": "dynamic"}):
        with pytest.raises(hvd.UnsupportedError, match=r"^hvd\.init\((comm|process_sets)=\.\.\.\) is not supported"):
            hvd.init(**kwargs)


def test_allgather_object_and_the_grouped_calls_give_horovods_results_for_one_worker():
    hvd.init()
    assert hvd.allgather_object({"rank": hvd.rank(), "loss": 0.5}) == [{"rank": 0, "loss": 0.5}]
    a, b = torch.arange(6.0).reshape(3, 2), torch.tensor([7, 8])
    gathered = hvd.grouped_allgather([a, b])
    assert len(gathered) == 2 and torch.equal(gathered[0], a) and torch.equal(gathered[1], b)
    scattered = hvd.grouped_reducescatter([a, a * 2], op=hvd.Sum)
    assert torch.equal(scattered[0], a) and torch.equal(scattered[1], a * 2)
    with pytest.raises(TypeError, match="^hvd.grouped_allgather: expected a list of torch.Tensors, got Tensor$"):
        hvd.grouped_allgather(a)  # one tensor would be gathered row by row
    assert hvd.ddl_built() is False and hvd.ccl_built() is False


def test_the_global_process_set_is_the_whole_job():
    hvd.init()
    ps = hvd.global_process_set
    assert isinstance(ps, hvd.ProcessSet) and ps.process_set_id == 0
    assert (ps.size(), ps.rank(), ps.included(), ps.ranks) == (hvd.size(), hvd.rank(), True, list(range(hvd.size())))


def test_shutdown_un_initializes_until_init_again():
    hvd.init()
    hvd.shutdown()
    try:
        assert hvd.is_initialized() is False
        for call in (hvd.rank, hvd.local_rank, hvd.size, lambda: hvd.allreduce(torch.ones(1)),
                     lambda: hvd.allgather_object(1), hvd.barrier):
            with pytest.raises(ValueError) as exc:
                call()
            assert str(exc.value) == ("cloud_elastic.torch was shut down (hvd.shutdown()); call hvd.init() to use "
                                      "it again")
    finally:
        hvd.init()  # Horovod allows it; the other tests of this process need it too
    assert hvd.is_initialized() is True
    assert hvd.allreduce(torch.ones(1)).item() == 1.0 and hvd.rank() == 0
