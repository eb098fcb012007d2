"""A raise written ahead into the sign of life (``raised.write_ahead``) whose call the provider proves the cloud
refused (``HostDiscovery.capacity_refused``) is taken back out at once; one it cannot prove refused stays."""

from __future__ import annotations

import threading
import time

import pytest

from cloud_elastic.checkpoint import CheckpointStore
from cloud_elastic.checkpoint.alive import AliveRefresher
from cloud_elastic.driver.runtime import raised
from cloud_elastic.errors import CapacityDeniedError, CapacityError
from cloud_elastic.providers.multi import MultiSourceDiscovery
from cloud_elastic.providers.sources import SourceSpec
from tests.unit.test_fallback_table import Group
from tests.unit.test_job_sourcing import OD, SPOT_A, Sourced
from tests.unit.test_raised_capacity import _entry_raised

pytestmark = pytest.mark.timeout(60)


def _refusal(kind: str) -> CapacityError:
    error = CapacityDeniedError("AccessDenied") if kind.startswith("denied") else CapacityError("ValidationError")
    error.first_attempt = kind.endswith("first")  # type: ignore[attr-defined]  # Group.capacity_refused reads it
    return error


@pytest.mark.parametrize("kind, carried", [("refused-first", {}), ("denied-first", {}), ("refused-retried", {"od": 2}),
                                           ("timeout", {"od": 2})])
def test_a_raise_the_cloud_provably_refused_is_taken_back_out_of_the_sign_of_life(tmp_path, kind, carried):
    """rv6 f5_refused_restart: a raise of an operator's group (at 1) written ahead and refused stayed in the sign of
    life, and the driver restarted after a kill -9 set the group to 0. Proven refused (its only attempt answered with
    a 4xx), it is taken back out at once, before the job's next tick; refused after the SDK's retries, or timed out
    (either may have landed), it stays (rv9: 512da6c took those out too, and the job's group stayed paid)."""
    store = CheckpointStore(str(tmp_path / "ckpt"))
    od = Group("od", "o", [])
    od.desired = 1  # the operator's group
    od.errors = [_refusal(kind) if kind != "timeout" else CapacityError("Read timeout")]
    multi = MultiSourceDiscovery([(SourceSpec("spot", "group"), Group("spot", "a", [])),
                                  (SourceSpec("od", "group", fallback=True), od)])
    refresher = AliveRefresher(store, "job", 60.0, interval_s=60.0).start()  # no refresh due while it runs
    raised.write_ahead(multi, refresher)
    try:
        assert _entry_raised(store, {}) == {}
        multi.set_capacity(2, source="od")
        assert od.cloud == ["od=2"]
        assert _entry_raised(store, carried, within_s=5.0) == carried
        assert multi.can_give("od").owned is bool(carried)
    finally:
        refresher.close(stopped=False)
        multi.close()


class _Gated(Group):
    """A group whose call lasts until the driver's tick has run during it (an AWS call takes 100 ms or more; the
    driver ticks every 50 ms)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.during, self.ticked = threading.Event(), threading.Event()

    def set_capacity(self, hosts, *, source=None):
        self.during.set()
        if not self.ticked.wait(10.0):
            raise AssertionError("no driver tick ran during the call")
        return super().set_capacity(hosts, source=source)


@pytest.mark.parametrize("straddle", [False, True], ids=["ticks-go-on", "tick-straddles-the-refusal"])
def test_a_raise_refused_while_the_driver_ticks_is_taken_back_out_of_the_sign_of_life(tmp_path, straddle):
    """raise2 review of 98d01a8 (rv2 refused_tick_race): the driver's tick during the call (every 50 ms) saw the
    group as the job's and put it in the sign of life's job view; the proven refusal took out only the raise's own
    entry, and the view dropped the group without writing it, so the entry on disk said od raised until the next
    5 s refresh: a driver killed -9 then handed the operator's group (at 1) to its successor, which set it to 0.
    Also a tick that read the group during the call and hands its view over after the refusal (straddle)."""
    store = CheckpointStore(str(tmp_path / "ckpt"))
    sim = Sourced(3, manage_capacity=True, sources=(SPOT_A, OD))
    spot, od = Group("spot", "a", []), _Gated("od", "o", [])
    spot.hosts, od.desired, od.errors = 1, 1, [_refusal("refused-first")]  # od: the operator's group, at 1
    multi = MultiSourceDiscovery([(SourceSpec("spot-a", "group", price=1.0), spot),
                                  (SourceSpec("od", "group", price=4.0, fallback=True), od)], clock=lambda: sim.now)
    refresher = AliveRefresher(store, "job", 60.0, interval_s=60.0).start()  # no refresh due while it runs
    raised.write_ahead(multi, refresher)
    lock, stop, call_done = threading.Lock(), threading.Event(), threading.Event()

    def ticks() -> None:  # driver.py's loop: share, then remember, with the job's lock
        while not stop.is_set():
            with lock:
                during = od.during.is_set()
                raised.share(sim.job, multi)
                if straddle and during:
                    od.ticked.set()
                    call_done.wait(10.0)
                raised.remember(sim.job, refresher, {})
            if during:
                od.ticked.set()
                if straddle:
                    return  # no later tick puts it right
            time.sleep(0.01)

    ticker = threading.Thread(target=ticks, daemon=True)
    try:
        with lock:
            raised.discovered(sim.job, multi, multi.find(), sim.now)
            sim.advance(1)
            actions, sim.capacity[:] = list(sim.capacity), []
        ticker.start()
        for action in actions:  # the discovery thread's call
            multi.set_capacity(action.hosts, source=action.source)
        call_done.set()
        assert od.cloud == ["od=2"]
        if straddle:
            ticker.join(10.0)
        assert multi.can_give("od").owned is False
        assert _entry_raised(store, {}, within_s=5.0) == {}  # a driver killed now leaves the operator's group
    finally:
        stop.set()
        call_done.set()
        ticker.join(10.0)
        refresher.close(stopped=False)
        multi.close()
