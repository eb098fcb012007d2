"""A round whose process group never forms is given up at the formation deadline, not Gloo's timeout.

Real store, real Gloo, real WorkerContext: rank 1 of the round never arrives while nothing
aborts the round (its peers would still heartbeat), as in the rare CI hang where one member's
Gloo constructor never returned after a kill and the job sat until the test's bound.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from cloud_elastic.worker.context import RoundInfo, WorkerContext
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.settings import ConfigError, WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _worker(store: dist.TCPStore, form_s: float) -> WorkerContext:
    ctx = WorkerContext(WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address=f"127.0.0.1:{store.port}", job_id="form",
        worker_id="w0", secret="s" * 64, backend="gloo", collective_timeout_s=120.0, group_form_timeout_s=form_s,
        malloc_tuning=False,
    ))
    ctx._store = store
    return ctx


def test_a_group_that_never_forms_fails_the_round_at_the_formation_deadline():
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=120), wait_for_workers=False)
    ctx = _worker(store, form_s=2.0)
    started = time.monotonic()
    with pytest.raises(CollectiveError, match=r"round 1 did not form within 2 s \(CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S\)"):
        ctx._form_group(RoundInfo(0, 2, 0, 1, 0, 2, round=1, needs_sync=False, update_gen=0))
    # Gloo alone would have waited the 120 s collective timeout for rank 1's address.
    assert time.monotonic() - started < 30
    assert ctx.pg is None  # nothing was joined; the worker goes back to rendezvous


def test_the_formation_deadline_must_be_positive():
    with pytest.raises(ConfigError, match=r"CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S=0\.0: must be positive"):
        WorkerSettings.from_environ({"CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S": "0"})
    with pytest.raises(ConfigError, match=r"^CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S=-5\.0: must be positive$"):
        WorkerSettings.from_environ({"CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S": "-5"})


def test_the_round_after_an_abandoned_formation_forms_at_once():
    # The abandoned constructor still waits for rank 1's address on the store; the next
    # round must not queue behind that wait on the same store connection.
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=120), wait_for_workers=False)
    ctx = _worker(store, form_s=2.0)
    with pytest.raises(CollectiveError, match="did not form"):
        ctx._form_group(RoundInfo(0, 2, 0, 1, 0, 2, round=1, needs_sync=False, update_gen=0))
    if ctx._store_stale:  # what rendezvous() does before forming the next round
        ctx._reconnect_store()
    ctx._form_group(RoundInfo(0, 1, 0, 1, 0, 1, round=2, needs_sync=False, update_gen=0))
    assert ctx.pg is not None and ctx.pg.size() == 1


def test_a_member_outside_elastic_run_returns_from_forming_only_once_every_member_has_formed():
    """A fixed-size script with no collective: rank 0 formed its side, wrote its output and exited while
    rank 1 was still connecting ("Connection closed by peer"), and the job failed or, before, reported
    success with rank 1's work never done. Rank 1's formation is slowed here after its group is made."""
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    a, b = (_worker(dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=60)), 30.0)
            for _ in range(2))
    made = b._new_group
    events: list[str] = []

    def slow(store, info, publish=None):
        group = made(store, info, publish)
        time.sleep(1.0)  # the rest of rank 1's side of the connection, on a loaded machine
        events.append("rank 1 formed")
        return group

    b._new_group = slow
    late = threading.Thread(target=b._form_group, args=(RoundInfo(1, 2, 0, 1, 1, 2, round=1, needs_sync=False,
                                                                   update_gen=0),))
    late.start()
    a._form_group(RoundInfo(0, 2, 0, 1, 0, 2, round=1, needs_sync=False, update_gen=0))  # a script's hvd.rank()
    events.append("rank 0 formed")
    late.join(30)
    assert events == ["rank 1 formed", "rank 0 formed"]
