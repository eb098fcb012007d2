"""A raise written ahead into the sign of life (``raised.write_ahead``) whose call the provider proves the cloud
refused (``HostDiscovery.capacity_refused``) is taken back out at once; one it cannot prove refused stays."""

from __future__ import annotations

import pytest

from cloud_elastic.checkpoint import CheckpointStore
from cloud_elastic.checkpoint.alive import AliveRefresher
from cloud_elastic.driver.runtime import raised
from cloud_elastic.errors import CapacityDeniedError, CapacityError
from cloud_elastic.providers.multi import MultiSourceDiscovery
from cloud_elastic.providers.sources import SourceSpec
from tests.unit.test_fallback_table import Group
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
