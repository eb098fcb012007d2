"""A torch.compile'd optimizer step whose ``step`` runs its parent's counts once (steps/s, a rollback's steps_lost).

Dynamo calls the step hooks from its resume function inside torch's step wrapper: found by the caller's code
object, the inner ``super().step()`` counted as an outermost step too (5 compiled steps counted 10). Here, in
the jobs lane, because compiling takes tens of seconds on a loaded machine (worker/steps.py).
"""

from __future__ import annotations

import pytest
import torch

from cloud_elastic.worker.steps import count_steps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_compiled_nested_step_counts_once():
    counted = [0]
    count_steps(lambda optimizer: counted.__setitem__(0, counted[0] + 1))

    class Clipped(torch.optim.Adam):
        def step(self, closure=None):
            return super().step(closure)

    model = torch.nn.Linear(4, 1)
    torch.optim.Adam(torch.nn.Linear(2, 1).parameters())  # a plain Adam alive too, as in a GAN
    opt = Clipped(model.parameters(), lr=0.01)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    step = torch.compile(opt.step, backend="eager")
    for _ in range(5):
        step()
    assert counted[0] == 5
