"""``hvd.UnsupportedError``: here, with no imports, so the worker's context (``joining``) and the collectives
(``comm.ops``, which re-exports it) raise the one class without importing each other; and the one rule for
Horovod's ``process_set=``, which ``hvd``'s collectives and ``DistributedOptimizer`` share."""

from __future__ import annotations

__all__ = ["NO_PROCESS_SETS", "UnsupportedError", "check_process_set"]

#: Why a process set other than the whole job is refused (``hvd.ProcessSet``, ``add_process_set``, ``process_set=``).
NO_PROCESS_SETS = "no process sets: every collective spans the whole job"


class UnsupportedError(NotImplementedError):
    """A Horovod call that cannot apply to a cloud-elastic job; the message says what to use instead."""


def check_process_set(process_set: object, call: str) -> None:
    """Return if ``process_set`` is the whole job: None, or the set Horovod numbers 0 (``hvd.global_process_set``);
    any other raises UnsupportedError in one line naming ``hvd.<call>``."""
    if process_set is not None and getattr(process_set, "process_set_id", None) != 0:
        raise UnsupportedError(f"hvd.{call}(process_set=...) is not supported by cloud-elastic for any set but "
                               f"hvd.global_process_set ({NO_PROCESS_SETS}): leave process_set out")
