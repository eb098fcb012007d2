"""A newcomer checks its device before it asks to be admitted: a sick GPU is refused, not trained on.

The check runs after the worker registered and before it comes to rendezvous,
so the running workers keep training meanwhile: it adds nothing to the
admission stall. It allocates, multiplies two matrices and compares the
result with a reference computed another way, then waits for the device
(``torch.cuda.synchronize``) — all on a side thread under a timeout, so a
wedged device is a failed check, never a hang. On a CPU the same small check
runs (it costs milliseconds). A failed check is one line that the driver logs
before it blacklists the slot (see ``WorkerContext.start``).
"""

from __future__ import annotations

import threading
import time

import torch

__all__ = ["check_device", "device_for_slot"]

#: The matrix size of the check: 1024 on a GPU (an 8 MB product), 128 on a CPU (nothing to find there
#: but a broken build, and a worker's start-up should not pay for it).
_N = {"cuda": 1024}


def check_device(device: torch.device, timeout_s: float = 60.0) -> str | None:
    """None when ``device`` computes correctly within ``timeout_s``; else a one-line reason."""
    result: dict[str, str | None] = {}
    done = threading.Event()

    def run() -> None:
        try:
            result["reason"] = _check(device)
        except Exception as exc:  # any error of the device is the reason
            result["reason"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        done.set()

    started = time.monotonic()
    threading.Thread(target=run, name="cloud-elastic-selftest", daemon=True).start()
    # Late is failed, even when the check ended before this thread looked (a timeout shorter than the check).
    if not done.wait(timeout_s) or time.monotonic() - started > timeout_s:
        return f"the device self-test on {device} did not finish within {timeout_s:g}s"
    reason = result.get("reason")
    if reason is not None:
        return f"the device self-test on {device} failed after {time.monotonic() - started:.1f}s: {reason}"
    return None


def _check(device: torch.device) -> str | None:
    n = _N.get(device.type, 128)
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    expected = (a.double() @ b.double()).float()
    got = (a.to(device) @ b.to(device)).to("cpu")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not torch.isfinite(got).all():
        return "a matrix product gave non-finite values"
    # TF32 may be on: its error on a 1024-long dot product of unit normals stays far below 1% of the largest value.
    error = (got - expected).abs().max().item()
    if error > 1e-2 * expected.abs().max().item():
        return f"a matrix product was wrong (largest error {error:.3g})"
    return None


def device_for_slot(backend: str, slot: int) -> torch.device:
    """The device a worker on ``slot`` trains on: with NCCL its own GPU (which must exist); else a GPU it
    may share (Gloo with CUDA tensors), or the CPU."""
    if backend == "nccl":
        return torch.device("cuda", slot)
    if torch.cuda.is_available():
        return torch.device("cuda", slot % torch.cuda.device_count())
    return torch.device("cpu")
