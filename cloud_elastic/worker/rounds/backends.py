"""Gloo and NCCL process groups as a round needs them: made under a formation deadline, aborted, waited out.

:func:`new_gloo_group` and :func:`new_nccl_group` make a group (NCCL's non-blocking, connected eagerly, abortable
while it forms: see docs/architecture/gpus.md); :func:`abort_nccl` aborts one; :func:`quiesce_device` waits, bounded,
for a GPU to finish what was queued on it after an abort; :func:`nccl_error_handling_default` and
:func:`nccl_nonblocking_timeout_default` set torch's NCCL defaults the worker relies on. The round's side of them
(formation, abandon, waits) is :mod:`cloud_elastic.worker.rounds.groups`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["NCCL_ERROR_HANDLING", "new_gloo_group", "new_nccl_group", "abort_nccl", "nccl_error_handling_default",
           "nccl_nonblocking_timeout_default", "quiesce_device"]

log = logging.getLogger(__name__)

#: torch's NCCL async error handling modes: 0 none, 1 tear down (abort and kill the process),
#: 2 clean up only (abort the communicator, fail the work, keep the process), 3 skip clean-up (kill).
NCCL_ERROR_HANDLING = "2"


def new_gloo_group(store: Any, rank: int, size: int, timeout: timedelta, *, hostname: str,
                   interface: str | None, form_timeout: timedelta | None = None) -> Any:
    """A Gloo group bound to ``interface`` when given, else to the address ``hostname`` resolves to.

    ``form_timeout``: how long its constructor waits for each try of a peer's connection; its collectives
    then wait ``timeout``. A peer that vanished while the group formed (its address written, its
    connection never made) cannot be woken from: the constructor's thread, the group's device thread, its
    listening socket and epoll descriptor stay until Gloo gives up on it (see ``groups._GLOO_CONNECT_ATTEMPTS``),
    after the formation was given up. With one timeout for both, a stop or a kill during an admission left
    them for about five collective timeouts (25 minutes by default).
    """
    opts = dist.ProcessGroupGloo._Options()
    settable = form_timeout is not None and hasattr(dist.ProcessGroupGloo, "_set_default_timeout")
    opts._timeout = form_timeout if settable else timeout
    if interface:
        opts._devices = [dist.ProcessGroupGloo.create_device(interface=interface)]
    else:
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
    pg = dist.ProcessGroupGloo(store, rank, size, opts)
    if settable:
        pg._set_default_timeout(timeout)  # the collectives'; point-to-point waits pass theirs (see _future)
    return pg


def new_nccl_group(store: Any, rank: int, size: int, timeout: timedelta, device: torch.device,
                   published: Callable[[Any], None] = lambda pg: None) -> Any:
    """An NCCL group whose communicator is formed now, on ``device``, and can be aborted while it forms.

    ``config.blocking = False`` makes NCCL's initialisation and collectives
    return at once and report through their status, so ``abort()`` from another
    thread ends a formation stuck on a missing peer (torchft does the same);
    ``published(pg)`` hands the group to whoever may have to abort it before it
    connects. ``eager_connect_single_device`` forms the communicator here instead
    of at the first collective. Either is skipped on a torch that lacks it.
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
    published(pg)
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


def nccl_nonblocking_timeout_default(timeout_s: float, environ: dict[str, str] | Any = os.environ) -> None:
    """A non-blocking NCCL initialisation gives up after ``timeout_s`` (torch's default is 30 minutes)
    unless the user set ``TORCH_NCCL_NONBLOCKING_TIMEOUT``: the formation deadline, not longer."""
    environ.setdefault("TORCH_NCCL_NONBLOCKING_TIMEOUT", str(max(1, int(timeout_s))))


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
