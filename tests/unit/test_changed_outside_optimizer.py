"""A parameter changed in place outside the optimizer between commits (a WGAN clip, normalised prototypes).

What a user relies on: such a loop keeps training through a peer's failure, restoring
exactly its last commit, instead of ending with "training state lost" (the live parameters
were changed before the update, so a commit kept in place no longer holds them; from the
step where the change is seen on, commits copy the parameters when they are made). And
the driver, when no survivor holds the commit, names both causes it may have.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context
from tests.unit.test_job import KILLED, failed
from tests.unit.test_in_place_commit import _values
from tests.unit.test_job_commit_lost import _arrive, _three_committed
from tests.unit.test_state_replace import _model

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()


def _clip(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.clamp_(-0.2, 0.2)


def _backward(model, opt, seed: int) -> None:
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()


def _iteration(model, opt, seed: int) -> None:
    _clip(model)  # at the start of each iteration, as WGAN's critic loop does
    _backward(model, opt, seed)
    opt.step()


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _clipping(make, steps: int):
    """A model, its DistributedOptimizer and TorchState after ``steps`` clipped iterations, each committed."""
    model = _model()
    opt = hvd.DistributedOptimizer(make(model.parameters()))
    state = hvd.elastic.TorchState(model, opt, step=0)
    for seed in range(steps):
        _iteration(model, opt, seed)
        state.commit()
    return model, opt, state


@pytest.mark.parametrize("optimizer", ["sgd-momentum", "adamw"])
@pytest.mark.parametrize("confirmed_first", [False, True])
def test_a_failure_after_the_change_was_seen_restores_the_commit_exactly(optimizer, confirmed_first, caplog):
    caplog.set_level(logging.WARNING, logger="cloud_elastic")
    make = {"sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
            "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01)}[optimizer]
    model = _model()
    opt = hvd.DistributedOptimizer(make(model.parameters()))
    state = hvd.elastic.TorchState(model, opt, step=0)
    seeds = iter(range(100))
    if confirmed_first:  # the clipping starts later (after warm-up): the loop was confirmed in place by then
        for _ in range(3):
            _backward(model, opt, next(seeds))
            opt.step()
            state.commit()
    for _ in range(3):
        _iteration(model, opt, next(seeds))
        state.commit()
    assert "changed in place outside the optimizer" in caplog.text
    ledger = get_context().ledger
    for kill in ("in backward", "after the update"):
        committed = _values(model, opt)
        _clip(model)
        _backward(model, opt, next(seeds))  # a peer dies in this gradient allreduce...
        if kill == "after the update":
            opt.step()  # ...or in a collective between step() and commit()
            hvd.allreduce(torch.ones(1), name="loss")
        state.restore()
        assert ledger.holds_commit
        assert _equal(_values(model, opt), committed)
        opt._ce_clear()


def test_the_first_window_is_restored_from_its_whole_copy_and_the_loop_trains_on_exactly():
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, step=0)
    committed = _values(model, opt)
    _clip(model)
    _backward(model, opt, 0)  # the first window: a peer dies in its allreduce
    state.restore()
    assert get_context().ledger.holds_commit and _equal(_values(model, opt), committed)
    opt._ce_clear()
    for seed in range(4):
        _iteration(model, opt, seed)
        state.commit()
        _iteration(reference, ref_opt, seed)
    assert _equal(_values(model, opt), _values(reference, ref_opt))  # bitwise the optimizer's own steps


@pytest.mark.commit_mode("snapshot")
def test_kept_commits_copy_the_parameters_at_the_commit_once_a_change_is_seen():
    model, opt, state = _clipping(lambda ps: torch.optim.AdamW(ps, lr=0.01), 3)
    committed = _values(model, opt)
    _clip(model)  # before the update copied what the commit deferred
    _backward(model, opt, 7)
    opt.step()
    state.restore()
    assert _equal(_values(model, opt), committed)


def test_a_loop_that_changes_nothing_outside_stays_in_place(caplog):
    caplog.set_level(logging.WARNING, logger="cloud_elastic")
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    state = hvd.elastic.TorchState(model, opt, step=0)
    for seed in range(4):
        _backward(model, opt, seed)
        opt.step()
        state.commit()
    assert all(h.in_place for h in opt._ce_snapshots)
    assert "outside the optimizer" not in caplog.text


def test_the_driver_names_both_causes_when_no_survivor_holds_the_commit() -> None:
    sim = _three_committed()
    sim.exit("c[0]", KILLED)
    _arrive(sim, "a[0]", 6, holds_commit=False)
    _arrive(sim, "b[0]", 6, holds_commit=False)
    failed(sim, "training state lost", "could restore the last commit exactly",
           "a parameter was first changed in place outside the optimizer", "in-place optimizer update")
