"""Driver generations beside the checkpoints: of two drivers restarted at the same moment, one runs the job.

Each driver that runs a job whose ``job.json`` exists first claims the next *generation* by creating
``drivers/<generation>.json`` where none is (:meth:`.backend.Backend.create`)::

    drivers/7.json   {"format": "cloud-elastic-checkpoint", "generation": 7, "job_id": "5f3a9c1e",
                      "alive": 1795444453.5, "grace_s": 60.0, "host": "driver-vm", "pid": 4242, ...}

The body is a :class:`~.alive.DriverAlive` (``alive``: when it claimed), read with the same checks and size
bound as ``driver-alive.json``. The generation is one more than the newest claim listed (``job.json``'s
creation is generation 0), so two drivers that looked at the same moment try to create the same name and the
storage lets one of them; the other is told who won. Only the newest :data:`KEEP` claims are kept: the winner of
a generation deletes the older ones.

What this relies on: the create is atomic (see :mod:`.backend`), and a listing shows every create and delete
that finished (local and shared filesystems; S3, GCS and Azure Blob list consistently after a write). Behind a
listing that lagged, a start would try a generation already taken, and be refused, or one already deleted,
and could take it beside the winner of a newer one.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace

from cloud_elastic.checkpoint.alive import DriverAlive, entry_bytes, read_entry
from cloud_elastic.checkpoint.api import CheckpointError
from cloud_elastic.checkpoint.store import CheckpointStore
from cloud_elastic.errors import ConfigError

__all__ = ["CLAIMS", "KEEP", "Claim", "claim", "newest_claim", "renew", "claims_between"]

log = logging.getLogger(__name__)

CLAIMS = "drivers"
#: How many claims stay: the newest is all a start reads; a few more tell an operator who ran the job lately.
KEEP = 8
_NAME = re.compile(r"([1-9][0-9]{0,11})\.json")  # at most 12 digits: a name never makes a huge int


@dataclass(frozen=True)
class Claim:
    """Generation ``generation`` of the job's drivers, and the driver that claimed it (None: unreadable)."""

    generation: int
    driver: DriverAlive | None
    path: str


def newest_claim(store: CheckpointStore) -> Claim | None:
    """The newest claim (None when there is none); CheckpointError when the claims cannot be listed (a start
    that cannot see them cannot take the next one). A claim that cannot be read still counts, driver None."""
    generations = _generations(store)
    return _read(store, generations[-1]) if generations else None


def claim(store: CheckpointStore, generation: int, driver: DriverAlive) -> Claim | None:
    """Create the claim of ``generation`` naming ``driver`` where none is: None when it is ours, else the claim
    there. CheckpointError when the storage refuses the write."""
    path = _path(generation)
    data = entry_bytes(store, path, driver, generation=generation)
    try:
        created = store.backend.create(path, lambda f: f.write(data))
    except ConfigError:  # says what to install; wrapped, it would read as storage trouble
        raise
    except Exception as exc:
        raise CheckpointError(f"could not write {store.backend.url(path)}: {' '.join(str(exc).split())}") from exc
    if not created:
        return _read(store, generation)
    try:
        for old in _generations(store):
            if old <= generation - KEEP:
                store.backend.remove(_path(old))
    except Exception as exc:  # kept a little longer: the next winner deletes them
        log.debug("old driver claims in %s not deleted: %s", store.url, exc)
    return None


def renew(store: CheckpointStore, generation: int, driver: DriverAlive) -> None:
    """Write ``generation``'s claim again with ``driver``'s fresh time: a driver that waits (for a predecessor's
    workers) shows it is still there. CheckpointError when the storage refuses."""
    path = _path(generation)
    data = entry_bytes(store, path, driver, generation=generation)
    try:
        store.backend.write(path, lambda f: f.write(data))
    except Exception as exc:
        raise CheckpointError(f"could not write {store.backend.url(path)}: {' '.join(str(exc).split())}") from exc


def claims_between(store: CheckpointStore, low: int, high: int) -> list[Claim]:
    """The claims of generations ``low`` < g < ``high``, oldest first; CheckpointError when they cannot be listed."""
    return [_read(store, g) for g in _generations(store) if low < g < high]


def _generations(store: CheckpointStore) -> list[int]:
    try:
        names = store.backend.children(CLAIMS)
    except Exception as exc:
        raise CheckpointError(f"could not list {store.backend.url(CLAIMS)}: {' '.join(str(exc).split())}") from exc
    return sorted(int(m.group(1)) for m in map(_NAME.fullmatch, names) if m)


def _read(store: CheckpointStore, generation: int) -> Claim:
    path = _path(generation)
    try:
        driver = read_entry(store, path, "driver claim")
    except CheckpointError as exc:  # being written where the storage has no atomic create, or damaged
        log.warning("%s", exc)
        driver = None
    if driver is not None:
        driver = replace(driver, host=driver.host[:256], raised=())
    return Claim(generation, driver, path)


def _path(generation: int) -> str:
    return f"{CLAIMS}/{generation}.json"
