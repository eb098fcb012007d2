"""Helper of tests/gpu/test_nccl_waits.py: what torch does on one GPU that the NCCL abort design relies on.

``worker/rounds/on_device.py`` assumes, for torch's ``ProcessGroupNCCL``:

* ``work.get_future()`` completes as the collective is queued, and ``work.wait()`` does not make the host wait
  (so the training thread's waits return at once, and the host must wait for the device where it matters);
* the host's wait for the device (``Stream.synchronize``) lets go of the GIL (the heartbeat thread beats on);
* the host's wait for every stream of the device (``torch.cuda.synchronize``) covers NCCL's stream;
* ``abort()`` from another thread returns while the training thread waits for the device, and a collective
  after it fails;
* ``get_error()`` says whether the group is broken (read through ``_get_backend``; optional).

One process, a group of one (one GPU): a long kernel (``torch.cuda._sleep``) stands for a collective stuck on a
lost peer, ahead of an allreduce on the same stream. Prints one JSON line of findings; exit code 0 unless
something raised.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from cloud_elastic.worker.rounds.groups import RoundGroup, nccl_error_handling_default, new_nccl_group
from cloud_elastic.worker.rounds.on_device import _in_error
from cloud_elastic.worker.rounds.signed_store import SignedStore, round_namespace

SECRET = "tests/gpu/nccl_waits_probe"


def _sleep_cycles(device: torch.device, seconds: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that last about ``seconds`` on ``device``: measured over ~0.2 s after a warm-up
    (the first call loads the kernel, and the clock may still be ramping up)."""
    torch.cuda._sleep(1_000_000)
    torch.cuda.synchronize(device)
    cycles, elapsed_ms = 1_000_000, 0.0
    while elapsed_ms < 200:
        cycles *= 4
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        elapsed_ms = start.elapsed_time(end)
    return int(cycles / elapsed_ms * seconds * 1000)


def _beats_during(wait) -> tuple[float, int]:
    """How long ``wait()`` took, and how often another Python thread ran meanwhile (every 10 ms if it could)."""
    beats, stop = [0], threading.Event()

    def beat() -> None:
        while not stop.is_set():
            beats[0] += 1
            time.sleep(0.01)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    began = time.monotonic()
    wait()
    took = time.monotonic() - began
    stop.set()
    beater.join()
    return round(took, 3), beats[0]


def main() -> None:
    nccl_error_handling_default()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)
    tcp = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=60))
    store = SignedStore(tcp, round_namespace(SECRET, "gpu-test", 1), SECRET)
    group = RoundGroup(new_nccl_group(store, 0, 1, timedelta(seconds=60), device), store, None, "nccl", device, 1)
    found: dict = {"error_before": _in_error(group),
                   "get_error": hasattr(group.pg._get_backend(device), "get_error")}
    cycles = _sleep_cycles(device, 2.0)
    t = torch.ones(1 << 20, device=device)

    # Queued behind two seconds of device time: the future is done, wait() returns, the work is not finished.
    torch.cuda._sleep(cycles)
    began = time.monotonic()
    work = group.pg.allreduce([t])
    found["future_done_at_once"] = work.get_future().done()
    work.wait()
    found["wait_s"] = round(time.monotonic() - began, 3)
    found["completed_after_wait"] = work.is_completed()
    # The host's wait for every stream of the device (on_device._synchronize) covers NCCL's: the work is finished.
    found["device_synchronize_s"], found["beats_during_device_synchronize"] = _beats_during(
        lambda: torch.cuda.synchronize(device))
    found["completed_after_device_synchronize"] = work.is_completed()

    # A value read back (.item()) and the current stream's synchronize let other threads run too.
    torch.cuda._sleep(cycles)
    found["item_s"], found["beats_during_item"] = _beats_during(lambda: t[0].item())
    torch.cuda._sleep(cycles)
    found["stream_synchronize_s"], found["beats_during_stream_synchronize"] = _beats_during(
        lambda: torch.cuda.current_stream(device).synchronize())

    # abort() from another thread while this one waits for the device: it returns, and the group is unusable after.
    torch.cuda._sleep(cycles)
    group.pg.allreduce([t])
    times: dict = {}

    def abort() -> None:
        time.sleep(0.3)
        times["abort_began"] = time.monotonic()
        try:
            group.pg.abort()
        except Exception as exc:  # noqa: BLE001 (reported)
            times["abort_error"] = f"{type(exc).__name__}: {exc}"
        times["abort_returned"] = time.monotonic()

    aborter = threading.Thread(target=abort, daemon=True)
    began = time.monotonic()
    aborter.start()
    torch.cuda.synchronize(device)
    synchronized = time.monotonic()
    aborter.join(60)
    found["abort_returned"] = "abort_returned" in times
    found["abort_error"] = times.get("abort_error")
    if found["abort_returned"]:
        found["abort_s"] = round(times["abort_returned"] - times["abort_began"], 3)
        found["abort_returned_before_the_wait"] = times["abort_returned"] < synchronized
    found["wait_with_abort_s"] = round(synchronized - began, 3)
    found["error_after"] = _in_error(group)
    try:
        group.pg.allreduce([t]).wait()
        torch.cuda.synchronize(device)
        found["allreduce_after_abort"] = "ran"
    except Exception as exc:  # noqa: BLE001 (what torch says of a collective on an aborted communicator)
        found["allreduce_after_abort"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    print(json.dumps(found), flush=True)
    os._exit(0)  # an abort still running in torch's C++ must not hold the process (nor finalize under it)


if __name__ == "__main__":
    main()
