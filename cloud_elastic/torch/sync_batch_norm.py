"""Horovod's ``horovod.torch.sync_batch_norm``: ``from horovod.torch.sync_batch_norm import SyncBatchNorm`` ports by
its import alone."""

from __future__ import annotations

from cloud_elastic.worker.comm.sync_batchnorm import SyncBatchNorm

__all__ = ["SyncBatchNorm"]
