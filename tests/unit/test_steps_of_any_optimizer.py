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


class _ClippedAdam(torch.optim.Adam):
    """A common subclass: clip, then the parent's step (itself hooked by torch once an Adam exists)."""

    def step(self, closure=None):
        for group in self.param_groups:
            torch.nn.utils.clip_grad_norm_(group["params"], 1.0)
        return super().step(closure)


class _Lookahead(torch.optim.Optimizer):
    """A wrapper whose step steps its inner optimizer (as timm's and pytorch-optimizer's Lookahead)."""

    def __init__(self, base: torch.optim.Optimizer) -> None:
        self.base_optimizer = base
        super().__init__(base.param_groups, {})

    def step(self, closure=None):
        return self.base_optimizer.step(closure)


def _steps_and_lost(opt, model: torch.nn.Module, n: int) -> tuple[int, int]:
    """Optimizer steps counted over ``n`` steps of ``opt`` after a commit, and the steps a rollback then loses."""
    ctx = get_context()
    state = hvd.elastic.TorchState(model, opt)
    state.commit()
    before = ctx.progress.steps
    for i in range(n):
        opt.zero_grad()
        _backward(model, i)
        opt.step()
    counted = ctx.progress.steps - before
    state.restore()
    ctx.ledger.note_rollback()
    return counted, ctx.ledger.rolled_back


def test_a_subclass_stepping_its_parents_step_counts_each_step_once() -> None:
    # review s54 (425300a): a GAN whose discriminator steps a plain Adam and generator a ClippedAdam counted
    # 5 steps of the generator as 10, and a rollback lost 10
    disc = torch.nn.Linear(4, 1)
    hvd.DistributedOptimizer(torch.optim.Adam(disc.parameters(), lr=1e-3), named_parameters=disc.named_parameters())
    gen = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(_ClippedAdam(gen.parameters(), lr=1e-3), named_parameters=gen.named_parameters())
    assert _steps_and_lost(opt, gen, 5) == (5, 5)
    plain = torch.nn.Linear(4, 1)
    assert _steps_and_lost(_ClippedAdam(plain.parameters(), lr=1e-3), plain, 5) == (5, 5)


def test_a_wrapper_stepping_an_inner_optimizer_counts_each_step_once() -> None:
    model = torch.nn.Linear(4, 1)
    assert _steps_and_lost(_Lookahead(torch.optim.SGD(model.parameters(), lr=0.1)), model, 5) == (5, 5)


def test_steps_after_a_nested_step_that_raised_count_once_each() -> None:
    class Failing(torch.optim.SGD):
        def step(self, closure=None):
            super().step(closure)
            raise RuntimeError("collective failed")

    model = torch.nn.Linear(4, 1)
    failing = _Lookahead(Failing(model.parameters(), lr=0.1))
    _backward(model, 0)
    with pytest.raises(RuntimeError):
        failing.step()
    assert _steps_and_lost(_Lookahead(torch.optim.SGD(model.parameters(), lr=0.1)), model, 3) == (3, 3)


def test_dcp_setting_up_an_optimizer_state_is_no_trained_step() -> None:
    # review s54 (425300a): get/set_optimizer_state_dict step an optimizer with no state at lr 0; that counted
    # 2 steps, and a rollback with nothing trained since the commit lost 2
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    ctx = get_context()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = hvd.elastic.TorchState(model, opt)
    state.commit()
    before = ctx.progress.steps
    saved = get_optimizer_state_dict(model, opt)
    set_optimizer_state_dict(model, torch.optim.AdamW(model.parameters(), lr=1e-3), saved)
    assert ctx.progress.steps == before
    state.restore()
    ctx.ledger.note_rollback()
    assert ctx.ledger.rolled_back == 0


def test_the_sharded_checkpoints_setup_step_is_no_trained_step_and_a_step_at_lr_0_is() -> None:
    from cloud_elastic.worker.durable.parts import _plain_step

    ctx = get_context()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # a warm-up from lr 0 trains from its next step on
    _backward(model, 0)
    before = ctx.progress.steps
    with _plain_step(opt):
        opt.step()
    assert ctx.progress.steps == before
    opt.step()
    assert ctx.progress.steps == before + 1


def test_a_rate_with_no_step_for_a_whole_window_reads_0() -> None:
    # review s54 (425300a): rank 0 stuck before its first step read NaN for ever, and an alert on 0 never fired
    rate = StepRate(window_s=30)
    for t in range(0, 30, 5):
        rate.add(t, 0, "a[0]#1")
        assert rate.known is None  # the process's first window: its first step may be on its way
    for t in range(30, 601, 5):
        rate.add(t, 0, "a[0]#1")
        assert rate.known == 0.0
    rate.add(605, 0, "b[0]#1")  # a new rank 0 has its own first window
    rate.add(610, 0, "b[0]#1")
    assert rate.known is None


def test_the_metric_reads_0_after_a_window_of_heartbeats_with_no_step() -> None:
    now = [0.0]
    server = MetricsServer("job", 0, clock=lambda: now[0])
    server.start()
    try:
        for t in range(0, 601, 5):
            now[0] = float(t)
            server.observe_progress(0, 0, "a[0]#1")
        assert _scraped(server, "cloud_elastic_steps_per_second") == 0.0
    finally:
        server.close()

