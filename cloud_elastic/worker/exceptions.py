"""Worker control-flow exceptions, deliberately outside the CloudElasticError tree.

User code that catches ``CloudElasticError`` (or even ``RuntimeError``) must
not swallow the signals the elastic loop depends on, so these derive from
``Exception`` directly and carry Horovod's names as aliases.
"""

from __future__ import annotations

__all__ = ["HostsUpdatedInterrupt", "CollectiveError", "HorovodInternalError", "WorkerRemoved"]


class HostsUpdatedInterrupt(Exception):
    """Membership is changing; raised by ``commit()``/``check_host_updates()`` on every worker at once.

    The state was just committed, so nothing rolls back. ``skip_sync`` keeps
    Horovod's signature; the elastic loop follows the driver's collective
    decision instead (see ``cloud_elastic.driver.job.elastic_job``).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class CollectiveError(Exception):
    """A collective failed or was abandoned (a peer died or stopped answering).

    The elastic loop restores the last commit and re-forms the group.
    """


#: Horovod's name for :class:`CollectiveError`.
HorovodInternalError = CollectiveError


class WorkerRemoved(BaseException):
    """The driver told this worker to leave (its host is going, or the job is ending).

    A ``BaseException`` like ``SystemExit`` so broad ``except Exception`` blocks
    in user code let it through; ``elastic.run`` turns it into a clean exit.
    """
