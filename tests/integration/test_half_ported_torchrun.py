"""A torchrun script ported half-way ends the job with the same pointer to docs/torchrun.md as an unported one.

It calls ``hvd.init()``, so it reaches the driver, and then still calls ``init_process_group()`` or reads
``LOCAL_RANK``. The worker's exit report names what it raised, and that report, not the worker's output,
becomes the end line: the hint that output lines get (``test_examples.py``, the unported script) was
missing there. Two ways in: a script that never enters ``hvd.elastic.run`` (a fixed-size job's end) and one
whose training function reads ``LOCAL_RANK`` (an elastic worker's exit).
"""

from __future__ import annotations

import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

HINT = " (a torchrun script? cloud-elastic sets no RANK or WORLD_SIZE: port it to cloud_elastic.torch, docs/torchrun.md)"

_INIT_LEFT = """
import torch.distributed as dist
import cloud_elastic.torch as hvd
hvd.init()
dist.init_process_group("gloo")
"""

_LOCAL_RANK_IN_THE_LOOP = """
import os
import torch
import cloud_elastic.torch as hvd
hvd.init()
model = torch.nn.Linear(2, 1)
state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1))

@hvd.elastic.run
def train(state):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

train(state)
"""


@pytest.mark.parametrize("script, error", [
    (_INIT_LEFT, "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable "
                 "RANK expected, but not set"),
    (_LOCAL_RANK_IN_THE_LOOP, "KeyError: 'LOCAL_RANK'"),
], ids=["init_process_group after hvd.init", "LOCAL_RANK in the training function"])
def test_a_half_ported_torchrun_script_ends_the_job_saying_what_to_change(jobs, tmp_path, script, error):
    (tmp_path / "train.py").write_text(script)
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:2", sys.executable, "train.py"], cwd=tmp_path)
    assert job.finish(timeout=50) == 1, job.output()
    last = job.lines[-1]
    assert " failed: " in last and f"exited with code 1: {error}{HINT}" in last, job.output()
