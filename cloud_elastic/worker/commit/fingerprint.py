"""The fingerprint of a committed state: where in its training it is, in at most 16 hex digits.

The driver's repeat guards (``driver.job.repeats``) measure progress by what was trained, not by how many commits
were made: Horovod's loop (``for state.batch in range(state.batch, N): ...; state.commit()``) redoes the restored
batch after each restore and commits it again, so a bug that recurs at the next batch adds a commit every time
without training anything new. Every worker reports the fingerprint of the state it would restore (its last commit,
or what a sync or a checkpoint load gave it) with its heartbeats and at rendezvous; the driver counts how often a
worker's fingerprint changed (a redo commits the restored attributes again: no change).

The fingerprint hashes what says *where* training is, never the tensors: the state's plain attributes
(``State(**kwargs)``, ``TorchState(model, opt, **kwargs)``: ``batch``, ``epoch``, ``step``, as committed) and its
``ElasticSampler``\\ s' positions (epoch, samples done). Bounded work at every commit: at most
:data:`MAX_ATTRIBUTES` attributes, each an int of at most 64 bits, a bool, None, a string of at most
:data:`MAX_TEXT` characters, or a tuple or list of at most :data:`MAX_ITEMS` of those; any other value (a float:
a metric such as ``state.loss``, which a redo changes; a tensor, a dict, an object) is left out. A state with none
of them has the empty fingerprint, and the driver counts its commits instead; so it does where the attributes do not
move with training, or stand still over it (``ledger.CommitLedger.trained``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from cloud_elastic.worker.commit.handlers import SamplerHandler

__all__ = ["MAX_ATTRIBUTES", "MAX_ITEMS", "MAX_TEXT", "fingerprint"]

#: The most attributes a fingerprint reads (the first by name), the longest string and the longest tuple it takes.
MAX_ATTRIBUTES = 64
MAX_TEXT = 256
MAX_ITEMS = 16
#: The most spans of a sampler's done samples it adds up.
_MAX_SPANS = 1024

#: A float is left out: a state's floats are metrics (``state.loss``, a learning rate), which differ at each redo.
_SCALARS = (bool, int, str, type(None))


def fingerprint(state: Any) -> str:
    """The fingerprint of ``state``'s last commit (see the module docstring): 16 hex digits, or "" when nothing in
    it says where training is."""
    parts: list[str] = []
    saved = getattr(state, "_saved_state", None)  # ObjectState's committed attributes
    if isinstance(saved, dict) and saved:
        names = sorted(name for name in saved if isinstance(name, str))
        for name in names[:MAX_ATTRIBUTES]:
            text = _plain(saved[name])
            if text is not None:
                parts.append(f"{name}={text}")
    handlers = getattr(state, "_handlers", None)  # TorchState's: an ElasticSampler's committed position
    if isinstance(handlers, dict):
        for name, handler in handlers.items():
            position = _sampler_position(handler)
            if position is not None:
                parts.append(f"{name}@{position}")
    if not parts:
        return ""
    return hashlib.blake2b("\n".join(sorted(parts)).encode(), digest_size=8).hexdigest()


def _scalar(value: Any) -> str | None:
    kind = type(value)
    if kind not in _SCALARS:
        return None
    if kind is int and value.bit_length() > 64 or kind is str and len(value) > MAX_TEXT:
        return None
    return repr(value)


def _plain(value: Any) -> str | None:
    """``value`` written out when it is small and plain, else None (left out)."""
    if type(value) in (tuple, list):
        if len(value) > MAX_ITEMS:
            return None
        items = [_scalar(item) for item in value]
        if any(item is None for item in items):
            return None
        return f"{type(value).__name__}({','.join(items)})"  # type: ignore[arg-type]
    return _scalar(value)


def _sampler_position(handler: Any) -> str | None:
    """An ``ElasticSampler`` handler's committed position (its epoch and how many samples it has done), else None."""
    if not isinstance(handler, SamplerHandler):
        return None
    saved = getattr(handler, "_saved", None)
    if not isinstance(saved, dict):
        return None
    try:
        done = saved.get("done")
        count = sum(int(end) - int(start) for start, end in done[:_MAX_SPANS]) if isinstance(done, list) else -1
        if "processed_num" in saved:  # Horovod's form, as loaded from one of its checkpoints
            count = int(saved["processed_num"])
        return f"{int(saved.get('epoch', 0))}:{count}"
    except (TypeError, ValueError):
        return None
