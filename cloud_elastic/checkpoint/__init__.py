"""Durable checkpoints: a store (local directory or fsspec URL), a background writer, state payloads.

::

    store = CheckpointStore("s3://bucket/jobs/resnet", keep=2)
    with CheckpointWriter(store) as writer:
        ...
        state.commit()
        writer.submit(step, state_payload(state), {"epoch": state.epoch, "world_size": size})
    latest = store.latest()          # Checkpoint(info, payload) or None
    load_state_payload(state, latest.payload)

See docs/checkpoints.md for the layout, the format and loading a checkpoint
without cloud-elastic.
"""

from cloud_elastic.checkpoint.api import (
    FORMAT_VERSION,
    Checkpoint,
    CheckpointBackendMissing,
    CheckpointBackendTooOld,
    CheckpointError,
    CheckpointInfo,
    CheckpointMismatch,
    DurableJobRecord,
)
from cloud_elastic.checkpoint.store import CheckpointStore, read_job_record, write_job_record

#: Names imported at their first use (PEP 562): their modules import torch, which the driver, which opens the store
#: and never a payload, then does not (about 1.2 CPU-seconds of a driver's start with --checkpoint-dir).
_LAZY = {"check_payload": "payload", "load_state_payload": "payload", "state_payload": "payload",
         "CheckpointWriter": "writer", "PeriodicCheckpointer": "writer", "WriterStats": "writer"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointBackendMissing",
    "CheckpointBackendTooOld",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointMismatch",
    "CheckpointStore",
    "CheckpointWriter",
    "DurableJobRecord",
    "PeriodicCheckpointer",
    "WriterStats",
    "check_payload",
    "load_state_payload",
    "read_job_record",
    "state_payload",
    "write_job_record",
]
