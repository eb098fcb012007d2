"""The background writes of a sharded checkpoint (``worker.durable.sharded``): this worker's, run in order on a
thread of their own (:class:`Writes`), and the host's, as the end of training waits for them (:class:`HostWrites`)."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from cloud_elastic.checkpoint.api import CheckpointError
from cloud_elastic.checkpoint.store import CheckpointStore

__all__ = ["HostWrites", "Writes"]

log = logging.getLogger(__name__)


class HostWrites:
    """The background writes of every worker of the host, as :func:`wait_for_storage` waits for them at the end.

    After a DCP save local rank 0 alone publishes it (``state.pt``, the manifest): its host-mates, done, must not
    wait for it inside one collective, which would fail after the host group's timeout (the collective timeout)
    however steadily the storage writes. So :meth:`wait` waits up to its ``timeout`` for this worker's own writes,
    then asks the host (an all-reduce over the host's group, met by every worker within that ``timeout``) whether
    any of them has one left, and how many bytes they wrote since: :attr:`bytes_written` is the host's, so each
    worker counts as progress the bytes local rank 0 moves. Every worker gets the same answer, so all return
    together."""

    def __init__(self, writes: "Writes", store: CheckpointStore, device: Any) -> None:
        self._writes, self._store, self._device = writes, store, device
        self._since = store.bytes_written
        self.bytes_written = 0

    def wait(self, timeout: float) -> bool:
        left = torch.tensor([0 if self._writes.wait(timeout) else 1, self._store.bytes_written - self._since],
                            dtype=torch.int64, device=self._device)
        dist.all_reduce(left)
        self.bytes_written = int(left[1].item())
        return int(left[0].item()) == 0


class Writes:
    """One daemon thread that runs this worker's background writes in order (a daemon: a write still running
    when the process ends is cut, and its folder, without a manifest, is skipped by readers)."""

    def __init__(self) -> None:
        self._queue: "queue.Queue[Callable[[], None]]" = queue.Queue()
        self._pending = 0
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._pending == 0

    def put(self, write: Callable[[], None]) -> None:
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cloud-elastic-sharded-checkpoint", daemon=True)
                self._thread.start()
        self._queue.put(write)

    def wait(self, timeout: float | None) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self._pending == 0, timeout)

    def _run(self) -> None:
        while True:
            write = self._queue.get()
            try:
                write()
            except CheckpointError as exc:
                log.warning("the sharded checkpoint written in the background failed: %s", exc)
            except Exception:  # noqa: BLE001 - the thread must go on for the next write
                log.exception("the sharded checkpoint written in the background failed")
            finally:
                with self._lock:
                    self._pending -= 1
                    self._lock.notify_all()
