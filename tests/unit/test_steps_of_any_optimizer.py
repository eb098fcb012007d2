"""Rank 0's optimizer steps are counted whatever optimizer the script steps (review s54, eaba657: a Horovod
script that averages its gradients itself with ``hvd.allreduce_`` and steps a plain ``torch.optim.SGD``, as
docs/porting.md allows, showed 'steps/s -' in status and ``cloud_elastic_steps_per_second 0.0``; its rollbacks
said 0 steps lost). Standalone mode (rank 0 of 1); and, without a job, what the driver shows of a process that
counts no step: unknown, not 0.
"""

from __future__ import annotations

import math
import urllib.request

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.metrics import MetricsServer, StepRate
from cloud_elastic.worker.context import get_context

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()


def _backward(model: torch.nn.Module, seed: int) -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()


def test_a_plain_optimizer_stepped_after_a_manual_allreduce_counts_its_steps_and_its_lost_ones() -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, opt, step=0)
    ctx = get_context()
    state.commit()
    before = ctx.progress.steps
    for i in range(3):
        opt.zero_grad()
        _backward(model, i)
        for p in model.parameters():
            hvd.allreduce_(p.grad)
        opt.step()
    assert ctx.progress.steps == before + 3  # what the heartbeat reports: the driver's steps/s
    state.restore()
    ctx.ledger.note_rollback()  # as the run loop does: the driver hears rolled_back as the rollback's steps_lost
    assert ctx.ledger.rolled_back == 3


@pytest.mark.parametrize("inner", [torch.optim.SGD, torch.optim.Adam])
def test_a_distributed_optimizer_step_counts_once(inner) -> None:
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(inner(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
    ctx = get_context()
    before = ctx.progress.steps
    for i in range(4):
        opt.zero_grad()
        _backward(model, i)
        opt.step()
    assert ctx.progress.steps == before + 4


def test_a_rate_with_no_step_counted_is_unknown_not_0() -> None:
    rate = StepRate(window_s=30)
    assert rate.known is None
    rate.add(0, 0, "a[0]#1")
    rate.add(5, 0, "a[0]#1")  # heartbeats of a process whose steps nothing counts
    assert rate.known is None
    rate.add(6, 4, "a[0]#1")
    assert rate.known == pytest.approx(4 / 6)
    rate.add(36.5, 4, "a[0]#1")  # steps were counted, then none for the window: a stalled job reads 0
    assert rate.known == 0.0


def _scraped(server: MetricsServer, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_the_metric_reads_nan_until_a_step_is_counted() -> None:
    now = [100.0]
    server = MetricsServer("job", 0, clock=lambda: now[0])
    server.start()
    try:
        assert math.isnan(_scraped(server, "cloud_elastic_steps_per_second"))
        for t in range(3):
            now[0] = 100.0 + t
            server.observe_progress(0, t, "a[0]#1")
        assert math.isnan(_scraped(server, "cloud_elastic_steps_per_second"))
        now[0] = 104.0
        server.observe_progress(8, 4, "a[0]#1")
        assert _scraped(server, "cloud_elastic_steps_per_second") == 2.0
    finally:
        server.close()
