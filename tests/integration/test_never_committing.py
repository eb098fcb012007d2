"""A training function inside ``hvd.elastic.run`` that never calls ``state.commit()`` (review s63 rvU finding 2).

It trains, but nothing is kept: after a ``kill -9`` the survivor silently went back to step 0, ``--checkpoint-dir``
never saved, and Ctrl-C said only "interrupted by SIGINT". The driver now says so, three times: once while it
trains (here a checkpoint is due every second), when a rollback goes back to the initial state (how many steps were
lost), and in the interrupt line (nothing was checkpointed). The job is never stopped for it.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest

from tests.integration.harness import worker_on

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SCRIPT = textwrap.dedent('''
    import time, torch
    import cloud_elastic.torch as hvd
    hvd.init()
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))

    @hvd.elastic.run
    def train(state):
        for i in range(100000):
            opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
            state.step = i
            time.sleep(0.02)

    train(hvd.elastic.TorchState(model, opt, step=0))
''')


def test_a_job_that_never_commits_says_so_while_training_at_a_rollback_and_at_its_stop(jobs, tmp_path):
    script = tmp_path / "nocommit.py"
    script.write_text(SCRIPT)
    ckpt = tmp_path / "ckpt"
    job = jobs(["run", "-np", "2", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1", "--checkpoint-dir", str(ckpt),
                "--checkpoint-interval", "1", sys.executable, str(script)])
    warned = job.wait_for(lambda j: next((line for line in j.lines if "and none has committed" in line), None), 45,
                          "the warning that no worker commits")
    assert "a failure rolls every survivor back to the initial state" in warned, warned
    assert "does the training function call state.commit()?" in warned, warned
    os.kill(worker_on(job.job_id(), "127.0.0.2"), signal.SIGKILL)
    lost = job.wait_for(lambda j: next((line for line in j.lines if "went back to the initial state, losing" in line),
                                       None), 30, "the rollback to the initial state")
    assert "no worker has committed" in lost, lost
    job.wait_for(lambda j: any("round 2 formed" in line for line in j.lines), 30, "round 2")
    os.kill(job.proc.pid, signal.SIGINT)
    assert job.finish(40) == 130, job.output()
    last = job.lines[-1]
    assert "interrupted by SIGINT; no commit was ever made" in last and "nothing was checkpointed" in last, last
    out = job.output()
    assert out.count("and none has committed") == 1, out  # said once
    assert not list(ckpt.glob("ckpt-*"))
