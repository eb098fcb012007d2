"""Horovod's build queries (``hvd.nccl_built()`` ...), answered for the torch this process runs.

Horovod answers for how Horovod itself was compiled; cloud-elastic has no
compiled part and runs its collectives on ``torch.distributed``, so each
answer is what the running torch provides. ``*_enabled()`` say what this
job uses: Gloo or NCCL, never MPI. None of them needs ``init()``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["nccl_built", "gloo_built", "mpi_built", "cuda_built", "rocm_built", "gloo_enabled", "mpi_enabled",
           "mpi_threads_supported"]


def nccl_built() -> int:
    """NCCL's version code (e.g. 22809 for 2.28.9, Horovod's ``NCCL_VERSION_CODE``) if torch has NCCL, else 0."""
    if not dist.is_available() or not dist.is_nccl_available():
        return 0
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # NCCL is there but will not say which: still true
        return 1
    if isinstance(version, tuple):
        major, minor, patch = (tuple(version) + (0, 0, 0))[:3]
        return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch
    return int(version)


def gloo_built() -> bool:
    """Whether torch has the Gloo backend (cloud-elastic's on CPU)."""
    return dist.is_available() and dist.is_gloo_available()


def mpi_built() -> bool:
    """Whether torch has the MPI backend (cloud-elastic never uses it)."""
    return dist.is_available() and dist.is_mpi_available()


def cuda_built() -> bool:
    """Whether the running torch was built with CUDA (not whether a GPU is present)."""
    return torch.backends.cuda.is_built() and torch.version.hip is None


def rocm_built() -> bool:
    """Whether the running torch was built for ROCm."""
    return torch.version.hip is not None


def gloo_enabled() -> bool:
    """Whether this worker's collectives run on Gloo (True without ``init()`` unless CUDA is available)."""
    from cloud_elastic.worker.context import is_initialized, get_context

    if is_initialized():
        return get_context().backend == "gloo"
    return not torch.cuda.is_available()


def mpi_enabled() -> bool:
    """Always False: cloud-elastic's collectives run on Gloo or NCCL."""
    return False


def mpi_threads_supported() -> bool:
    """Raises ValueError as Horovod does when MPI is not in use (it never is here)."""
    raise ValueError("cloud-elastic does not use MPI (its collectives run on Gloo or NCCL)")
