"""Checks collectives and gradient averaging across real workers; prints CHECK lines."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd


def data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(8, 5, generator=g)
    return x, x.sum(1, keepdim=True)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    # With bucket_cap_mb=1 (below) the 512x512 weight (1 MiB) fills a bucket alone and is allreduced in place;
    # the rest is packed into buckets.
    return torch.nn.Sequential(
        torch.nn.Linear(5, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1)
    )


def broadcast_parameters_packed(rank: int) -> bool:
    """A state dict of mixed dtypes, a 0-dim and a non-contiguous tensor, packed over flat buffers or alone."""
    from cloud_elastic.worker.comm import collectives
    g = torch.Generator().manual_seed(7)  # what rank 0 holds; the others start from their own values
    want = {"a": torch.randn(3, 4, generator=g), "b": torch.arange(5, dtype=torch.int64), "c": torch.tensor(2.5),
            "d": torch.randn(4, 6, generator=g).t(), "e": torch.randn(300, generator=g)}
    mine = {k: (v.clone() if rank == 0 else torch.full_like(v, rank)) for k, v in want.items()}
    mine["d"] = mine["d"].t().contiguous().t()  # non-contiguous, like the reference
    # Split into several buffers; "d" (96 bytes, non-contiguous) and "e" travel alone, the others packed.
    old = collectives._PACK_BYTES, collectives._ALONE_BYTES
    collectives._PACK_BYTES, collectives._ALONE_BYTES = 512, 64
    try:
        hvd.broadcast_parameters(mine, root_rank=0)
    finally:
        collectives._PACK_BYTES, collectives._ALONE_BYTES = old
    return all(torch.equal(mine[k], want[k]) and mine[k].dtype == want[k].dtype for k in want)


def broadcast_to_receivers(rank: int) -> bool:
    """Point to point: only the last rank needs rank 0's tensors and state dict; the ranks between keep theirs."""
    from cloud_elastic.worker.comm import collectives
    size = hvd.size()
    receivers = collectives.needing(rank == size - 1, "check")
    mine = [torch.full((3,), float(rank)), torch.arange(4) * (rank + 1)]
    collectives.broadcast_tensors_(mine, 0, "check", receivers=receivers)
    state = collectives.broadcast_state_dict({"step": rank, "t": torch.ones(2) * rank}, 0, receivers=receivers,
                                             limit=1 << 20)
    source = rank == 0 or rank == size - 1
    want = 0 if source else rank
    return (receivers == [size - 1] and torch.equal(mine[0], torch.full((3,), float(want)))
            and torch.equal(mine[1], torch.arange(4) * (want + 1)) and state["step"] == want
            and torch.equal(state["t"], torch.ones(2) * want))


def broadcast_state_sizes(rank: int) -> bool:
    """A small state (its bytes ride with its length) and one of over 64 KiB (a second transfer), to every
    worker and, point to point, to the last rank only."""
    from cloud_elastic.worker.comm import collectives
    size = hvd.size()
    small = {"epoch": 3, "name": "x" * 10}
    big = {"ids": list(range(40_000)), "t": torch.arange(30_000, dtype=torch.int64)}
    ok = collectives.broadcast_state(small if rank == 0 else None, 0, "small check") == small
    got = collectives.broadcast_state(big if rank == 0 else None, 0, "big check")
    ok = ok and got["ids"] == big["ids"] and torch.equal(got["t"], big["t"])
    mine = {"ids": [rank], "t": torch.tensor([rank])}
    got = collectives.broadcast_state(big if rank == 0 else mine, 0, "big check", receivers=[size - 1])
    keeps = big if rank in (0, size - 1) else mine
    return ok and got["ids"] == keeps["ids"] and torch.equal(got["t"], keeps["t"])


class Opaque:
    """A class torch.save pickles and no weights_only load builds (nobody allowlists it)."""


def broadcast_state_refused(rank: int) -> bool:
    """Rank 0's state holds an object a receiver's decode refuses, small and of over 64 KiB: every worker raises
    the StateSyncError naming it (rank 0's names the part) and none is left behind in a collective: the next
    broadcast of a plain state arrives whole everywhere."""
    from cloud_elastic.worker.comm import collectives, statecodec
    seen = []
    for extra in ([], list(range(40_000))):
        state = statecodec.Parts({"fine": {"ids": extra}, "bad": {"x": Opaque()}}) if rank == 0 else None
        try:
            collectives.broadcast_state(state, 0, "refused check")
            seen.append("")
        except statecodec.StateSyncError as exc:
            seen.append(str(exc))
    named = all("Opaque" in line for line in seen) and (rank != 0 or all(line.startswith("bad ") for line in seen))
    return named and collectives.broadcast_state({"after": 1} if rank == 0 else None, 0, "after") == {"after": 1}


def gather_rows(rank: int) -> bool:
    """Every worker's row on rank 0, in rank order; nothing elsewhere."""
    from cloud_elastic.worker.comm import collectives
    rows = collectives.gather_rows(torch.tensor([rank, rank * 10], dtype=torch.int64), "check")
    if rank != 0:
        return rows is None
    return rows.tolist() == [[r, r * 10] for r in range(hvd.size())]


def sync_facts_alone(rank: int) -> bool:
    """A sync whose State broadcasts nothing of its own: the facts gathered to rank 0 come in a broadcast of
    their own (``sync_facts.ensure_known``). Nobody has committed: commit 0 goes to every rank but 0."""
    from cloud_elastic.worker.commit import sync_facts
    from cloud_elastic.worker.context import get_context
    ctx = get_context()
    sync_facts.begin(ctx)
    sync_facts.ensure_known(ctx)
    ledger = ctx.ledger
    ok = ledger.sync_known and ledger.sync_root_seq == 0 and ledger.sync_receivers == list(range(1, hvd.size()))
    sync_facts.end(ledger)
    return ok and not ledger.sync_known


def heal_buffers_from_rank0(rank: int) -> bool:
    """A model with BatchNorm whose parameters are the same on every worker but whose running statistics are each
    worker's own, healed to the last rank (``ModelHandler`` with ``comm.heal``, as a sync with a newcomer): it
    ends with rank 0's whole state, its parameters from every holder and its buffers from rank 0 alone."""
    from cloud_elastic.worker.comm.heal import Heal
    from cloud_elastic.worker.commit.handlers import ModelHandler
    size, receiver = hvd.size(), hvd.size() - 1
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 64),
                              torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 1))
    g = torch.Generator().manual_seed(100 + rank)
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(32, 64, generator=g))  # each worker's own batches: its own running statistics
        if rank == receiver:
            for p in net.parameters():
                p.fill_(0.5)  # a newcomer's own initial values
    ModelHandler(net)._broadcast(None, True, Heal([receiver], size, 1))
    flat = torch.cat([t.reshape(-1).double() for t in net.state_dict().values()])
    everyone = hvd.allgather(flat.unsqueeze(0))
    return bool(torch.equal(everyone[receiver], everyone[0])) and not torch.equal(everyone[1], everyone[0])


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    checks = {}
    # Expected: the mean of every worker's gradient, computed locally for all ranks.
    reference = model()
    grads = []
    for r in range(size):
        reference.zero_grad()
        x, y = data(r)
        F.mse_loss(reference(x), y).backward()
        grads.append([p.grad.clone() for p in reference.parameters()])
    expected = [p.detach() - 0.1 * sum(g[i] for g in grads) / size for i, p in enumerate(reference.parameters())]

    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(),
                                   bucket_cap_mb=1)
    x, y = data(rank)
    F.mse_loss(net(x), y).backward()
    opt.step()
    checks["gradient_average"] = all(torch.allclose(p, e, atol=1e-6) for p, e in zip(net.parameters(), expected))

    checks["allreduce_average"] = torch.allclose(hvd.allreduce(torch.tensor([float(rank)])), torch.tensor([(size - 1) / 2]))
    checks["allreduce_sum"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == size
    gathered = hvd.allgather(torch.full((rank + 1, 2), float(rank)))
    checks["allgather_ragged"] = gathered.shape == (size * (size + 1) // 2, 2) and gathered[-1, 0].item() == size - 1
    checks["broadcast_object"] = hvd.broadcast_object({"from": rank}, root_rank=1) == {"from": 1}
    checks["broadcast"] = hvd.broadcast(torch.tensor([rank * 10.0]), root_rank=size - 1).item() == (size - 1) * 10
    checks["broadcast_parameters"] = broadcast_parameters_packed(rank)
    checks["broadcast_to_receivers"] = broadcast_to_receivers(rank)
    checks["broadcast_state_sizes"] = broadcast_state_sizes(rank)
    checks["broadcast_state_refused"] = broadcast_state_refused(rank)
    checks["gather_rows"] = gather_rows(rank)
    checks["sync_facts_alone"] = sync_facts_alone(rank)
    checks["heal_buffers_from_rank0"] = heal_buffers_from_rank0(rank)
    ranks = hvd.allgather(torch.tensor([hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]))
    checks["topology"] = ranks.view(size, 4).tolist()
    print("CHECK " + json.dumps({"rank": rank, **checks}), flush=True)


if __name__ == "__main__":
    main()
