"""Helper of tests/gpu/test_memory.py: one process forms, uses and abandons NCCL groups round after round.

What a worker does with its NCCL group at every round, through the worker's own
code: the round's store is a ``SignedStore`` on the round's namespace of a
``TCPStore`` (the driver's, here in this process), the group comes from
``groups.new_nccl_group`` (non-blocking, connected eagerly) and is held by a
``RoundGroup`` (the only reference to the store once formed); a broadcast and an
allreduce run on it; then it is abandoned as after a failed round
(``RoundGroup.abandon``: ``abort()``), the device is quiesced and the group is
retired (``Reaper.retire``, destroyed off this thread). World size 1: one GPU.

Prints one JSON line per cycle (``cycle``, ``seconds``, ``ok``, ``quiet``,
``device_used``, ``allocated``), then ``{"final": ...}`` once every retired group
is destroyed. Exit code 0 unless something raised.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from cloud_elastic.worker.rounds.groups import RoundGroup, nccl_error_handling_default, new_nccl_group, quiesce_device
from cloud_elastic.worker.rounds.reclaim import Reaper
from cloud_elastic.worker.rounds.signed_store import SignedStore, round_namespace

SECRET = "tests/gpu/nccl_cycles"


def form(tcp: dist.TCPStore, round_: int, device: torch.device) -> RoundGroup:
    """A round's group as ``WorkerContext`` forms one; on return only the RoundGroup references its store."""
    store = SignedStore(tcp, round_namespace(SECRET, "gpu-test", round_), SECRET)
    pg = new_nccl_group(store, 0, 1, timedelta(seconds=60), device)
    return RoundGroup(pg, store, None, "nccl", device)


def used(device: torch.device) -> dict:
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return {"device_used": total - free, "allocated": torch.cuda.memory_allocated(device)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cycles", type=int, default=12)
    args = p.parse_args()
    nccl_error_handling_default()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # the CUDA context exists before the first measurement
    tcp = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=60))
    reaper = Reaper()
    print(json.dumps({"cycle": 0, **used(device)}), flush=True)
    for cycle in range(1, args.cycles + 1):
        began = time.monotonic()
        group = form(tcp, cycle, device)
        x = torch.full((1 << 20,), float(cycle), device=device)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        group.pg.broadcast([x], opts).wait()
        group.pg.allreduce([x]).wait()
        ok = bool(torch.all(x == cycle).item())
        group.abandon()
        quiet = quiesce_device(device)
        reaper.retire(group)
        del group, x
        print(json.dumps({"cycle": cycle, "seconds": round(time.monotonic() - began, 3), "ok": ok, "quiet": quiet,
                          **used(device)}), flush=True)
    deadline = time.monotonic() + 60
    while reaper.reclaimed + reaper.leaked < args.cycles and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"final": True, "reclaimed": reaper.reclaimed, "leaked": reaper.leaked, **used(device)}),
          flush=True)


if __name__ == "__main__":
    main()
