"""One round's process group: formed under a deadline, abandoned at once, let go off the training thread.

A :class:`RoundGroup` holds what must live exactly as long as the group:

* the torch process group;
* the round's store. ``ProcessGroupNCCL`` creates its communicator lazily and
  calls the store then; when the store is a Python subclass of ``dist.Store``
  (our :class:`~cloud_elastic.worker.store.SignedStore`) whose last Python
  reference is gone, that call fails inside torch (``fn INTERNAL ASSERT FAILED
  ... Not implemented``), the first collective of every NCCL job failed that
  way on an H100. The holder keeps the store referenced until the group itself
  is released;
* the group's peer connections (Gloo), found when it formed (see ``reclaim``).

:meth:`RoundGroup.abandon` is called the moment a collective of the round fails
or the driver aborts the round: the round is over for this worker, so every
collective still pending in it is failed now (Gloo: its peer connections are
shut down; NCCL: its communicator is aborted). Doing this only when the next
round formed, as before, left a window in which the group's last reference
could be dropped on the training thread (a traceback kept alive by the failure,
a frame returning) while a collective was still blocked on a live peer: Gloo's
destructor then joined that collective's thread for up to Gloo's timeout (300
s) while heartbeats went on, and the round hung (the CI hang of
``test_commit_kill_points``). An abandoned group's destructor returns at once.

NCCL (:func:`new_nccl_group`) is created non-blocking and connected eagerly
(``eager_connect_single_device``, as torch does with ``device_id``), so the
communicator forms inside the formation deadline and can be abandoned with
``abort()`` like a Gloo group. Only exercised on a GPU; see docs/architecture.md
"GPUs" for what was run on hardware.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cloud_elastic.worker.reclaim import GroupSockets

__all__ = ["RoundGroup", "new_gloo_group", "new_nccl_group", "nccl_error_handling_default", "quiesce_device"]

log = logging.getLogger(__name__)

#: torch's NCCL async error handling modes: 0 none, 1 tear down (abort and kill the process),
#: 2 clean up only (abort the communicator, fail the work, keep the process), 3 skip clean-up (kill).
NCCL_ERROR_HANDLING = "2"


class RoundGroup:
    """A round's process group and what lives and dies with it (see module docstring)."""

    def __init__(self, pg: Any, store: Any, sockets: GroupSockets | None, backend: str,
                 device: torch.device | None = None) -> None:
        self.pg = pg
        #: Referenced for as long as the group: torch calls back into it (NCCL connects lazily).
        self.store = store
        self.sockets = sockets
        self.backend = backend
        self.device = device
        self.abandoned = False
        self._lock = threading.Lock()

    def abandon(self) -> bool:
        """Fail every collective still pending in this group; True the first time. Never blocks for long.

        Called when a collective of the round failed or the driver aborted the
        round: nothing will use the group again. Idempotent and thread-safe.
        """
        with self._lock:
            if self.abandoned:
                return False
            self.abandoned = True
        if self.backend == "nccl":
            abort_nccl(self.pg)
        elif self.sockets is not None:
            self.sockets.shutdown()
        return True


def new_gloo_group(store: Any, rank: int, size: int, timeout: timedelta, *, hostname: str,
                   interface: str | None) -> Any:
    """A Gloo group bound to ``interface`` when given, else to the address ``hostname`` resolves to."""
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    if interface:
        opts._devices = [dist.ProcessGroupGloo.create_device(interface=interface)]
    else:
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
    return dist.ProcessGroupGloo(store, rank, size, opts)


def new_nccl_group(store: Any, rank: int, size: int, timeout: timedelta, device: torch.device) -> Any:
    """An NCCL group whose communicator is formed now, on ``device``, and can be aborted while it forms.

    ``config.blocking = False`` makes NCCL's initialisation and collectives
    return at once and report through their status, so ``abort()`` from another
    thread ends a formation stuck on a missing peer (torchft does the same).
    ``eager_connect_single_device`` forms the communicator here instead of at the
    first collective. Either is skipped on a torch that lacks it.
    """
    # The formation runs on a thread of its own, and CUDA's current device is per thread: an eager
    # connect on another device than the communicator's fails ("Cuda failure 'invalid argument'").
    torch.cuda.set_device(device)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    config = getattr(opts, "config", None)
    if config is not None and hasattr(config, "blocking"):
        config.blocking = False
    pg = dist.ProcessGroupNCCL(store, rank, size, opts)
    connect = getattr(pg, "eager_connect_single_device", None)
    if connect is not None:
        connect(device)
    return pg


def abort_nccl(pg: Any) -> None:
    """Abort an NCCL group's communicators with torch's current API; never raises."""
    try:
        pg.abort()
    except (RuntimeError, AttributeError) as exc:
        log.warning("aborting an NCCL process group failed: %s", exc)


def nccl_error_handling_default(environ: dict[str, str] | Any = os.environ) -> str | None:
    """Make torch's NCCL watchdog clean up a failed collective without killing the process.

    With torch's default (3: skip clean-up) a collective that times out tears
    the whole process down, survivor included. Mode 2 aborts the communicator
    and fails the collective's work, which the worker sees as any other failed
    collective: it rolls back and joins the next round in the same process.
    The user's own setting wins. Returns the value now in effect.
    """
    environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", NCCL_ERROR_HANDLING)
    return environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")


def quiesce_device(device: torch.device | None, timeout_s: float = 30.0) -> bool:
    """After an NCCL abort: wait (bounded) for the device to finish what was queued on it.

    True when it did (or there is nothing to wait for); False when it did not
    within ``timeout_s``: the GPU is wedged, and the worker cannot continue safely.
    """
    if device is None or device.type != "cuda":
        return True
    done = threading.Event()

    def sync() -> None:
        try:
            torch.cuda.synchronize(device)
        except RuntimeError as exc:  # an aborted kernel may report here; the device is idle either way
            log.debug("synchronize after an NCCL abort: %s", exc)
        done.set()

    threading.Thread(target=sync, name="cloud-elastic-quiesce", daemon=True).start()
    started = time.monotonic()
    if done.wait(timeout_s):
        return True
    log.error("the GPU %s did not finish its queued work within %.0fs of an NCCL abort", device,
              time.monotonic() - started)
    return False
