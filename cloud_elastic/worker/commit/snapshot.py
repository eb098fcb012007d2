"""Reused-buffer copies of a state dict: what a kept commit holds (see ``state``).

A :class:`Snapshot` copies into buffers allocated once, so a commit runs at memory
speed (fresh allocations page-fault and run an order of magnitude slower). GPU
tensors are kept in pinned host memory, so a kept commit takes no GPU memory;
their copies run on a side CUDA stream that overlaps the next forward and
backward pass (see :class:`_HostCopies`). Only exercised on CPU here: the GPU
path is covered by ``tests/gpu`` on a machine that has one.
"""

from __future__ import annotations

import copy
import functools
import logging
import tempfile
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["Aside", "Snapshot", "clone", "plain_state_dict", "state_dict_without", "to_host"]


class Snapshot:
    """A nested copy of a state dict whose tensors live in reused buffers.

    Tensors whose storage is listed in ``deferred`` (parameters and optimizer
    state, which only the optimizer step modifies) are not copied at save
    time: the copy is queued and done by :meth:`flush`, which runs before the
    next optimizer update, while that step's gradient allreduce is in flight,
    or the update takes the queued buffers with :meth:`take` and fills them
    without a copy (see ``zerocopy``). Everything else (buffers such as
    BatchNorm statistics, scalars, learning rates) is copied at once.

    GPU tensors are kept in pinned host memory, so a kept commit takes no GPU
    memory: their copies run on a side CUDA stream (:class:`_HostCopies`).
    The deferred ones start at save time and overlap the next forward and
    backward pass; :meth:`flush` only makes the compute stream wait for them
    before the update overwrites their sources. A restore waits for them first.
    """

    def __init__(self) -> None:
        self._value: Any = None
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._host = _HostCopies()

    def save(self, value: Any, deferred: frozenset[int] = frozenset()) -> None:
        self._pending = []
        self._host.wait_on_host()  # the buffers are about to be written again
        if self._value is None or not _copy_into(self._value, value, deferred, self._pending):
            self._pending = []
            self._value = clone(value, to_host=True)
            return
        self._pending = self._host.start(self._pending)

    @property
    def pending(self) -> bool:
        """Copies queued by the last save are not done yet (the next optimizer update does them)."""
        return bool(self._pending) or self._host.in_flight

    @property
    def on_host(self) -> bool:
        """Some buffers are host copies of GPU tensors (no zero-copy trading with them)."""
        return self._host.used

    def keep(self, value: Any) -> None:
        """Hold ``value`` itself (a private copy the caller made) as the snapshot."""
        self._pending = []
        self._value = value

    def flush(self, keep: frozenset[int] = frozenset()) -> None:
        """Do the queued copies, except those of storages in ``keep`` (left queued).

        Host copies in flight are not waited for here: the compute stream is made
        to wait for them, so the update that follows cannot overwrite their sources early.
        """
        self._host.order_before_compute()
        pending, self._pending = self._pending, []
        dsts, srcs = [], []
        for dst, src in pending:
            if keep and src.data_ptr() in keep:
                self._pending.append((dst, src))
            else:
                dsts.append(dst)
                srcs.append(src)
        if dsts:
            # One call for all of them: a model with thousands of tensors (each with a
            # one-element optimizer step count) would otherwise pay a Python call per copy.
            torch._foreach_copy_(dsts, srcs)

    def take(self, ptrs: frozenset[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Hand the queued copies of storages in ``ptrs`` (one per storage) to the caller, who fills them."""
        taken: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        rest = []
        for dst, src in self._pending:
            ptr = src.data_ptr()
            if ptr in ptrs and ptr not in taken:
                taken[ptr] = (dst, src)
            else:
                rest.append((dst, src))
        self._pending = rest
        return taken

    def load(self) -> Any:
        self.flush()
        self._host.wait_on_host()
        return clone(self._value)


class _HostCopies:
    """The host copies of one snapshot's GPU tensors, in flight on a side CUDA stream.

    Without CUDA (or with no GPU tensor in the snapshot) every method is a no-op.
    """

    _streams: dict[int, Any] = {}  # device index -> its side stream, shared by every snapshot

    def __init__(self) -> None:
        self.used = False
        self._event: Any = None
        self._device: Any = None

    @property
    def in_flight(self) -> bool:
        return self._event is not None

    def start(self, pending: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Start the deferred copies of GPU tensors into host buffers now; return the other pending copies."""
        to_host = [(dst, src) for dst, src in pending if dst.device != src.device]
        if not to_host:
            return pending
        device = to_host[0][1].device
        stream = self._streams.get(device.index)
        if stream is None:
            stream = self._streams[device.index] = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))  # the values the commit saw are computed
        with torch.cuda.stream(stream):
            for dst, src in to_host:
                dst.copy_(src, non_blocking=True)
                src.record_stream(stream)
        self._event = torch.cuda.Event()
        self._event.record(stream)
        self._device, self.used = device, True
        return [(dst, src) for dst, src in pending if dst.device == src.device]

    def order_before_compute(self) -> None:
        """The compute stream waits (on the GPU) until the copies have read their sources."""
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)

    def wait_on_host(self) -> None:
        """Block until the copies are in host memory (before reading or rewriting the buffers)."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None


def clone(obj: Any, to_host: bool = False) -> Any:
    """A private copy of ``obj``; with ``to_host``, GPU tensors go to pinned host memory (a kept commit)."""
    if isinstance(obj, torch.Tensor):
        if to_host and obj.is_cuda:
            buf = torch.empty(obj.shape, dtype=obj.dtype, device="cpu", pin_memory=True)
            return buf.copy_(obj.detach())
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone(v, to_host) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone(v, to_host) for v in obj]
    if isinstance(obj, tuple):
        return tuple(clone(v, to_host) for v in obj)
    return copy.deepcopy(obj)


def _copy_into(dst: Any, src: Any, deferred: frozenset[int], pending: list) -> bool:
    """Copy ``src`` into ``dst`` in place; False if the structure differs (caller re-clones)."""
    if isinstance(src, torch.Tensor):
        if not isinstance(dst, torch.Tensor) or dst.shape != src.shape or dst.dtype != src.dtype:
            return False
        if dst.device != src.device and not (src.is_cuda and dst.device.type == "cpu"):
            return False
        if src.data_ptr() in deferred:
            pending.append((dst, src.detach()))
        else:
            dst.copy_(src.detach())  # a GPU tensor into its host buffer: synchronous (buffers, scalars: small)
        return True
    if isinstance(src, dict):
        if not isinstance(dst, dict) or dst.keys() != src.keys():
            return False
        for k, v in src.items():
            if isinstance(v, (torch.Tensor, dict, list, tuple)):
                if not _copy_into(dst[k], v, deferred, pending):
                    return False
            elif dst[k] != v:
                dst[k] = copy.deepcopy(v)
        return True
    if isinstance(src, (list, tuple)):
        if type(dst) is not type(src) or len(dst) != len(src):
            return False
        if isinstance(src, tuple):
            return all(
                _copy_into(d, s, deferred, pending) if isinstance(s, torch.Tensor) else d == s for d, s in zip(dst, src)
            )
        for i, v in enumerate(src):
            if isinstance(v, (torch.Tensor, dict, list, tuple)):
                if not _copy_into(dst[i], v, deferred, pending):
                    return False
            elif dst[i] != v:
                dst[i] = copy.deepcopy(v)
        return True
    return dst == src


@functools.cache
def plain_state_dict(cls: type) -> bool:
    """Is ``cls.state_dict()`` torch's own walk over parameters and persistent buffers?"""
    Module = torch.nn.Module
    return (
        cls.state_dict is Module.state_dict
        and cls._save_to_state_dict is Module._save_to_state_dict
        and getattr(cls, "get_extra_state", Module.get_extra_state) is Module.get_extra_state
    )


def state_dict_without(model: torch.nn.Module, skip: set[int] | frozenset[int]) -> dict[str, Any]:
    """``model.state_dict(keep_vars=True)`` minus the tensors whose ``id`` is in ``skip``.

    Every commit of a model asks for this (one kept in place with ``skip`` = the
    optimizer's parameters). ``state_dict()`` costs a few microseconds per module in Python
    (3 ms for a model of 900 modules), so where
    every module is plain (torch's own ``state_dict``, ``_save_to_state_dict`` and
    ``get_extra_state``, no state-dict hooks) the same entries, in the same order,
    come from a lean walk; any other module sends the whole model through
    ``state_dict()`` itself. Nothing is cached: a module added, a buffer replaced
    (``model.to()`` does that) is seen at the next commit.
    """
    out: dict[str, Any] = {}
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        if not plain_state_dict(type(module)) or module._state_dict_pre_hooks or module._state_dict_hooks:
            state = model.state_dict(keep_vars=True)
            return {k: v for k, v in state.items() if id(v) not in skip}
        for name, param in module._parameters.items():
            if param is not None and id(param) not in skip:
                out[prefix + name] = param
        if module._buffers:
            transient = module._non_persistent_buffers_set
            for name, buf in module._buffers.items():
                if buf is not None and name not in transient and id(buf) not in skip:
                    out[prefix + name] = buf
        if module._modules:  # depth first, children in order: state_dict()'s order
            stack.extend(reversed([(f"{prefix}{name}.", child) for name, child in module._modules.items() if child is not None]))
    return out


def to_host(obj: Any) -> Any:
    """``obj`` with every tensor copied to host memory (a kept commit must not take accelerator memory)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    return copy.deepcopy(obj)


class Aside:
    """A whole state kept aside, out of the training's memory, for a restore that is rarely needed (the
    first commit window's copy, see ``handlers.SnapshotHandler``).

    State on an accelerator is copied to host memory: the device's memory, which
    the job is sized by, is left alone. State in host memory (training on CPU,
    where host memory *is* the training's memory) is written to an unlinked
    temporary file in ``TMPDIR`` (nothing is left behind, even after ``kill -9``),
    and read back by :meth:`load`. A file that cannot be written (a full or
    read-only disk, a value that ``torch.save`` cannot pickle) is logged once, and
    the copy is kept in host memory instead.
    """

    _warned = False

    def __init__(self, state: Any) -> None:
        self._file: Any = None
        self._kept: Any = None
        if any(t.device.type != "cpu" for t in _tensors(state)):
            self._kept = to_host(state)
            return
        try:
            self._file = tempfile.TemporaryFile(prefix="cloud-elastic-commit-")
            torch.save(state, self._file)
            self._file.flush()
        except Exception as exc:  # noqa: BLE001 (a full disk, or a value torch.save cannot pickle: kept in memory)
            if self._file is not None:
                self._file.close()
            self._file = None
            if not Aside._warned:
                Aside._warned = True
                log.warning("cloud-elastic: could not write the first commit window's copy to a temporary file "
                            "(%s); keeping it in memory", exc)
            self._kept = clone(state)

    def load(self) -> Any:
        """A private copy of the state kept aside (each call a new one)."""
        if self._file is None:
            return clone(self._kept)
        self._file.seek(0)
        return torch.load(self._file, weights_only=False)  # our own file, written by __init__

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._kept = None

    __del__ = close


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []
