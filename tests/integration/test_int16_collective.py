"""An int16 collective in a training function ends the job as it would under Horovod: it works.

Gloo carries no int16, and its refusal surfaced in the wait as a collective failure: both workers rolled
back and the round re-formed, 20 rounds in 150 s, with no commit and no end. Now the job succeeds with no
reset, and the sums are exact int16 on every worker.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

_SCRIPT = """
    import torch, cloud_elastic.torch as hvd
    hvd.init()
    model = torch.nn.Linear(2, 1)
    model.register_buffer("counts", torch.full((2,), 7 + hvd.rank(), dtype=torch.int16))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))

    @hvd.elastic.run
    def train(state):
        while state.step < 3:
            opt.zero_grad(); model(torch.ones(1, 2)).sum().backward(); opt.step()
            total = hvd.allreduce(torch.tensor([30000], dtype=torch.int16), op=hvd.Sum)
            state.step += 1; state.commit()
        return total

    total = train(hvd.elastic.TorchState(model, opt, step=0))
    print(f"rank {hvd.rank()} sum {total.dtype} {total.tolist()} counts {model.counts.tolist()}", flush=True)
"""


def _ended_or_rolled_back(job) -> bool:
    out = job.output()
    return "rolling back" in out or "succeeded" in out or "failed" in out


def test_an_int16_allreduce_in_the_training_function_completes_without_a_rollback(jobs, tmp_path):
    script = tmp_path / "int16.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:2", sys.executable, str(script)])
    job.wait_for(_ended_or_rolled_back, timeout=45, what="the job's end or its first rollback")
    assert "rolling back" not in job.output(), job.output()
    assert job.finish(timeout=30) == 0, job.output()
    out = job.output()
    for rank in (0, 1):  # 2 * 30000 wraps, as an int16 sum does; the buffer is rank 0's after the sync
        assert f"rank {rank} sum torch.int16 [-5536] counts [7, 7]" in out, out
    assert "after 0 reset(s)" in job.lines[-1], out
