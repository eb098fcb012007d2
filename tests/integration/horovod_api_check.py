"""Checks the Horovod API beyond allreduce/broadcast across real workers; prints one CHECK line per rank.

Every rank can regenerate every rank's inputs (seeded by rank), so each
expected result is computed by hand here, or for SyncBatchNorm by torch's own
BatchNorm over the batches of all ranks concatenated. A check is a name and
True, or a string saying what differed.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context


def inputs(rank: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1000 + rank)) * scale


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-6) -> bool | str:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}"
    return True if torch.allclose(got, want, rtol=rtol, atol=atol) else f"max diff {(got - want).abs().max().item()}"


def ops(rank: int, size: int) -> dict[str, Any]:
    mine = torch.tensor([rank + 1.0, -(rank + 1.0), 0.5 * (rank + 2)])
    every = torch.stack([torch.tensor([r + 1.0, -(r + 1.0), 0.5 * (r + 2)]) for r in range(size)])
    checks: dict[str, Any] = {
        "min": close(hvd.allreduce(mine, op=hvd.Min), every.amin(0)),
        "max": close(hvd.allreduce(mine, op=hvd.Max), every.amax(0)),
        "product": close(hvd.allreduce(mine, op=hvd.Product), every.prod(0)),
        "sum_pre_post": close(hvd.allreduce(mine, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
                              every.sum(0) * 2.0 * 0.25),
        "average_pre": close(hvd.allreduce(mine, prescale_factor=3.0), (every * 3.0).sum(0) / size),
    }
    in_place = mine.clone()
    hvd.allreduce_(in_place, op=hvd.Max)
    checks["max_in_place"] = close(in_place, every.amax(0))
    checks["input_unchanged"] = close(mine, every[rank])
    return checks


def grouped(rank: int, size: int) -> dict[str, Any]:
    def group(r: int) -> list[torch.Tensor]:
        return [inputs(r, 3, 4), inputs(r, 5).double(), torch.arange(4) * (r + 1), inputs(r, 2) * 10]

    mine = group(rank)
    before = [t.clone() for t in mine]
    want = [torch.stack([group(r)[i] for r in range(size)]).sum(0) for i in range(4)]
    summed = hvd.grouped_allreduce(mine, op=hvd.Sum)
    checks: dict[str, Any] = {f"grouped_sum_{i}": close(g, w) for i, (g, w) in enumerate(zip(summed, want))}
    checks["grouped_inputs_unchanged"] = all(torch.equal(a, b) for a, b in zip(mine, before))
    floats = [mine[0], mine[1]]
    hvd.grouped_allreduce_(floats)
    checks["grouped_average_in_place"] = close(floats[0], want[0] / size) is True and close(floats[1], want[1] / size) is True
    return checks


def reducescatter(rank: int, size: int) -> dict[str, Any]:
    total = torch.stack([inputs(r, 7, 2) for r in range(size)])
    rows = [len(c) for c in torch.tensor_split(torch.arange(7), size)]  # Horovod: the first 7 % size ranks get one more
    start = sum(rows[:rank])
    mine = inputs(rank, 7, 2)
    sl = slice(start, start + rows[rank])
    checks = {
        "reducescatter_rows": rows,
        "reducescatter_sum": close(hvd.reducescatter(mine, op=hvd.Sum), total.sum(0)[sl]),
        "reducescatter_average": close(hvd.reducescatter(mine), total.sum(0)[sl] / size),
        "reducescatter_max": close(hvd.reducescatter(mine, op=hvd.Max), total.amax(0)[sl]),
        "reducescatter_fp16": close(hvd.reducescatter(mine, compression=hvd.Compression.fp16), total.mean(0)[sl],
                                    rtol=1e-2, atol=2e-3),
    }
    few = hvd.reducescatter(torch.ones(size - 1, 3), op=hvd.Sum)  # fewer rows than workers: the last gets none
    checks["reducescatter_fewer_rows"] = list(few.shape) == ([1, 3] if rank < size - 1 else [0, 3]) and bool((few == size).all())
    return checks


def alltoall(rank: int, size: int) -> dict[str, Any]:
    def rows_of(r: int, n: int) -> torch.Tensor:  # row i of rank r holds (r, i, 7)
        return torch.tensor([[float(r), float(i), 7.0] for i in range(n)]).reshape(n, 3)

    even = hvd.alltoall(rows_of(rank, 2 * size))
    want_even = torch.cat([rows_of(r, 2 * size)[2 * rank: 2 * rank + 2] for r in range(size)])

    def splits_of(r: int) -> list[int]:
        return [(r + j) % 3 for j in range(size)]

    def rows_sent(r: int) -> int:
        return sum(splits_of(r)) + 1  # one trailing row is not sent

    got, received = hvd.alltoall(rows_of(rank, rows_sent(rank)), splits=torch.tensor(splits_of(rank), dtype=torch.int32))
    parts = []
    for r in range(size):
        offset = sum(splits_of(r)[:rank])
        parts.append(rows_of(r, rows_sent(r))[offset: offset + splits_of(r)[rank]])
    return {
        "alltoall_even": close(even, want_even),
        "alltoall_splits": close(got, torch.cat(parts)),
        "alltoall_received_splits": received.tolist() == [splits_of(r)[rank] for r in range(size)]
        and received.dtype == torch.int32,
    }


def barrier_and_join(rank: int) -> dict[str, Any]:
    hvd.allreduce(torch.zeros(1))  # everyone leaves this within milliseconds of the others
    if rank == 0:
        time.sleep(1.5)
    t0 = time.monotonic()
    hvd.barrier()
    waited = time.monotonic() - t0
    try:
        hvd.join()
        join: Any = "join returned"
    except hvd.UnsupportedError as exc:
        join = "ElasticSampler" in str(exc) and "\n" not in str(exc)
    return {"barrier_waits_for_the_last": waited < 1.0 if rank == 0 else waited > 0.5, "join_refused": join}


def sync_batchnorm(rank: int, size: int) -> dict[str, Any]:
    xs = [inputs(r, 2 + r, 3, 4, scale=3.0) + r for r in range(size)]  # batches of different sizes and means
    ws = [inputs(100 + r, 2 + r, 3, 4) for r in range(size)]
    torch.manual_seed(5)
    ref = torch.nn.BatchNorm1d(3, momentum=0.3)
    torch.manual_seed(5)
    sbn = hvd.SyncBatchNorm(3, momentum=0.3)
    with torch.no_grad():  # non-trivial affine parameters, equal on both
        for m in (ref, sbn):
            m.weight.copy_(torch.tensor([1.5, -0.5, 2.0]))
            m.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    every = torch.cat(xs).requires_grad_()
    out_ref = ref(every)
    (out_ref * torch.cat(ws)).sum().backward()
    x = xs[rank].clone().requires_grad_()
    out = sbn(x)
    (out * ws[rank]).sum().backward()
    start = sum(2 + r for r in range(rank))
    sl = slice(start, start + 2 + rank)
    checks = {
        "syncbn_output": close(out, out_ref[sl].detach(), atol=1e-5),
        "syncbn_input_grad": close(x.grad, every.grad[sl], rtol=1e-4, atol=1e-5),
        # Parameter gradients are local, as with torch's SyncBatchNorm: summed over workers they are the reference's.
        "syncbn_weight_grad": close(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), ref.weight.grad, rtol=1e-4, atol=1e-4),
        "syncbn_running_mean": close(sbn.running_mean, ref.running_mean),
        "syncbn_running_var": close(sbn.running_var, ref.running_var, rtol=1e-4),
    }
    sbn.eval()
    ref.eval()
    checks["syncbn_eval"] = close(sbn(xs[rank]), ref(xs[rank]).detach(), atol=1e-5)
    return checks


def compressed_allreduce(rank: int, size: int) -> dict[str, Any]:
    mine = inputs(rank, 1000, scale=100.0)
    mean = torch.stack([inputs(r, 1000, scale=100.0) for r in range(size)]).mean(0)
    big = torch.full((4,), 40000.0)  # fp16 holds it, but not 3 x 40000
    return {
        "fp16_average": close(hvd.allreduce(mine, compression=hvd.Compression.fp16), mean, rtol=2e-3, atol=0.1),
        "bf16_average": close(hvd.allreduce(mine, compression=hvd.Compression.bf16), mean, rtol=2e-2, atol=1.0),
        "fp16_average_divides_before_the_sum": close(hvd.allreduce(big, compression=hvd.Compression.fp16), big),
        "fp16_sum_overflows_as_fp16_does": bool(torch.isinf(hvd.allreduce(big, op=hvd.Sum,
                                                                           compression=hvd.Compression.fp16)).all()),
    }


class SentBytes:
    """Stands in for the round's process group and counts what the gradient allreduces hand to it."""

    def __init__(self, pg: Any) -> None:
        self.pg, self.sent = pg, []

    def allreduce(self, tensors: list[torch.Tensor], *args: Any) -> Any:
        self.sent += [(t.dtype, t.numel()) for t in tensors]
        return self.pg.allreduce(tensors, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pg, name)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    # With bucket_cap_mb=1 the 512x512 weight (1 MiB) gets a bucket of its own (a solo, reduced-in-place gradient).
    return torch.nn.Sequential(torch.nn.Linear(5, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512), torch.nn.Tanh(),
                               torch.nn.Linear(512, 1))


def one_step(rank: int, **options: Any) -> tuple[torch.nn.Module, list[tuple[torch.dtype, int]]]:
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(),
                                   bucket_cap_mb=1, **options)
    x = inputs(rank, 8, 5)
    group = get_context()._group  # the round's group holds its process group (worker.groups.RoundGroup)
    recorder = group.pg = SentBytes(group.pg)
    try:
        F.mse_loss(net(x), x.sum(1, keepdim=True)).backward()
        opt.step()
    finally:
        group.pg = recorder.pg
    return net, recorder.sent


def optimizer(rank: int, size: int) -> dict[str, Any]:
    reference = model()
    grads = []
    for r in range(size):
        reference.zero_grad()
        x = inputs(r, 8, 5)
        F.mse_loss(reference(x), x.sum(1, keepdim=True)).backward()
        grads.append([p.grad.clone() for p in reference.parameters()])
    start = [p.detach().clone() for p in reference.parameters()]
    updates = [-0.1 * sum(g[i] for g in grads) / size for i in range(len(start))]
    numel = sum(p.numel() for p in reference.parameters())
    largest = max(u.abs().max().item() for u in updates)

    def matches(net: torch.nn.Module, rtol: float) -> bool | str:
        """The update each parameter got, against the average gradient's, relative to the largest update."""
        worst = max((p.detach() - s - u).abs().max().item() for p, s, u in zip(net.parameters(), start, updates))
        return True if worst <= rtol * largest else f"max diff {worst / largest:.2e} of the largest update"

    checks: dict[str, Any] = {}
    for label, options, rtol in (("none", {}, 1e-6), ("fp16", {"compression": hvd.Compression.fp16}, 2e-3),
                                 ("bf16", {"compression": hvd.Compression.bf16}, 2e-2),
                                 ("predivide", {"gradient_predivide_factor": 4.0}, 1e-6),
                                 ("fp16_predivide", {"compression": hvd.Compression.fp16,
                                                     "gradient_predivide_factor": 2.0}, 2e-3)):
        net, sent = one_step(rank, **options)
        checks[f"optimizer_{label}"] = matches(net, rtol)
        wire = {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(label.split("_")[0], torch.float32)
        # Every gradient, plus the membership flag, in the wire dtype: half the bytes of float32 compressed.
        checks[f"optimizer_{label}_sent"] = (sorted({d for d, _ in sent}, key=str) == [wire]
                                             and sum(n for _, n in sent) == numel + 1) or str(sent)
    return checks


def predivide_overflow(size: int) -> dict[str, Any]:
    """Gradients of 40000 on every rank: fp16 holds each, not their sum. Where the average divides decides."""
    results = {}
    for label, factor in (("unset", None), ("1", 1.0), ("size", float(size))):
        p = torch.nn.Parameter(torch.zeros(4))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=0.0), named_parameters=[("p", p)],
                                       compression=hvd.Compression.fp16, gradient_predivide_factor=factor)
        (p * 40000.0).sum().backward()
        opt.synchronize()
        results[label] = p.grad.tolist()
        with opt.skip_synchronize():
            opt.step()
    return {
        "predivide_unset_divides_first": results["unset"] == [40000.0] * 4,
        "predivide_1_sums_first_and_overflows": all(v == float("inf") for v in results["1"]),
        "predivide_size_divides_first": results["size"] == [40000.0] * 4,
    }


def horovod_patterns(rank: int, size: int) -> dict[str, Any]:
    """Horovod patterns that failed here (review h6): a step skipped after synchronize(), integer scaling, model=."""
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=1.0), named_parameters=net.named_parameters())
    net(inputs(rank, 4, 2)).sum().backward()
    opt.synchronize()  # a NaN loss or an AMP overflow: no step
    net.zero_grad()
    before = net.weight.detach().clone()
    net(inputs(rank, 4, 2, scale=3.0)).sum().backward()
    opt.step()
    want = sum(inputs(r, 4, 2, scale=3.0).sum(0) for r in range(size)) / size  # the second batch's average only
    mine = torch.tensor([3 * (rank + 1), -3 * (rank + 1)])
    # Horovod's ScaleBuffer: each product in double, stored back rounded toward zero, before and after the sum.
    pre = [int(2.5 * 3 * (r + 1)) for r in range(size)]
    want_int = [int(0.5 * sum(pre)), int(-0.5 * sum(pre))]
    # A backward after synchronize(), then step() under skip_synchronize(): the step averages that backward first
    # (review h8: its allreduce was dropped in flight and each worker stepped on its own gradients).
    opt.zero_grad()
    opt.synchronize()
    net.zero_grad()
    again = net.weight.detach().clone()
    net(inputs(rank, 4, 2, scale=5.0)).sum().backward()
    with opt.skip_synchronize():
        opt.step()
    want_again = sum(inputs(r, 4, 2, scale=5.0).sum(0) for r in range(size)) / size
    other = torch.nn.Linear(2, 1)
    momentum = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    other(inputs(rank, 4, 2)).sum().backward()
    momentum.step()  # each rank's own momentum buffer
    hvd.broadcast_optimizer_state(momentum, 0, model=other)
    buffers = hvd.allgather(torch.cat([s["momentum_buffer"].view(1, -1) for s in momentum.state.values()], 1))
    return {
        "skipped_step_then_model_zero_grad": close((before - again).view(-1), want),
        "backward_after_synchronize_then_skip_synchronize": close((again - net.weight.detach()).view(-1), want_again),
        "integer_prescale_postscale": hvd.allreduce(mine, op=hvd.Sum, prescale_factor=2.5,
                                                    postscale_factor=0.5).tolist() == want_int,
        "broadcast_optimizer_state_model": bool((buffers == buffers[0]).all()),
    }


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    checks: dict[str, Any] = {"rank": rank, "size": size}
    sections: list[Callable[[], dict[str, Any]]] = [
        lambda: ops(rank, size), lambda: grouped(rank, size), lambda: reducescatter(rank, size),
        lambda: alltoall(rank, size), lambda: barrier_and_join(rank), lambda: sync_batchnorm(rank, size),
        lambda: compressed_allreduce(rank, size), lambda: optimizer(rank, size), lambda: predivide_overflow(size),
        lambda: horovod_patterns(rank, size),
    ]
    for section in sections:
        checks.update(section())
    print("CHECK " + json.dumps(checks), flush=True)


if __name__ == "__main__":
    main()
