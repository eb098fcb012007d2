"""A GAN's two DistributedOptimizers count one step per iteration, not two.

Every optimizer step of the process reached Progress.step, so a script stepping a discriminator's and a
generator's optimizer once per iteration reported twice its steps (status, steps/s, a rollback's steps_lost)
and half its compute time per step (what the straggler rule compares). One iteration is one step of the
round's first optimizer to step (until another steps twice while it does not); the others' steps are
progress only. Standalone mode (rank 0 of 1).
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
    ctx.progress.new_round()  # the loop's first optimizer paces at once
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
    ctx.progress.new_round()
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


def test_the_pacer_keeps_its_clock_across_commits_and_the_first_optimizer_of_a_round_paces() -> None:
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


def _amp_step(opt: torch.optim.Optimizer, model: torch.nn.Module, seed: int, scaler, overflow: bool) -> None:
    """A step through AMP's ``GradScaler``: with inf gradients it does not call ``opt.step`` at all."""
    opt.zero_grad()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))
    loss = F.mse_loss(model(x), x.sum(1, keepdim=True)) * (float("inf") if overflow else 1.0)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize("plan, commit_every, steps, lost", [
    # a discriminator stepped every other iteration, before the generator stepped every iteration: it paced,
    # and each commit made the generator take over again, its step already counted counted twice (18, 15)
    pytest.param(lambda i: "da" if i % 2 == 0 else "a", 2, 12, 2, id="d-every-other-first-commit-2"),
    pytest.param(lambda i: "da" if i % 2 == 0 else "a", 4, 12, 4, id="d-every-other-first-commit-4"),
    # a WGAN: the generator, then the critic 5 times (72, 6 lost); the same steps as "the critic every
    # iteration, the generator every fifth", so the critic's steps, as in the other order
    pytest.param(lambda i: "addddd", 1, 60, 5, id="wgan-generator-then-critic"),
    pytest.param(lambda i: "ddddda", 1, 60, 5, id="wgan-critic-then-generator"),
    # a script that replaces its optimizer for good, the old one kept alive
    pytest.param(lambda i: "a" if i < 6 else "d", 4, 12, 4, id="replaced-optimizer"),
])
def test_the_loops_steps_and_a_rollbacks_steps_lost_are_its_iterations(plan, commit_every, steps, lost) -> None:
    ctx = get_context()
    ctx.progress.new_round()
    models = {k: torch.nn.Linear(4, 1) for k in "ad"}
    opts = {k: _optimizer(m) for k, m in models.items()}
    state = hvd.elastic.TorchState(ma=models["a"], md=models["d"], oa=opts["a"], od=opts["d"])
    state.commit()
    before = ctx.progress.steps
    for i in range(12):
        for k, which in enumerate(plan(i)):
            _step(opts[which], models[which], 100 * i + k)
        if (i + 1) % commit_every == 0 and i + 1 < 12:
            state.commit()
    assert ctx.progress.steps - before == steps  # status's steps, steps/s and the metric
    state.restore()
    ctx.ledger.note_rollback()
    assert ctx.ledger.rolled_back == lost  # the driver's steps_lost: the iterations since the last commit


def test_a_step_amp_skipped_does_not_make_the_other_optimizer_count_an_iteration_twice() -> None:
    """The discriminator's GradScaler step skipped at iterations 3 and 7 (inf gradients: torch's step hook does
    not run): the generator took over, counting its step of iteration 2 again (14 steps, 7 lost)."""
    ctx = get_context()
    ctx.progress.new_round()
    disc, gen = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    opt_d, opt_g = _optimizer(disc), _optimizer(gen)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    state = hvd.elastic.TorchState(disc=disc, gen=gen, opt_d=opt_d, opt_g=opt_g, scaler=scaler)
    state.commit()
    before = ctx.progress.steps
    for i in range(12):
        _amp_step(opt_d, disc, i, scaler, overflow=i in (3, 7))
        _amp_step(opt_g, gen, 100 + i, scaler, overflow=False)
        if i == 5:
            state.commit()
    assert ctx.progress.steps - before == 12
    state.restore()
    ctx.ledger.note_rollback()
    assert ctx.ledger.rolled_back == 6


def test_a_new_gan_after_another_counts_its_first_iteration() -> None:
    """Two loops one after the other in one round (a second phase with new optimizers): the new generator's
    first step is not the old loop's iteration."""
    from cloud_elastic.worker.link.progress import Progress

    p = Progress()
    old_d, old_g, new_d, new_g = object(), object(), object(), object()
    for i in range(3):
        p.step(1.0 + i, old_d), p.step(1.5 + i, old_g)
    for i in range(3):
        p.step(5.0 + i, new_d), p.step(5.5 + i, new_g)
    assert p.steps == 6
