"""What the elastic job asks of its runtime, and the numbers that steer it.

:class:`~.elastic_job.ElasticJob` decides and the runtime (:mod:`cloud_elastic.driver.runtime`) carries out:
the job queues :data:`Action` values (:class:`Launch`, :class:`Stop`,
:class:`Release`, :class:`SetCapacity`, :class:`Finish`) and the driver's loop takes them. All are
frozen dataclasses; :class:`Policy` is the job's configuration, fixed for its
life; :class:`Phase` is where the job as a whole stands. Nothing here does
anything: these are the words the job and the driver share.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.providers.sources import SourceSpec

__all__ = ["Policy", "Phase", "Launch", "Stop", "Release", "SetCapacity", "Finish", "Action", "INTERRUPTED"]


@dataclass(frozen=True)
class Policy:
    """The numbers that steer the job (from :class:`~cloud_elastic.config.JobConfig`)."""

    num_proc: int
    min_np: int
    max_np: int
    reset_limit: int | None = None
    elastic_timeout_s: float = 600.0
    start_timeout_s: float = 600.0
    heartbeat_timeout_s: float = 5.0
    #: ``--finish-timeout``: once training completed, workers still working this long (a final save, an evaluation)
    #: are stopped and the job fails; None: the job waits for them as long as they heartbeat (as horovodrun does).
    finish_timeout_s: float | None = None
    #: A durable checkpoint can bring the state back when no worker holds it.
    checkpointing: bool = False
    #: ``--checkpoint-interval``: how often rank 0 checkpoints (with ``checkpointing``; see :mod:`.no_commit`).
    checkpoint_interval_s: float = 300.0
    #: A draining host's workers still in their round this long before its deadline are removed by force.
    deadline_margin_s: float = 5.0
    #: A round in which no member makes progress this long is aborted (``--progress-timeout``; 0: never).
    progress_timeout_s: float = 120.0
    #: A member whose compute time per step stays this many times the round's median for ``straggler_window_s``
    #: is drained (``--straggler-factor``; 0: never).
    straggler_factor: float = 2.0
    straggler_window_s: float = 60.0
    #: ``--whole-hosts``: each host's this many slots start, join rounds and leave together (0: off).
    whole_host_slots: int = 0
    #: ``--restarts``: a fixed-size job (a script without ``hvd.elastic.run``) starts again after a failure
    #: up to this many times (see :mod:`.fixed_size`).
    restarts: int = 0
    #: The host sources of a job with several (see :mod:`.sourcing`); empty for one source.
    sources: tuple[SourceSpec, ...] = ()
    #: ``--fallback-after``: below -np from the other sources this long, the fallback tops the job up to -np.
    fallback_after_s: float | None = None
    #: ``--manage-capacity``: the job raises a fallback group's desired capacity when it needs its hosts.
    manage_capacity: bool = False
    #: ``--spares``: up to this many workers (whole hosts under ``--whole-hosts``) beyond ``max_np`` start and
    #: wait at rendezvous, outside the rounds, to take a lost or leaving member's place (see :mod:`.spares`).
    spares: int = 0
    #: Newcomers are admitted through a planned next round whose group forms in the background (see
    #: :mod:`.next_round`); off, the running round is asked to change as soon as one is ready. The driver
    #: turns it on; the core's rules without it are those of every admission that cannot be planned.
    plan_admissions: bool = False
    #: The host source can never add a host or a slot (a fixed ``-H`` list): see :meth:`.capacity.Capacity.check`.
    hosts_fixed: bool = False


class Phase(enum.Enum):
    STARTING = "starting"  # waiting for -np slots / the first round
    RUNNING = "running"
    FINISHING = "finishing"  # a worker's training function returned
    DONE = "done"


@dataclass(frozen=True)
class Launch:
    """Start a worker with this id on this slot."""

    slot: Slot
    worker_id: str


@dataclass(frozen=True)
class Stop:
    """Stop a worker's process group (``immediate`` = KILL at once; ``stacks``: ask the process for its
    Python stacks by signal first, a second before the KILL: it is being given up as stuck or silent)."""

    worker_id: str
    reason: str
    immediate: bool = False
    stacks: bool = False


@dataclass(frozen=True)
class Release:
    """The job no longer needs draining ``host``: let the cloud take it (``HostDiscovery.release``)."""

    host: str
    instance: str | None


@dataclass(frozen=True)
class SetCapacity:
    """Set the desired capacity of host source ``source``'s group to ``hosts`` (``HostDiscovery.set_capacity``)."""

    source: str
    hosts: int


#: The exit codes of a job a signal stopped (SIGHUP, SIGINT, SIGTERM: 128 + the signal's number).
INTERRUPTED = (129, 130, 143)


@dataclass(frozen=True)
class Finish:
    """The job is over: stop everything and exit with ``exit_code``."""

    success: bool
    reason: str
    exit_code: int


Action = Union[Launch, Stop, Release, SetCapacity, Finish]
