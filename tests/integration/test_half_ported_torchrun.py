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
DEFAULT_GROUP = ("ValueError: Default process group has not been initialized, please make sure to call "
                 "init_process_group. (a torch.distributed script? a job has no default process group: use "
                 "hvd.allreduce, hvd.DistributedOptimizer and hvd.rank() instead of dist.*, DDP or DistributedSampler, "
                 "docs/torchrun.md)")

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

_DEFAULT_GROUP_IN_THE_LOOP = """
import torch
import torch.distributed as dist
import cloud_elastic.torch as hvd
hvd.init()
state = hvd.elastic.ObjectState(step=0)

@hvd.elastic.run
def train(state):
    dist.all_reduce(torch.ones(1))

train(state)
"""

_NOT_PORTED = """
import torch
import torch.distributed as dist
dist.all_reduce(torch.ones(1))
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


@pytest.mark.parametrize("script, said", [
    (_DEFAULT_GROUP_IN_THE_LOOP, f") exited with code 1: {DEFAULT_GROUP}"),  # whichever rank ended last
    (_NOT_PORTED, f"(not yet ranked) exited with code 1 after printing: {DEFAULT_GROUP}"),
], ids=["dist.all_reduce in the training function", "dist.all_reduce without hvd.init"])
def test_a_script_that_uses_torchs_default_group_ends_the_job_saying_what_to_change(jobs, tmp_path, script, said):
    """A ``dist.all_reduce`` (or DDP) left in the script meets torch's ``Default process group has not been
    initialized``: the end line now points to docs/torchrun.md, from the worker's exit report (it called
    ``hvd.init()``) and from its output (it never reached the driver)."""
    (tmp_path / "train.py").write_text(script)
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:2", sys.executable, "train.py"], cwd=tmp_path)
    assert job.finish(timeout=50) == 1, job.output()
    last = job.lines[-1]
    assert " failed: all workers failed; last: worker 127.0.0.1[" in last and last.endswith(said), job.output()
