"""``hvd.shard`` without processes: the host key the driver hands out, the one-line refusals, a standalone
worker's commits and restores of FSDP2 shards, and how a failed collective inside FSDP2 is told apart.

Standalone mode (rank 0 of 1, one host of one worker) runs the same commit and restore code as a
distributed worker; the multi-host behaviour is ``tests/integration/test_sharded.py``. The host's
group is torch's default process group: formed once in this process by the first ``shard``.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.actions import Launch
from cloud_elastic.driver.runtime.driver import Driver
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.static import StaticHosts
from cloud_elastic.worker import sharded
from cloud_elastic.worker.context import get_context

pytestmark = pytest.mark.timeout(90)


def _key(driver: Driver, host: str, slot: int) -> str | None:
    return driver._processes.spec(Launch(Slot(host, slot), f"{host}[{slot}]")).env.get("CLOUD_ELASTIC_HOST_KEY")


def test_the_workers_launched_on_a_host_together_share_its_key_and_its_next_incarnation_gets_another():
    config = JobConfig(command=("python", "train.py"), num_proc=4, min_np=2, max_np=4, whole_host_slots=2)
    driver = Driver(config, StaticHosts({"127.0.0.1": 2, "127.0.0.2": 2}), job_id="j1")
    plain = Driver(dataclasses.replace(config, whole_host_slots=0), StaticHosts({"127.0.0.1": 2}), job_id="j2")
    for d in (driver, plain):
        d._endpoints.start("127.0.0.1", advertised="127.0.0.1")
    try:
        first = {_key(driver, "127.0.0.1", 0), _key(driver, "127.0.0.1", 1)}
        other = {_key(driver, "127.0.0.2", 0), _key(driver, "127.0.0.2", 1)}
        again = {_key(driver, "127.0.0.1", 1), _key(driver, "127.0.0.1", 0)}  # the host came back
        assert len(first) == len(other) == len(again) == 1
        assert len(first | other | again) == 3
        assert _key(plain, "127.0.0.1", 0) is None
    finally:
        for d in (driver, plain):
            d._endpoints.close()


def test_shard_without_whole_hosts_is_a_one_line_error():
    ctx = SimpleNamespace(standalone=False, settings=SimpleNamespace(host_key=""), info=None)
    with pytest.raises(ConfigError, match=r"^hvd.shard needs whole hosts: run the job with cloud-elastic run "
                                          r"--whole-hosts --slots-per-host N$"):
        sharded._form_host_group(ctx)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return hvd.shard(model, modules=[model[0], model[2]])


def _step(model, opt, seed: int) -> None:
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()


def _values(model, opt) -> list[torch.Tensor]:
    out = [p.to_local().clone() for p in model.parameters()]
    for p in model.parameters():
        out += [sharded.local(v).clone() for _, v in sorted(opt.state[p].items())]
    return out


@pytest.mark.commit_mode("snapshot")
def test_a_sharded_models_kept_commit_restores_exactly_and_training_goes_on_as_if_the_lost_steps_never_ran():
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1))
    state = hvd.elastic.TorchState(model, opt, step=0)
    assert all(getattr(h, "sharded", False) for h in state._handlers.values())
    for seed in range(3):
        _step(model, opt, seed)
        state.commit()
    committed = _values(model, opt)
    _step(model, opt, 90)
    _step(model, opt, 91)  # two steps past the commit, then a peer is lost
    state.restore()
    after = _values(model, opt)
    assert len(after) == len(committed) and all(torch.equal(a, b) for a, b in zip(after, committed))
    assert type(opt.state[next(model.parameters())]["exp_avg"]).__name__ == "DTensor"
    _step(model, opt, 3)

    reference = _model()
    ref_opt = hvd.DistributedOptimizer(torch.optim.AdamW(reference.parameters(), lr=0.01, weight_decay=0.1))
    for seed in range(4):
        _step(reference, ref_opt, seed)
    assert all(torch.equal(a, b) for a, b in zip(_values(model, opt), _values(reference, ref_opt)))


def test_in_the_common_loop_a_sharded_commit_keeps_no_copy_and_restores_exactly_before_the_update():
    """Commit right after each step: the shards are the commit (nothing copied); a failure before the update
    (in the gradient allreduce) restores exactly, one after it is said, not hidden."""
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1))
    state = hvd.elastic.TorchState(model, opt, step=0)
    for seed in range(3):
        _step(model, opt, seed)
        state.commit()
    assert all(h.in_place for h in state._handlers.values() if getattr(h, "sharded", False))
    kept = sum(t.numel() for t in state._handlers["model"]._snap._value.values())
    assert kept == 0  # an MLP has no buffers: nothing of the model is copied
    committed = _values(model, opt)
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(9))
    opt.zero_grad()
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()  # then the gradient allreduce fails
    state.restore()
    assert get_context().ledger.holds_commit
    after = _values(model, opt)
    assert all(torch.equal(a, b) for a, b in zip(after, committed))
    _step(model, opt, 10)  # an update in place, then a collective before the commit fails
    state.restore()
    assert not get_context().ledger.holds_commit


@pytest.mark.commit_mode("snapshot")
def test_a_commit_made_before_the_first_step_restores_an_empty_optimizer_state():
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01))
    state = hvd.elastic.TorchState(model, opt)
    _step(model, opt, 0)
    state.restore()
    assert not opt.state_dict()["state"]


def test_a_distributed_optimizer_over_shards_refuses_what_it_cannot_do():
    hvd.init()
    model = _model()
    with pytest.raises(ValueError, match="over a sharded model, DistributedOptimizer averages uncompressed"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compression=hvd.Compression.fp16)
    ctx = get_context()
    host_group, ctx.host_group = ctx.host_group, None
    try:
        with pytest.raises(ValueError, match=r"needs the model sharded with hvd.shard\(model\) first"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    finally:
        ctx.host_group = host_group


def _sharded_worker(aborted_after_s: float | None) -> SimpleNamespace:
    start = time.monotonic()
    ctx = SimpleNamespace(host_group=object(), standalone=False, info=SimpleNamespace(round=3),
                          heartbeat_timeout_s=0.2, abandoned=0)
    ctx._aborted = lambda round_: aborted_after_s is not None and time.monotonic() - start >= aborted_after_s
    ctx._abandon_round = lambda: setattr(ctx, "abandoned", ctx.abandoned + 1)
    return ctx


def test_an_error_inside_fsdp2_is_a_lost_peer_only_when_the_driver_aborts_the_round():
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:23244")
    ctx = _sharded_worker(aborted_after_s=0.1)  # the abort arrives just after the socket closed
    assert sharded.peer_lost(ctx, closed) and ctx.abandoned == 1
    ctx = _sharded_worker(aborted_after_s=None)  # the script's own error: raised after two heartbeat timeouts
    started = time.monotonic()
    assert not sharded.peer_lost(ctx, closed)
    assert 0.35 < time.monotonic() - started < 5 and ctx.abandoned == 0
    assert not sharded.peer_lost(_sharded_worker(aborted_after_s=0.0), ValueError("a shape mismatch"))
    # The script's own RuntimeError that reads as nothing of communication is raised at once, even while the
    # driver aborts the round: it is no lost peer, and waiting would only hide it for two heartbeat timeouts.
    own = RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x6 and 5x16)")
    assert not sharded.peer_lost(_sharded_worker(aborted_after_s=0.0), own)
    patient = _sharded_worker(aborted_after_s=None)
    patient.heartbeat_timeout_s = 60.0  # a wait for the abort would take two minutes
    started = time.monotonic()
    assert not sharded.peer_lost(patient, own) and time.monotonic() - started < 30
    import torch.distributed as dist  # torch's own type for a backend's failure counts whatever its words
    assert sharded.peer_lost(_sharded_worker(aborted_after_s=0.0), dist.DistBackendError("failed"))
    unsharded = _sharded_worker(aborted_after_s=0.0)
    unsharded.host_group = None
    assert not sharded.peer_lost(unsharded, closed)


def test_gradient_shards_are_averaged_over_the_hosts_big_ones_in_place_small_ones_packed_a_few_buckets_at_a_time(
        monkeypatch):
    """Two "hosts" (threads, a real Gloo group of two): each local gradient shard ends as the mean of both
    hosts'; a big contiguous one is reduced where it lies (no copy of it), smaller or non-contiguous ones are
    packed per dtype into buckets of bounded size, with at most two buckets in flight."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    monkeypatch.setattr(sharded, "_IN_PLACE_BYTES", 256)
    monkeypatch.setattr(sharded, "_BUCKET_BYTES", 100)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    shapes = [((64,), torch.float32), ((5,), torch.float32), ((3, 4), torch.float32), ((10,), torch.float64),
              ((7,), torch.float32), ((80,), torch.float64), ((9,), torch.float32), ((30,), torch.float32)]

    def grads(host: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(host)
        out = []
        for i, (shape, dtype) in enumerate(shapes):
            t = torch.randn(shape, generator=g, dtype=dtype)
            out.append(t.t().contiguous().t() if i == 2 else t)  # (3, 4) with a transposed layout: not contiguous
        return out

    results: dict[int, tuple] = {}

    def host(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", store.port, None, False, timeout=timedelta(seconds=30))  # one each
        pg = dist.ProcessGroupGloo(dist.PrefixStore("avg", client), rank, 2, timedelta(seconds=30))
        sizes: list[int] = []
        given: list[int] = []  # the storage each allreduce was given
        packed_in_flight: list[int] = []  # the packed buffers' works not yet waited for
        most_in_flight = [0]
        ptrs_of_grads: set[int] = set()

        class Recording:  # the real group, with what each allreduce was given written down
            def allreduce(self, tensors):
                sizes.append(tensors[0].numel())
                given.append(tensors[0].data_ptr())
                work = pg.allreduce(tensors)
                if tensors[0].data_ptr() not in ptrs_of_grads:
                    packed_in_flight.append(id(work))
                    most_in_flight[0] = max(most_in_flight[0], len(packed_in_flight))
                return work

        def wait(work, what, **how):
            work.wait()
            if id(work) in packed_in_flight:
                packed_in_flight.remove(id(work))

        params = []
        for g in grads(rank):
            p = torch.nn.Parameter(torch.zeros(g.shape, dtype=g.dtype))
            p.grad = g
            params.append(p)
        ptrs = [p.grad.data_ptr() for p in params]
        ptrs_of_grads.update(ptrs)
        ctx = SimpleNamespace(info=SimpleNamespace(cross_size=2), cross_group=lambda what: Recording(), wait=wait)
        sharded.average_gradient_shards(ctx, params)
        in_place = [given[sizes.index(64)] == ptrs[0], given[sizes.index(80)] == ptrs[5]]
        results[rank] = ([p.grad.clone() for p in params], sizes, ptrs == [p.grad.data_ptr() for p in params],
                         params[2].grad.is_contiguous(), most_in_flight[0], in_place)

    threads = [threading.Thread(target=host, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    expected = [(a + b) / 2 for a, b in zip(grads(0), grads(1))]
    for rank in (0, 1):
        averaged, sizes, same_storage, transposed_kept, most_in_flight, in_place = results[rank]
        for got, want in zip(averaged, expected):
            assert torch.allclose(got, want, rtol=0, atol=1e-6) and got.dtype == want.dtype
        assert same_storage and not transposed_kept  # averaged into the gradients themselves
        # In place: the two 256-byte-plus shards (64 float32, 80 float64). Packed: float32 (the mask of which
        # parameters had a gradient, 8, then 5, 12 | 7, 9 | 30: buckets of at most 100 bytes), float64 (10).
        assert sorted(sizes) == sorted([64, 80, 25, 16, 30, 10]), sizes
        assert in_place == [True, True]  # the big shards' own storage went to the allreduce, not a packed copy
        assert most_in_flight == 2  # four packed buckets, never more than two of them in flight
