"""Horovod's ``horovod.torch.optimizer``: ``from horovod.torch.optimizer import DistributedOptimizer`` ports by its
import alone."""

from __future__ import annotations

from cloud_elastic.worker.optim.optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
