"""``optimizer.step(closure)``, torch's closure form, trains the replicas as one: the same state on every worker.

The closure runs the forward and backward inside ``step()``, after the step's own gradient averaging: each
worker's optimizer read its own gradients, and two workers ended with different weights under a job that said
"succeeded" (SGD, Adam and LBFGS alike). Now every call of the closure is averaged (``worker/optim/closure.py``):
the workers end bit-identical, and at the state one process reaches on both workers' data at once (the mean of two
equal batches' gradients is the gradient of their union), LBFGS included, whose line search calls the closure as
often as the (now averaged) loss says.
"""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

_SCRIPT = """
    import copy, hashlib, sys
    import torch, torch.nn.functional as F
    import cloud_elastic.torch as hvd

    kind = sys.argv[1]
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    alone = copy.deepcopy(model)  # one process on both workers' data: what the job must reach

    def make(params):
        if kind == "lbfgs":
            return torch.optim.LBFGS(params, lr=0.5, max_iter=4, history_size=3, line_search_fn="strong_wolfe")
        if kind == "adam":
            return torch.optim.Adam(params, lr=0.05)
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)

    opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters())
    ref = make(alone.parameters())

    def closure_for(net, optimizer, x, y):
        def closure():
            optimizer.zero_grad()
            loss = F.mse_loss(net(x), y)
            loss.backward()
            return loss
        return closure

    def batch(rank, step):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 4, generator=g)
        return x, x.sum(1, keepdim=True).sin() + 0.1 * rank

    @hvd.elastic.run
    def train(state):
        losses = []
        while state.step < 6:
            x, y = batch(hvd.rank(), state.step)
            losses.append(float(opt.step(closure_for(model, opt, x, y))))
            state.step += 1
            state.commit()
        return losses

    losses = train(hvd.elastic.TorchState(model, opt, step=0))
    ref_losses = []
    for step in range(6):
        xs, ys = zip(*(batch(rank, step) for rank in range(hvd.size())))
        ref_losses.append(float(ref.step(closure_for(alone, ref, torch.cat(xs), torch.cat(ys)))))
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
    off = max((p - q).abs().max().item() for p, q in zip(model.parameters(), alone.parameters()))
    loss_off = max(abs(a - b) for a, b in zip(losses, ref_losses))
    print(f"rank {hvd.rank()} digest {digest} off {off:.3e} loss_off {loss_off:.3e}", flush=True)
"""


@pytest.mark.parametrize("kind", ["sgd", "lbfgs"])
def test_step_with_a_closure_averages_each_call_and_the_replicas_stay_one(jobs, tmp_path, kind):
    script = tmp_path / "closure.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1,127.0.0.2", sys.executable, str(script), kind])
    assert job.finish(timeout=75) == 0, job.output()
    out = job.output()
    found = dict(re.findall(r"rank (\d) digest (\w+) off", out))
    assert set(found) == {"0", "1"}, out
    assert found["0"] == found["1"], out  # the same weights, bit for bit, on both workers
    for off, loss_off in re.findall(r"off (\S+) loss_off (\S+)", out):
        assert float(off) < 1e-4, out  # the state of one process trained on both workers' batches
        assert float(loss_off) < 1e-4, out  # the loss step() returns is the workers' mean
    assert "rolling back" not in out, out
