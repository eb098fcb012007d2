"""A GAN's two DistributedOptimizers count one step per iteration, not two.

Every optimizer step of the process reached Progress.step, so a script stepping a discriminator's and a
generator's optimizer once per iteration reported twice its steps (status, steps/s, a rollback's steps_lost)
and half its compute time per step (what the straggler rule compares). One iteration is one step of the
round's first optimizer to step; the others' steps are progress only. Standalone mode (rank 0 of 1).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.link import progress as progress_module

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()


class Clock:
    """``time`` for worker/link/progress.py: the test says when each step ends."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                    named_parameters=model.named_parameters())


def _step(opt: torch.optim.Optimizer, model: torch.nn.Module, seed: int) -> None:
    opt.zero_grad()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()


def test_a_gan_counts_one_step_per_iteration_and_the_whole_iteration_as_its_compute_time(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(progress_module, "time", clock)
    disc, gen = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    opt_d, opt_g = _optimizer(disc), _optimizer(gen)
    state = hvd.elastic.TorchState(disc=disc, gen=gen, opt_d=opt_d, opt_g=opt_g, step=0)
    ctx = get_context()
    state.commit()
    before = ctx.progress.steps
    for i in range(10):
        clock.now += 0.8
        _step(opt_d, disc, i)  # the discriminator's update
        clock.now += 0.2
        _step(opt_g, gen, 100 + i)  # the generator's
    assert ctx.progress.steps == before + 10  # what heartbeats report: status's and the metric's steps/s
    assert ctx.progress.compute_s() == pytest.approx(1.0)  # an iteration, not half of one
    state.restore()
    ctx.ledger.note_rollback()  # as the run loop does: the driver hears it as the rollback's steps_lost
    assert ctx.ledger.rolled_back == 10


def test_a_new_optimizer_while_the_old_one_lives_still_counts_every_step() -> None:
    ctx = get_context()
    model = torch.nn.Linear(4, 1)
    first = _optimizer(model)
    before = ctx.progress.steps
    for i in range(3):
        _step(first, model, i)
    second = _optimizer(model)  # the script switches optimizers; ``first`` is still referenced
    for i in range(4):
        _step(second, model, i)
    assert ctx.progress.steps == before + 7
    assert first is not second


def test_the_pacer_keeps_its_clock_across_commits_and_the_first_optimizer_after_a_commit_paces() -> None:
    from cloud_elastic.worker.link.progress import Progress

    p, disc, gen = Progress(), object(), object()
    for i in range(6):  # a GAN committing once per iteration
        p.step(10.0 + i, disc)
        p.step(10.2 + i, gen)
        p.committed()
    assert (p.steps, p.compute_s()) == (6, 1.0)
    p.new_round()
    for i in range(4):  # the next round's loop happens to step the generator first
        assert p.step(20.0 + i, gen) == 1 and p.step(20.5 + i, disc) == 0
    assert p.steps == 10
