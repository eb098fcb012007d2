"""A stranger who reaches the rendezvous store cannot join a round (real store, real Gloo, real WorkerContext)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from cloud_elastic.worker.context import RoundInfo, WorkerContext
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _worker(store: dist.TCPStore) -> WorkerContext:
    ctx = WorkerContext(WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address=f"127.0.0.1:{store.port}", job_id="auth",
        worker_id="w0", secret="s" * 64, backend="gloo", collective_timeout_s=20.0, malloc_tuning=False,
    ))
    ctx._store = store
    return ctx


def test_a_stranger_posing_as_rank_1_fails_the_round_instead_of_joining_it():
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=20), wait_for_workers=False)
    stranger = dist.TCPStore("127.0.0.1", store.port, None, False, timeout=timedelta(seconds=20))
    planted: list[str] = []

    def pose_as_rank_1() -> None:
        # The stranger sees the round's (opaque) keys appear and writes rank 1's address key.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            mine = [k for k in stranger.list_keys() if k.endswith("/0/0")]
            if mine:
                key = mine[0][: -len("0/0")] + "0/1"
                stranger.set(key, stranger.get(mine[0]))  # even a validly tagged value from another key
                planted.append(key)
                return
            time.sleep(0.01)

    attacker = threading.Thread(target=pose_as_rank_1, daemon=True)
    attacker.start()
    ctx = _worker(store)
    with pytest.raises(CollectiveError, match="could not form the process group of round 1.*bad signature"):
        ctx._form_group(RoundInfo(0, 2, 0, 1, 0, 2, round=1, needs_sync=False, update_gen=0))
    attacker.join(5)
    assert planted and "round" not in planted[0]  # the namespace names no round in clear
    assert ctx.pg is None  # nothing was joined
