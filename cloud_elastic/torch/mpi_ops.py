"""Horovod's ``horovod.torch.mpi_ops``, so ``from horovod.torch.mpi_ops import Sum, allreduce`` ports by its import
alone: every name of ``hvd`` (``cloud_elastic.torch``), the collectives, ops, sizes and build queries among them."""

from __future__ import annotations

from cloud_elastic.torch import *  # noqa: F401,F403 - the module's names are hvd's
from cloud_elastic.torch import __all__  # noqa: F401
