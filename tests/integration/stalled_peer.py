"""A round's peer that stops itself (SIGSTOP) as it forms the group: after it wrote its address and read
rank 0's, before its connection is made. Run by tests/integration/test_group_reclaim.py.

    python stalled_peer.py STORE_PORT ROUND
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta

import torch.distributed as dist

from cloud_elastic.worker.rounds import groups
from cloud_elastic.worker.context import RoundInfo, WorkerContext
from cloud_elastic.worker.settings import WorkerSettings


def main(port: int, round_: int) -> None:
    read = groups.RoundStore.get

    def get_then_stop(self: groups.RoundStore, key: str) -> bytes:
        value = read(self, key)
        print("stopping", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        return value

    groups.RoundStore.get = get_then_stop
    ctx = WorkerContext(WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address=f"127.0.0.1:{port}", job_id="stalled",
        worker_id="b", hostname="127.0.0.1", secret="s" * 64, backend="gloo", collective_timeout_s=300.0,
        malloc_tuning=False,
    ))
    ctx._store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=30))
    ctx._form_group(RoundInfo(1, 2, 0, 1, 1, 2, round=round_, needs_sync=False, update_gen=0))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
