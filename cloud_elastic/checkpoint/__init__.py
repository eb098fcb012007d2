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
from cloud_elastic.checkpoint.payload import check_payload, load_state_payload, state_payload
from cloud_elastic.checkpoint.store import CheckpointStore, read_job_record, write_job_record
from cloud_elastic.checkpoint.writer import CheckpointWriter, PeriodicCheckpointer, WriterStats

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
