"""One GPU, NCCL: a training step under DistributedOptimizer never makes the host wait for the GPU.

A host that waits mid-step loses its lead over the GPU, and the GPU then idles
while the host launches the rest of the step: on an H100 whose host barely kept
ahead, the membership flag's write into the first gradient bucket (a copy of a
host scalar, which waits for the stream) stalled every backward. Only the commit
reads anything back (the flag's sum), by design. ``torch.cuda.set_sync_debug_mode
("error")`` makes any synchronizing call of ``zero_grad``, forward, backward or
``step()`` raise, and the probe reports which.
"""

from __future__ import annotations

import pytest

from tests.gpu.support import env, probe

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


def test_zero_grad_forward_backward_and_step_never_wait_for_the_gpu(jobs, gpu_report):
    job = jobs(["run", "-np", "1", "-H", "127.0.0.1:1", *probe("--steps", "12", "--sync-check", "8",
                                                             "--step-sleep", "0")], env=env())
    assert job.finish(90) == 0, job.output()
    [hello] = job.of("hello")
    assert hello["backend"] == "nccl", hello
    checks = job.of("syncs")
    assert [e["step"] for e in checks] == list(range(2, 10)), checks
    assert all(e["error"] is None for e in checks), [e["error"] for e in checks if e["error"]]
    gpu_report(f"{len(checks)} steps of zero_grad, forward, backward and step() with no host-device synchronization")
