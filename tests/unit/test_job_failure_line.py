"""The driver says who reported the failure that aborts a round: a member back at rendezvous after a failure (its
collective failed, its group did not form) is named in one line before the round's abort, once per round, as the
first to report it, not as its cause (a survivor's collective fails on a killed peer's reset before the driver sees
that peer's exit: review s59 rvP finding 3)."""

from __future__ import annotations

import logging

import pytest

from tests.unit.test_job import started

pytestmark = pytest.mark.timeout(30)  # may import torch (conftest)


def test_the_member_whose_failure_aborts_the_round_is_named_once(caplog) -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=2)
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.job.elastic_job")
    wid = sim.id("b[0]")
    sim.job.rendezvous(wid, 1, "failure", sim.now, unreachable=(sim.address("c"), "192.0.2.9"))  # and a stranger
    sim.join("a[0]", reason="failure")  # a peer freed by the abort: not the cause, not named
    lines = [r.getMessage() for r in caplog.records]
    named = [line for line in lines if "first reported by" in line]
    assert named == [f"job {sim.job.job_id}: round 1 failed, first reported by worker {wid} (rank 1): a collective of "
                     "it failed, or its group did not form; it could not reach c (the member at fault may be another)"
                     ], lines
    aborted = next(i for i, line in enumerate(lines) if "round 1 aborted" in line)
    assert lines.index(named[0]) < aborted
