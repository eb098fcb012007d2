"""Sharded checkpoints of a state that holds two models sharded with ``hvd.shard``, each with its own optimizer
(a GAN's generator and discriminator).

Found in review: such a state could never be checkpointed (``get_optimizer_state_dict`` was given the one
sharded model the code expected), and the job found out only at its end, 61 s later: warnings at each
checkpoint, then "job failed: cannot write the checkpoints ... it holds 2".

One standalone worker, a host of one (``tests/unit/test_sharded_checkpoint.py``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker import sharded
from cloud_elastic.worker.durable.failure import CheckpointFailed
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx

pytestmark = pytest.mark.timeout(90)


def _gan(seed: int, one_optimizer: bool = False):
    hvd.init()
    torch.manual_seed(seed)
    gen = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    disc = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    for model in (gen, disc):
        hvd.shard(model, modules=[m for m in model if isinstance(m, torch.nn.Linear)])
    if one_optimizer:  # one optimizer over both models: no model holds all its parameters
        opt = hvd.DistributedOptimizer(torch.optim.AdamW([*gen.parameters(), *disc.parameters()], lr=0.01))
        return hvd.elastic.TorchState(gen=gen, disc=disc, opt=opt, step=0)
    opt_g = hvd.DistributedOptimizer(torch.optim.AdamW(gen.parameters(), lr=0.01))
    opt_d = hvd.DistributedOptimizer(torch.optim.SGD(disc.parameters(), lr=0.01, momentum=0.9))
    return hvd.elastic.TorchState(gen=gen, disc=disc, opt_g=opt_g, opt_d=opt_d, step=0)


def _train(state, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(state.step))
        state.opt_d.zero_grad()
        (F.softplus(-state.disc(x)).mean() + F.softplus(state.disc(state.gen(x).detach())).mean()).backward()
        state.opt_d.step()
        state.opt_g.zero_grad()
        F.softplus(-state.disc(state.gen(x))).mean().backward()
        state.opt_g.step()
        state.step += 1
        state.commit()


def _values(state) -> list[torch.Tensor]:
    out = []
    for model, opt in ((state.gen, state.opt_g), (state.disc, state.opt_d)):
        out += [p.to_local().clone() for p in model.parameters()]
        for p in model.parameters():
            out += [sharded.local(v).clone() for _, v in sorted(opt.state[p].items())]
    return out


def test_each_optimizer_is_written_with_its_own_model_and_a_fresh_worker_loads_both_bitwise(tmp_path):
    state, ctx = _gan(0), _ctx()
    _train(state, 3)
    ctx.ledger.commit_seq = 3
    assert _checkpoints(tmp_path, ctx).finish(state) is None  # before the fix: "... it holds 2"
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [3]
    written = _values(state)

    other = _gan(7)
    assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 3
    assert other.step == 3 and all(torch.equal(a, b) for a, b in zip(_values(other), written))


def test_an_optimizer_no_sharded_model_holds_ends_the_job_at_its_first_write_in_one_line(tmp_path):
    state, ctx = _gan(0, one_optimizer=True), _ctx()
    with pytest.raises(CheckpointFailed, match=r"optimizer 'opt' has no such model in the state \(sharded models: "
                                               r"disc, gen\)") as caught:
        _checkpoints(tmp_path, ctx).after_commit(state)  # the first commit's write, not the end of a long job
    assert "\n" not in str(caught.value)
