"""The driver says whose failure aborted a round: a member back at rendezvous after a failure (its collective failed,
its group did not form) is named in one line before the round's abort, once per round."""

from __future__ import annotations

import logging

import pytest

from tests.unit.test_job import started

pytestmark = pytest.mark.timeout(30)  # may import torch (conftest)


def test_the_member_whose_failure_aborts_the_round_is_named_once(caplog) -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=2)
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.job.elastic_job")
    wid = sim.id("b[0]")
    sim.job.rendezvous(wid, 1, "failure", sim.now, unreachable=("c",))
    sim.join("a[0]", reason="failure")  # a peer freed by the abort: not the cause, not named
    lines = [r.getMessage() for r in caplog.records]
    named = [line for line in lines if "came back to rendezvous" in line]
    assert named == [f"job {sim.job.job_id}: worker {wid} (rank 1) came back to rendezvous from round 1 after a "
                     "failure (a collective of it failed, or its group did not form; it could not reach c)"], lines
    aborted = next(i for i, line in enumerate(lines) if "round 1 aborted" in line)
    assert lines.index(named[0]) < aborted
