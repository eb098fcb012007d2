"""What the last sharded checkpoint a worker of host 0 wrote (or loaded) holds, and whether its live state is still
exactly that: ``ShardedCheckpoints.finish`` skips the final write only then.

Why a digest of the values, not "no optimizer step since the last commit": after its last commit a training function
may still change what a checkpoint holds without a step (an EMA or SWA swap, the best weights loaded back,
``p.data.mul_(0.5)``, a BatchNorm forward in train mode, a learning rate set by hand), and a tensor's version counter
misses writes through ``.data``. So each write digests what it wrote, from the write's own copy on the writer's
thread (:func:`digest`: SHA-256 of this worker's DCP state dicts, every tensor's bytes with its key, dtype and shape,
and every other value there, an optimizer's param groups), and the end of training digests the live state the same
way. Equal digests, on every worker of the host, and on local rank 0 equal other values (``state.pt``), are the one
proof that the checkpoint holds the final state; anything else (a value with no exact digest here, a failure while
reading) counts as different, and the final state is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Callable
from typing import Any

import torch

from cloud_elastic.checkpoint.payload import stage_payload, state_payload
from cloud_elastic.worker.durable.parts import same_payload, sharded_parts

__all__ = ["Stored", "digest"]


@dataclasses.dataclass(frozen=True)
class Stored:
    """A checkpoint of commit ``seq`` that this worker wrote (or loaded): the :func:`digest` of its DCP state
    dicts (None: unknown, never equal to any), and on local rank 0 a copy of the state's other values."""

    seq: int
    digest: str | None
    rest: Any = None

    @classmethod
    def loaded(cls, state: Any, seq: int, local_rank_0: bool, mark: Callable[[], None] | None = None) -> "Stored":
        """The live ``state``, just loaded from the checkpoint of commit ``seq``: what that checkpoint holds (one pass
        over this worker's part of it, ``mark`` called after each tensor). Unknown (never held) where it cannot be
        read."""
        try:
            tensors, skip = sharded_parts(state)
            return cls(seq, digest(tensors, mark), stage_payload(state_payload(state, skip)) if local_rank_0 else None)
        except Exception:  # noqa: BLE001 - the load succeeded: at worst the end of training writes it again
            return cls(seq, None)

    def holds(self, state: Any, seq: int, local_rank_0: bool, mark: Callable[[], None] | None = None) -> bool:
        """Whether ``state``, at commit ``seq``, is bitwise what this checkpoint holds, as far as this worker sees:
        its shards, buffers and optimizer state (and, on ``local_rank_0``, the other values). One pass over this
        worker's part of the state (a GPU's tensors copied to host memory one at a time, ``mark`` called after
        each). Never raises: a state it cannot read is not held, and the write that follows says what is wrong."""
        if self.digest is None or seq != self.seq:
            return False
        try:
            tensors, skip = sharded_parts(state)
            if digest(tensors, mark) != self.digest:
                return False
            return not local_rank_0 or same_payload(state_payload(state, skip), self.rest)
        except Exception:  # noqa: BLE001 - not held: the final write then runs, and reports its own failure
            return False


def digest(tensors: Any, mark: Callable[[], None] | None = None) -> str | None:
    """SHA-256 of DCP state dicts as this worker writes them: its local shard of each DTensor, every other tensor
    and plain value, with their keys, dtypes and shapes (bit for bit: -0.0 is not 0.0, a NaN equals itself).
    None when a value has no exact digest here (a sparse or quantized tensor, an object of another type); never
    raises. ``mark`` (a worker's :meth:`Progress.mark <cloud_elastic.worker.link.progress.Progress.mark>`) is
    called after each tensor: a pass over tens of GB takes tens of seconds, which ``--progress-timeout`` must not
    count as a stall."""
    h = hashlib.sha256()
    try:
        with torch.no_grad():
            _feed(h, tensors, mark or _nothing)
    except Exception:  # noqa: BLE001 - _NoDigest, or a tensor that cannot reach host memory (a meta one): unknown
        return None
    return h.hexdigest()


class _NoDigest(Exception):
    """A value this module cannot digest exactly."""


def _nothing() -> None:
    pass


def _feed(h: Any, value: Any, mark: Callable[[], None]) -> None:
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        value = value.to_local()  # this worker's shard, what its DCP file holds (a staged copy may be a plain one)
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided or value.is_quantized:
            raise _NoDigest()
        h.update(f"tensor {value.dtype} {tuple(value.shape)};".encode())
        t = value.detach().resolve_conj().resolve_neg().to("cpu").contiguous()
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # hashlib lets go of the GIL over large buffers
        mark()
    elif isinstance(value, dict):
        h.update(f"dict {len(value)};".encode())
        for key in sorted(value, key=repr):
            h.update(f"{key!r}:".encode())
            _feed(h, value[key], mark)
    elif isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__} {len(value)};".encode())
        for item in value:
            _feed(h, item, mark)
    elif isinstance(value, float):
        h.update(f"{type(value).__name__} ".encode() + struct.pack("<d", value))
    elif value is None or isinstance(value, (int, str, bytes)):  # bool is an int
        h.update(f"{type(value).__name__} {value!r};".encode())
    else:
        raise _NoDigest()
