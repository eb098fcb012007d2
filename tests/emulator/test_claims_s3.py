"""Driver claims on S3 (moto): a generation's claim is a conditional upload, so of two drivers restarted at
once one gets it; the winner of a generation deletes the claims ``KEEP`` generations older."""

from __future__ import annotations

import time

import pytest

from cloud_elastic.checkpoint import CheckpointStore
from cloud_elastic.checkpoint.alive import DriverAlive
from cloud_elastic.checkpoint.claims import KEEP, claim, newest_claim
from tests.emulator.test_checkpoint_s3 import _keys, bucket, moto_url  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(120)]


def test_a_generation_is_claimed_once_on_s3_and_old_claims_are_deleted(bucket: str, moto_url: str) -> None:
    store = CheckpointStore(f"s3://{bucket}/jobs/claimed")
    first, second = (DriverAlive("job11111", time.time(), 30.0, host, pid) for host, pid in (("vm-1", 11), ("vm-2", 22)))
    assert claim(store, 1, first) is None
    lost = claim(CheckpointStore(f"s3://{bucket}/jobs/claimed"), 1, second)
    assert lost is not None and (lost.generation, lost.driver.host, lost.driver.pid) == (1, "vm-1", 11)
    for generation in range(2, KEEP + 3):
        assert claim(store, generation, second) is None
    newest = newest_claim(CheckpointStore(f"s3://{bucket}/jobs/claimed"))
    assert (newest.generation, newest.driver.host) == (KEEP + 2, "vm-2")
    assert _keys(moto_url, bucket) == sorted(f"jobs/claimed/drivers/{g}.json" for g in range(3, KEEP + 3))
