"""The membership flag on a GPU: read by the commit from pinned host memory, after its allreduce only.

``Bucket.finish`` no longer reads the summed flag (a ``.item()`` there made the host
wait for the GPU every step, so the optimizer step's kernels were launched onto an
idle GPU). On CUDA the flag is copied to pinned host memory behind the allreduce
and an event; the commit waits for that event. What a user relies on: the commit
still sees the sum of that step, never a stale one.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(60)]


def test_the_flag_a_commit_reads_on_a_gpu_is_the_sum_of_its_own_step():
    from cloud_elastic.worker.buckets import PendingFlag, make_buckets
    from cloud_elastic.worker.ops import Scaling

    device = torch.device("cuda", 0)
    params = [torch.nn.Parameter(torch.randn(256, 256, device=device)) for _ in range(3)]
    for p in params:
        p.grad = torch.ones_like(p)
    bucket = next(b for b in make_buckets(params, 1 << 20) if b.carries_flag)
    scaling = Scaling()
    big = torch.randn(4096, 4096, device=device)
    for summed in (2.0, 0.0, 5.0, 1.0):
        reduced = bucket.launch_tensor(1.0, scaling)
        for _ in range(20):  # keep the stream busy, so the copy is still queued when finish returns
            big = (big @ big).tanh_()
        reduced[-1].fill_(summed)  # the reduced value lands late on the stream, as an allreduce's would
        flag = bucket.finish(scaling)
        assert isinstance(flag, PendingFlag)
        assert flag.value() == summed
    torch.cuda.synchronize(device)
