"""``hvd.SyncBatchNorm``: batch normalization over the batch of every worker of the round.

``torch.nn.SyncBatchNorm`` needs torch's default process group, which a
cloud-elastic job never has (each round forms a group of its own), and
Horovod's runs only on GPUs (torch's ``batch_norm_stats`` kernels have no
CPU implementation). This one works on any device: in training, each worker
computes its batch's count, mean and sum of squared deviations per channel,
one allgather (through the round's abortable path, like every collective
here) gives every worker all of them, and they are combined with Chan's
parallel formula, which stays exact where ``E[x²] - E[x]²`` would cancel.
Everything is an ordinary differentiable torch operation except the
allgather, whose backward sums the gradients of the gathered statistics
over the workers (one allreduce), so the input gradient is that of the
loss summed over workers, as with ``torch.nn.SyncBatchNorm``.

Running statistics are updated with the global mean and the unbiased global
variance, so every worker keeps the same ones. In evaluation (with running
statistics) it is a plain local batch norm, with no collective.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from cloud_elastic.worker.context import get_context

__all__ = ["SyncBatchNorm"]


class _AllgatherRows(torch.autograd.Function):
    """Stack every worker's 1-D ``local`` (same length everywhere) into a (size, n) tensor; differentiable."""

    @staticmethod
    def forward(fn_ctx: Any, local: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        send = local.detach().contiguous()
        rows = [torch.empty_like(send) for _ in range(ctx.info.size)]
        ctx.wait(ctx.group("sync batch norm").allgather([rows], [send]), "sync batch norm", host=False)
        fn_ctx.rank = ctx.info.rank
        return torch.stack(rows)

    @staticmethod
    def backward(fn_ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        # Every worker's loss depends on every row: this row's gradient is the sum of theirs.
        ctx = get_context()
        total = grad.contiguous().clone()
        ctx.wait(ctx.group("sync batch norm backward").allreduce([total]), "sync batch norm backward", host=False)
        return total[fn_ctx.rank]


class SyncBatchNorm(_BatchNorm):
    """Horovod's ``SyncBatchNorm(num_features, eps, momentum, affine, track_running_stats)``, on any device.

    Input of shape ``(N, C, ...)``; in training the statistics are those of
    the batches of all workers together (batches may differ in size). Raises
    ValueError, on every worker alike, when the workers together have at most
    one value per channel.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected an input of at least 2 dimensions (N, C, ...), got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average, as in torch's BatchNorm
                factor = 1.0 / float(self.num_batches_tracked)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        if get_context().info.size == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, True, factor, self.eps)
        return self._synchronized(input, factor)

    def _synchronized(self, input: torch.Tensor, factor: float) -> torch.Tensor:
        channels = input.shape[1]
        x = input if input.dtype in (torch.float32, torch.float64) else input.float()  # statistics at least in float32
        dims = [0] + list(range(2, x.dim()))
        shape = [1, channels] + [1] * (x.dim() - 2)
        count = x.numel() // channels
        if count:
            mean = x.mean(dims)
            m2 = (x - mean.view(shape)).square().sum(dims)
        else:  # an empty batch on this worker contributes nothing
            mean = m2 = x.new_zeros(channels)
        stats = _AllgatherRows.apply(torch.cat([mean, m2, x.new_full((1,), float(count))]))
        means, m2s, counts = stats[:, :channels], stats[:, channels:2 * channels], stats[:, 2 * channels:]
        total = counts.sum()
        if float(total) <= 1:
            raise ValueError(f"SyncBatchNorm: expected more than 1 value per channel over all workers, got {int(total)}")
        global_mean = (counts * means).sum(0) / total
        global_m2 = m2s.sum(0) + (counts * (means - global_mean).square()).sum(0)
        var = global_m2 / total
        if self.training and self.track_running_stats:
            assert self.running_mean is not None and self.running_var is not None
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(global_mean.detach().to(self.running_mean.dtype), alpha=factor)
                unbiased = (global_m2 / (total - 1)).detach().to(self.running_var.dtype)
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        y = (x - global_mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.weight is not None:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(input.dtype)
