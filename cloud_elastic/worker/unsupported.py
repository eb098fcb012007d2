"""``hvd.UnsupportedError``: here, with no imports, so the worker's context (``joining``) and the collectives
(``comm.ops``, which re-exports it) raise the one class without importing each other."""

from __future__ import annotations

__all__ = ["UnsupportedError"]


class UnsupportedError(NotImplementedError):
    """A Horovod call that cannot apply to a cloud-elastic job; the message says what to use instead."""
