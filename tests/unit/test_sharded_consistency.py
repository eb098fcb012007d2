"""``hvd.shard``: a host's shards are one commit, every host averages the same gradients, and the replicas'
broadcasts refuse shards (worker/sharded.py, commit/state.py, optim/optimizer.py, comm/collectives.py)."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.driver.job.plan import Candidate, StateLost, plan_round
from cloud_elastic.worker import sharded
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.ledger import CommitLedger
from cloud_elastic.worker.link.progress import Progress

pytestmark = pytest.mark.timeout(30)


def _worker_of(rows: list[tuple[int, int, bool]], me: int) -> SimpleNamespace:
    """Rank ``me`` of a round whose rank r is on host ``rows[r][0]`` and holds commit ``rows[r][1]`` (exactly
    when ``rows[r][2]``); the round's allreduce adds the other ranks' rows, with this worker's layout."""
    host, seq, holds = rows[me]
    ledger = CommitLedger("auto", Progress(), f"w{me}")
    ledger.hold_commit(seq)
    if not holds:
        ledger.lost_commit("an update in place, then a failure")

    def allreduce(tensors: list[torch.Tensor]) -> None:
        mine = tensors[0]
        for rank, (other_host, other_seq, other_holds) in enumerate(rows):
            if rank != me:
                mine[rank] = torch.tensor([mine[me, 0], other_host, other_seq, int(other_holds)])

    ctx = SimpleNamespace(info=SimpleNamespace(size=len(rows), rank=me, cross_rank=host, round=7), ledger=ledger,
                          abandoned=0, group=lambda what: SimpleNamespace(allreduce=allreduce))
    ctx.wait = lambda work, what, **how: None
    ctx._abandon_round = lambda: setattr(ctx, "abandoned", ctx.abandoned + 1)
    return ctx


def test_a_host_whose_workers_hold_two_commits_holds_none_and_as_host_0_gives_nothing():
    """A worker lost mid-step: on its host-mates' host, local rank 0's cross-host average completed (it updated
    and committed step 5 in place), local rank 1's failed (it rolled back to step 4)."""
    hvd.init()  # a CPU worker: the check's tensor stays where it is
    model = torch.nn.Linear(3, 2)
    mixed_second = [(0, 4, True), (0, 4, True), (1, 5, True), (1, 4, True)]
    for me, holds in [(0, True), (1, True), (2, False), (3, False)]:
        ctx = _worker_of(mixed_second, me)
        sharded.check_hosts(ctx, [model])  # host 1 then takes every shard from host 0
        assert ctx.ledger.holds_commit is holds and ctx.abandoned == 0

    mixed_first = [(0, 5, True), (0, 4, True), (1, 4, True), (1, 4, True)]
    for me in range(4):
        ctx = _worker_of(mixed_first, me)
        with pytest.raises(CollectiveError, match=r"^the workers of rank 0's host hold different commits of their "
                                                  r"shards \(hosts \[0\] of round 7\); none of them may give the state$"):
            sharded.check_hosts(ctx, [model])
        # What the driver is told at rendezvous: host 0's workers hold no commit; host 1's still do.
        assert ctx.ledger.holds_commit is (me >= 2) and ctx.abandoned == 1

    # A worker that cannot restore its commit exactly leaves its host without one, even at its mates' sequence.
    assert sharded.mixed_hosts([(0, 3, True), (0, 3, False), (1, 3, True), (1, 3, True)]) == {0}
    assert sharded.mixed_hosts([(0, 0, True), (0, 0, True), (1, 3, True), (1, 3, True)]) == set()


def _candidate(worker: str, host: str, slot: int, prev_rank: int, seq: int, holds: bool = True) -> Candidate:
    return Candidate(worker, host, slot, prev_rank, holds_state=holds, commit_seq=seq)


def test_the_newest_commit_a_worker_can_give_is_rank_0_s_even_when_one_that_cannot_reports_a_newer_one():
    waiting = [
        _candidate("c0", "c", 0, 0, 4), _candidate("c1", "c", 1, 1, 4),
        _candidate("b0", "b", 0, 2, 5), _candidate("b1", "b", 1, 3, 5),
        _candidate("a0", "a", 0, 4, 6, holds=False), _candidate("a1", "a", 1, 5, 5, holds=False),  # a mixed host
    ]
    plan = plan_round(waiting, max_np=8, state_committed=True, failure_since_last_round=True, checkpointing=False,
                      host_slots=2)
    assert [c.worker_id for c in plan.members] == ["b0", "b1", "c0", "c1", "a0", "a1"] and plan.needs_sync
    # The mixed host alone: its state is lost; the latest checkpoint brings it back where there is one.
    assert isinstance(plan_round(waiting[4:], max_np=8, state_committed=True, failure_since_last_round=True,
                                 checkpointing=False, host_slots=2), StateLost)
    assert plan_round(waiting[4:], max_np=8, state_committed=True, failure_since_last_round=True,
                      checkpointing=True, host_slots=2).from_checkpoint


def _sharded_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return hvd.shard(model, modules=[model[0], model[2]])


def test_parameters_that_start_to_train_later_join_the_cross_host_average(monkeypatch):
    """Unfrozen, or added with add_param_group: without it, each host would train them on its own data only."""
    hvd.init()
    averaged: list[set[str]] = []
    monkeypatch.setattr(sharded, "average_gradient_shards",
                        lambda ctx, params: averaged.append({names[id(p)] for p in params}))
    model = _sharded_model()
    names = {id(p): n for n, p in model.named_parameters()}
    model[0].weight.requires_grad_(False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD([model[0].weight, model[0].bias], lr=0.1))

    def step() -> None:
        x = torch.randn(8, 6)
        opt.zero_grad()
        F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()

    step()
    model[0].weight.requires_grad_(True)
    step()
    opt.add_param_group({"params": list(model[2].parameters())})
    step()
    assert averaged == [{"0.bias"}, {"0.weight", "0.bias"}, {"0.weight", "0.bias", "2.weight", "2.bias"}]


def test_every_host_averages_every_trained_shard_zeros_where_its_step_left_a_gradient_out():
    """Two hosts (threads, a real Gloo group): each host's data took a branch the other's did not (host 0 used
    the second parameter, host 1 the third). Both average every shard, each branch's gradient with the other
    host's zeros, and end with the same gradients: no host's branch is averaged into another parameter."""
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=20), wait_for_workers=False)
    shared, only_0, only_1 = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 6.0]), torch.tensor([8.0, 10.0])
    results: dict[int, list[torch.Tensor]] = {}

    def host(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", store.port, None, False, timeout=timedelta(seconds=20))
        pg = dist.ProcessGroupGloo(dist.PrefixStore("avg", client), rank, 2, timedelta(seconds=10))
        params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2)),
                  torch.nn.Parameter(torch.zeros(2))]
        params[0].grad = shared * (rank + 1)
        params[1 + rank].grad = (only_0 if rank == 0 else only_1).clone()
        ctx = SimpleNamespace(info=SimpleNamespace(cross_size=2), cross_group=lambda what: pg,
                              wait=lambda work, what, **how: work.wait())
        sharded.average_gradient_shards(ctx, params)
        results[rank] = [None if p.grad is None else p.grad.clone() for p in params]

    threads = [threading.Thread(target=host, args=(rank,), daemon=True) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(25)
    assert set(results) == {0, 1}, "a host's average failed"
    expected = [(shared * 1.5).tolist(), (only_0 / 2).tolist(), (only_1 / 2).tolist()]
    for rank in (0, 1):
        assert [g if g is None else g.tolist() for g in results[rank]] == expected


@pytest.mark.parametrize("in_place_bytes", [sharded._IN_PLACE_BYTES, 0])  # the mask packed, or alone
def test_a_parameter_no_host_has_a_gradient_for_is_not_updated_on_two_hosts_as_on_one(monkeypatch, in_place_bytes):
    """An unused head (no gradient on any host) keeps ``.grad`` None through the average, so AdamW neither
    decays it nor starts its moments: the same parameters train on one host or on two. A branch only host 1
    took is still averaged with host 0's zeros."""
    monkeypatch.setattr(sharded, "_IN_PLACE_BYTES", in_place_bytes)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=20), wait_for_workers=False)
    results: dict[tuple[int, int], tuple] = {}
    formed = {cross_size: threading.Barrier(2) for cross_size in (2, 1)}

    def host(rank: int, cross_size: int) -> None:
        client = dist.TCPStore("127.0.0.1", store.port, None, False, timeout=timedelta(seconds=20))
        pg = dist.ProcessGroupGloo(dist.PrefixStore(f"unused{cross_size}", client), rank, 2, timedelta(seconds=10))
        # One host runs no collective: a thread whose side formed first and went on to end dropped its group while
        # the other was still connecting ("Connection closed by peer", seen once in a clean run).
        formed[cross_size].wait(20)
        used, head, branch = (torch.nn.Parameter(torch.ones(n)) for n in (3, 2, 4))
        used.grad = torch.full((3,), float(rank + 1))
        if rank == 1:
            branch.grad = torch.full((4,), 6.0)
        opt = torch.optim.AdamW([used, head, branch], lr=0.1, weight_decay=0.1)
        ctx = SimpleNamespace(info=SimpleNamespace(cross_size=cross_size), cross_group=lambda what: pg,
                              wait=lambda work, what, **how: work.wait())
        sharded.average_gradient_shards(ctx, [used, head, branch])
        grads = [None if p.grad is None else p.grad.tolist() for p in (used, head, branch)]
        opt.step()
        results[(cross_size, rank)] = (grads, head.tolist(), len(opt.state[head]))

    for cross_size in (2, 1):
        threads = [threading.Thread(target=host, args=(rank, cross_size), daemon=True) for rank in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(25)
    assert len(results) == 4, "a host's average failed"
    for rank in (0, 1):
        assert results[(2, rank)] == ([[1.5] * 3, None, [3.0] * 4], [1.0, 1.0], 0)
        assert results[(1, rank)][1:] == ([1.0, 1.0], 0)  # one host: the head was never touched either


@pytest.mark.parametrize("cross_size", [1, 2])
def test_the_membership_flag_is_agreed_once_per_step_across_hosts_and_once_per_commit_on_one_host(monkeypatch,
                                                                                               cross_size):
    """Three steps per commit, a peer's membership change pending: every worker interrupts at the commit.
    Several hosts agree in each step, before the update (a host-mate's failed average must stop it), and the
    commit reads that; one host has no cross-host average to guard, so its steps wait for nothing on the
    round (on a GPU, for backward to end) and its commit agrees, once."""
    hvd.init()
    model = _sharded_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    state = hvd.elastic.TorchState(model, opt, step=0)
    ctx = get_context()
    agreed: list[str] = []

    def peer_pending(tensors: list[torch.Tensor]) -> None:
        tensors[0].add_(1.0)  # another worker's flag: the driver asked it for a membership change

    monkeypatch.setattr(ctx, "standalone", False)
    monkeypatch.setattr(ctx, "elastic_entered", True)  # a job's commits are made inside hvd.elastic.run
    monkeypatch.setattr(ctx, "info", SimpleNamespace(size=4, rank=0, cross_size=cross_size, round=0, update_gen=0))
    monkeypatch.setattr(ctx, "group", lambda what: agreed.append(what) or SimpleNamespace(allreduce=peer_pending))
    monkeypatch.setattr(ctx, "cross_group", lambda what: SimpleNamespace(allreduce=lambda tensors: None))
    monkeypatch.setattr(ctx, "wait", lambda work, what, **how: None)
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
    steps = list(agreed)
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.commit()
    if cross_size == 1:
        assert (steps, agreed) == ([], ["membership check"])
    else:
        assert (steps, agreed) == (["the step's agreement"] * 3, steps)


def test_broadcasting_a_sharded_model_or_its_optimizer_is_a_one_line_error_before_any_collective():
    """Packing a shard for a broadcast gathers it over its host, whose other workers, in the broadcast, never
    join: the job hung. The state sync gives every host host 0's shards."""
    hvd.init()
    model = _sharded_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"^hvd.broadcast_parameters: '0.bias' is sharded with hvd.shard \(a "
                                         r"DTensor\); .* drop this call$"):
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    with pytest.raises(ValueError, match=r"^hvd.broadcast_optimizer_state: its parameters are sharded with hvd.shard"):
        hvd.broadcast_optimizer_state(opt, root_rank=0)


def test_a_worker_whose_round_fails_after_its_cross_host_average_does_not_update_and_rolls_back_exactly(monkeypatch):
    """A host-mate's peer lost after its backward fails that host-mate's average; this worker's own average
    completed. Its step then waits for the whole round before updating: the round is aborted there, so it
    does not update, and restores its commit exactly, as its host-mate does: one commit per host."""
    hvd.init()
    model = _sharded_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    state = hvd.elastic.TorchState(model, opt, step=0)
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        state.commit()
    committed = [p.to_local().clone() for p in model.parameters()]

    ctx = get_context()
    monkeypatch.setattr(ctx, "standalone", False)
    monkeypatch.setattr(ctx, "info", SimpleNamespace(size=4, rank=0, cross_size=2, round=0, update_gen=0))
    monkeypatch.setattr(ctx, "group", lambda what: SimpleNamespace(allreduce=lambda tensors: None))
    monkeypatch.setattr(sharded, "average_gradient_shards", lambda ctx, params: None)  # this worker's completed

    def aborted(work, what, **how):
        raise CollectiveError(f"{what} abandoned: the driver aborted round 0 (a peer was lost)")

    monkeypatch.setattr(ctx, "wait", aborted)
    opt.zero_grad()
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    with pytest.raises(CollectiveError, match="^the step's agreement abandoned"):
        opt.step()
    state.restore()
    assert ctx.ledger.holds_commit
    assert all(torch.equal(p.to_local(), c) for p, c in zip(model.parameters(), committed))
