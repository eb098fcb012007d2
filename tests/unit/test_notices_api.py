"""The Notice value: what a watcher may report."""

from __future__ import annotations

import dataclasses

import pytest

from cloud_elastic.notices import MAINTENANCE, REBALANCE, TERMINATE, Notice


def test_terminate_is_hard_and_the_others_are_soft():
    hard = Notice("aws-imds", TERMINATE, 1700000000.0, "EC2 Spot interruption", "aws-spot:terminate:t")
    assert not hard.soft
    assert Notice("aws-imds", REBALANCE, None, "rebalance", "r").soft
    assert Notice("gcp-metadata", MAINTENANCE, None, "maintenance", "m").soft


def test_notices_are_frozen_and_compare_by_value():
    a = Notice("azure-scheduled-events", TERMINATE, 5.0, "Preempt", "E1")
    assert a == Notice("azure-scheduled-events", TERMINATE, 5.0, "Preempt", "E1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.kind = MAINTENANCE  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields, message",
    [
        (("ibm", TERMINATE, None, "x", "e"), "unknown notice source 'ibm'"),
        (("aws-imds", "stop", None, "x", "e"), "unknown notice kind 'stop'"),
        (("aws-imds", TERMINATE, None, "x", ""), "needs an event_id"),
        (("aws-imds", TERMINATE, None, "two\nlines", "e"), "one line"),
    ],
)
def test_malformed_notices_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Notice(*fields)
