"""How a replica sync divides the packed commit among the workers that hold it (``comm.heal.assign``)."""

from __future__ import annotations

import pytest
import torch

from cloud_elastic.worker.comm.collectives import pack_chunks
from cloud_elastic.worker.comm.heal import Piece, assign
from cloud_elastic.worker.commit.sync_facts import receivers


def _covered(chunks, plan):
    """Every element of every chunk is sent exactly once, and each holder's pieces are in chunk order."""
    seen = {c: [] for c in range(len(chunks))}
    for pieces in plan:
        assert [(p.chunk, p.start) for p in pieces] == sorted((p.chunk, p.start) for p in pieces)
        for p in pieces:
            assert 0 <= p.start < p.stop <= chunks[p.chunk][0]
            seen[p.chunk].append((p.start, p.stop))
    for c, (n, _) in enumerate(chunks):
        ranges = sorted(seen[c])
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), ranges


def _bytes(chunks, pieces):
    return sum((p.stop - p.start) * chunks[p.chunk][1] for p in pieces)


def test_one_holder_sends_every_chunk_whole():
    chunks = [(10, 4), (3, 8), (1, 2)]
    assert assign(chunks, 1) == [[Piece(0, 0, 10), Piece(1, 0, 3), Piece(2, 0, 1)]]


def test_one_huge_tensor_is_shared_by_every_holder_in_equal_byte_ranges():
    chunks = [(1_000_000, 4)]
    plan = assign(chunks, 3)
    _covered(chunks, plan)
    assert [len(p) for p in plan] == [1, 1, 1]
    assert [_bytes(chunks, p) for p in plan] == [1_333_332, 1_333_332, 1_333_336]


def test_bytes_are_balanced_across_chunks_of_different_dtypes():
    chunks = [(1_500_000, 4), (100, 8), (700_000, 2), (33, 1)]
    for holders in (2, 3, 5, 7):
        plan = assign(chunks, holders)
        _covered(chunks, plan)
        total = sum(n * s for n, s in chunks)
        for pieces in plan:  # each gets its share, give or take an element at each of its two cuts
            assert abs(_bytes(chunks, pieces) - total / holders) <= 16, (holders, plan)


def test_equal_chunks_tie_by_order_and_the_plan_is_the_same_every_time():
    chunks = [(4, 4)] * 4
    plan = assign(chunks, 2)
    assert plan == [[Piece(0, 0, 4), Piece(1, 0, 4)], [Piece(2, 0, 4), Piece(3, 0, 4)]]
    assert assign(list(chunks), 2) == plan


def test_more_holders_than_chunks_split_the_chunks_and_more_holders_than_elements_leave_some_idle():
    chunks = [(6, 4), (2, 4)]
    plan = assign(chunks, 4)
    _covered(chunks, plan)
    assert [_bytes(chunks, p) for p in plan] == [8, 8, 8, 8]
    tiny = [(2, 8)]
    plan = assign(tiny, 5)
    _covered(tiny, plan)
    assert sum(1 for p in plan if p) == 2 and sum(len(p) for p in plan) == 2


def test_no_holder_is_an_error_and_no_bytes_is_no_piece():
    with pytest.raises(ValueError):
        assign([(3, 4)], 0)
    assert assign([(0, 4)], 2) == [[], []]
    assert assign([], 3) == [[], [], []]


def test_the_packing_does_not_depend_on_the_device_the_tensors_live_on_when_asked():
    # A holder's optimizer state may be on the accelerator while a receiver allocates it in host memory:
    # both must cut the same messages. By dtype and shape only, the packing is the same.
    tensors = [torch.zeros(3), torch.zeros(2, dtype=torch.int64), torch.zeros(2_000_000), torch.zeros(5)]
    assert pack_chunks(tensors, by_device=False) == [[2], [0, 3], [1]]
    assert pack_chunks(tensors) == [[2], [0, 3], [1]]


def test_a_holder_sends_its_optimizer_tensors_in_rank_0s_order_and_refuses_a_state_shaped_otherwise():
    from cloud_elastic.worker.comm.collectives import _split_tensors
    from cloud_elastic.worker.comm.heal import _pick
    from cloud_elastic.worker.comm.statecodec import StateSyncError

    root = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}, 1: {"exp_avg": torch.zeros(4)}},
            "param_groups": [{"lr": 0.1, "params": [0, 1]}]}
    skeleton = _split_tensors(root, copy=False)[0]
    mine = {"param_groups": root["param_groups"],  # the same values, its dicts in another order
            "state": {1: {"exp_avg": torch.zeros(4)}, 0: {"exp_avg": torch.ones(2), "step": torch.tensor(3.0)}}}
    picked = _pick(skeleton, mine, "optimizer state")
    assert [t.shape for t in picked] == [t.shape for t in _split_tensors(root, copy=False)[1]]
    assert all(torch.equal(a, b) for a, b in zip(picked, _split_tensors(root, copy=False)[1]))
    mine["state"][1]["exp_avg"] = torch.zeros(5)
    with pytest.raises(StateSyncError, match=r"\[1\]\['exp_avg'\].*shape \[4\]"):
        _pick(skeleton, mine, "optimizer state")


def test_an_empty_entry_only_rank_0_has_is_no_reason_to_refuse_a_holder():
    # Reading ``optimizer.state[p]`` of a parameter that never had a gradient (a rank-0-only log line, say) adds
    # an empty entry to rank 0's state (a defaultdict): the holders, which lack it, have nothing less to send.
    from cloud_elastic.worker.comm.heal import _pick, skeleton
    from cloud_elastic.worker.comm.statecodec import StateSyncError

    def adam() -> torch.optim.Adam:
        params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))]
        opt = torch.optim.Adam(params, lr=0.1)
        params[0].grad = torch.ones(3)  # the second parameter is unused: no state
        opt.step()
        return opt

    root, holder = adam(), adam()
    root.state[root.param_groups[0]["params"][1]]  # noqa: B018 (the read that adds the entry)
    picked = _pick(skeleton(root.state_dict()), holder.state_dict(), "optimizer state")
    assert [t.shape for t in picked] == [torch.Size([]), torch.Size([3]), torch.Size([3])]
    holder.state[holder.param_groups[0]["params"][0]].pop("exp_avg")  # a tensor missing is still refused
    with pytest.raises(StateSyncError, match="exp_avg"):
        _pick(skeleton(root.state_dict()), holder.state_dict(), "optimizer state")


def test_the_receivers_of_a_sync_are_the_workers_that_do_not_hold_rank_0s_very_commit():
    # (live commit_seq, holds_commit) by rank: rank 0 is the root and never receives.
    assert receivers([(7, True), (7, True), (0, True)]) == [2]  # a newcomer after a graceful change
    assert receivers([(7, True), (6, True), (7, False), (9, True)]) == [1, 2, 3]  # older, unrestorable, other
    assert receivers([(7, True), (7, True)]) == []  # everyone holds it: nothing moves
    assert receivers([(7, False), (7, True), (7, True)]) == [1, 2]  # rank 0's is not exact: not kept apart
    # Commit 0, the initial state, may differ on every worker: it is always sent.
    assert receivers([(0, True), (0, True), (0, True)]) == [1, 2]


def test_a_receiver_whose_model_is_built_otherwise_is_told_which_tensor_differs_before_anything_moves():
    from cloud_elastic.worker.commit.state import check_models, model_tensors
    from cloud_elastic.worker.comm.statecodec import StateSyncError

    def net(width: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Linear(width, 1))

    root = [model_tensors(net(16))]
    check_models(root, [net(16)])  # built the same way: nothing to say
    with pytest.raises(StateSyncError, match=r"^state sync: this worker's model 0 differs from rank 0's at '0.bias': "
                                             r"float32 \[32\] here, float32 \[16\] on rank 0 \(is the model built"):
        check_models(root, [net(32)])
    extra = net(16)
    extra.register_buffer("scale", torch.ones((), dtype=torch.int64))  # a buffer rank 0's model has not
    with pytest.raises(StateSyncError, match=r"at 'scale': int64 \[\] here, no such tensor on rank 0"):
        check_models(root, [extra])
    lazy = torch.nn.Sequential(torch.nn.LazyLinear(16), torch.nn.Linear(16, 1))  # not run yet: no shape
    with pytest.raises(StateSyncError, match=r"at '0.bias': float32 uninitialized here, float32 \[16\] on rank 0"):
        check_models(root, [lazy])
    with pytest.raises(StateSyncError, match="rank 0 syncs 1 model"):
        check_models(root, [net(16), net(16)])
