"""What the checkpoint package hands out: its errors, the manifest and the job record.

Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from cloud_elastic.errors import CheckpointError, ConfigError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "SHARDED_FORMAT_VERSION",
    "FROZENSET_FORMAT_VERSION",
    "READ_VERSION",
    "CheckpointError",
    "CheckpointBackendMissing",
    "CheckpointBackendTooOld",
    "CheckpointMismatch",
    "StateDictMismatch",
    "CheckpointInfo",
    "Checkpoint",
    "DurableJobRecord",
]

#: Written into every manifest and job record; a reader refuses other formats.
FORMAT = "cloud-elastic-checkpoint"
#: Bumped when the layout or the manifest changes incompatibly; readers refuse newer versions.
FORMAT_VERSION = 1
#: The version of a sharded checkpoint's manifest (``hvd.shard``: torch DCP data beside ``state.pt``),
#: so that a reader from before sharded checkpoints refuses one rather than load half of it. Its
#: ``shards.sha256`` (each shard file's digest, with DCP's metadata as JSON beside them) is newer: a
#: manifest without it is listed but never loaded, as its shards load only by unpickling DCP's ``.metadata``.
SHARDED_FORMAT_VERSION = 2
#: The version of a manifest whose payload holds a ``frozenset`` (``plain_numpy``'s tagged tuple), sharded or
#: not, so that a reader from before them refuses it as of a newer format rather than call the tag forged.
#: Other checkpoints keep their version, readable by older cloud-elastics.
FROZENSET_FORMAT_VERSION = 3
#: The newest version this cloud-elastic reads.
READ_VERSION = FROZENSET_FORMAT_VERSION


class CheckpointBackendMissing(CheckpointError, ConfigError):
    """The fsspec implementation for a checkpoint URL is not installed; the message names the pip extra."""

    def __init__(self, url: str, package: str, extra: str | None) -> None:
        how = f"pip install 'cloud-elastic[{extra}]'" if extra else f"pip install {package}"
        super().__init__(f"checkpoint URL {url!r} needs the {package!r} package; install it with: {how}")
        self.package = package
        self.extra = extra


class CheckpointBackendTooOld(CheckpointError, ConfigError):
    """The installed fsspec implementation for a checkpoint URL lacks what cloud-elastic needs of it (a
    create-if-absent); the message names the packages, their installed versions and the versions needed."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint, read intact, does not fit the state it was to be loaded into (another model, another
    optimizer, other attributes): ``first`` names the first mismatch, in one bounded line. The state is left at
    its last commit and the checkpoint as it was: loading it again can only fail the same way."""

    def __init__(self, first: str) -> None:
        super().__init__(f"the checkpoint does not fit this state ({first})")
        self.first = first


class StateDictMismatch(ValueError):
    """What a ``load_state_dict`` of ours raises when the saved state is of another object (an ``ElasticSampler``
    of another dataset size, seed or shuffling): a ValueError, as it was, that a checkpoint's load recognises by its
    type and reports as a :class:`CheckpointMismatch` (``checkpoint.payload``)."""


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint's manifest: what was saved, when, and the digest of its data.

    ``name`` is the checkpoint's folder under the store's URL and ``url`` its
    full address; ``size`` and ``sha256`` describe the data object
    (``data_name`` inside the folder), which is ``torch.save`` output.
    """

    name: str
    url: str
    step: int
    created: float
    size: int
    sha256: str
    data_name: str = "state.pt"
    epoch: int | None = None
    world_size: int | None = None
    job_id: str | None = None
    format_version: int = FORMAT_VERSION
    torch_version: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: A sharded checkpoint's torch DCP files (below ``SHARDS_DIR`` in its folder) and their sizes; None
    #: for a replica's checkpoint.
    shards: Mapping[str, int] | None = None
    #: How many workers wrote the shards (the slots of the host that wrote it); None for a replica's.
    shard_count: int | None = None
    #: The SHA-256 of each shard file (hex); None for a replica's, or a sharded one from before digests.
    shard_digests: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: its manifest and the loaded payload (tensors and plain data)."""

    info: CheckpointInfo
    payload: Any


@dataclass(frozen=True)
class DurableJobRecord:
    """What a restarted driver needs to know about the job, stored in clear beside the checkpoints.

    Never put the job's secret here: anyone who can read the checkpoint
    location can read this record. ``extra`` holds JSON values; keys that
    mention a secret are refused.
    """

    job_id: str
    command: tuple[str, ...]
    created: float
    format_version: int = FORMAT_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)
