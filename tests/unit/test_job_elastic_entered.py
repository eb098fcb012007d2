"""A worker inside ``hvd.elastic.run`` makes the job elastic (driver.job.fixed_size, ``PollRequest.elastic``).

A fresh elastic job (-np 2 --min-np 1) whose second worker raised in its set-up (after ``hvd.rank()``,
before ``hvd.elastic.run``) while rank 0 was already inside ``hvd.elastic.run`` failed as "a fixed-size job:
the script does not use hvd.elastic.run": the driver judged "elastic" only by a commit. Its heartbeats now
say it entered, and the failure is an elastic worker's: the slot cools down and the survivor goes on.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Finish
from cloud_elastic.driver.job.fixed_size import FixedSize
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol import PollRequest
from tests.unit.test_control_plane import HeartbeatJob, plane
from tests.unit.test_job import CLEAN, CRASH, T0, Sim, assert_round

pytestmark = pytest.mark.timeout(10)

ERROR = "ConnectionError: flaky download of the data set on this host"


def elastic_pair() -> Sim:
    """-np 2 --min-np 1 on two hosts, its first round formed."""
    sim = Sim(2, min_np=1)
    assert_round(sim.start({"a": 1, "b": 1}), 1, needs_sync=True)
    return sim


def set_up_fails(sim: Sim, slot: str) -> None:
    """The worker on ``slot`` raises before ``hvd.elastic.run``: its exit hook reports it, then it exits 1."""
    assert sim.job.completed(sim.id(slot), sim.now, steps=0, error=ERROR, elastic=False) == ("done", "")
    sim._collect()
    sim.exit(slot, CRASH)


def test_a_set_up_failure_while_a_peer_is_inside_elastic_run_leaves_the_survivor_training(caplog) -> None:
    sim = elastic_pair()
    sim.job.fixed.entered(sim.id("a[0]"))  # a[0]'s heartbeat: it is inside hvd.elastic.run
    caplog.set_level("INFO")
    set_up_fails(sim, "b[0]")
    assert sim.outcome is None
    assert sim.blocked("b[0]")  # its slot cools down, as after any elastic failure
    failure, = [f for kind, f in sim.events if kind == "worker_failed"]
    assert failure["worker"] == sim.id("b[0]") and failure["blacklisted_s"] > 0
    assert "fixed-size" not in caplog.text and "ended before entering hvd.elastic.run" in caplog.text
    assert ERROR in sim.job.last_failure
    assert_round(sim.join("a[0]", reason="failure"), 2, needs_sync=True)  # the survivor goes on (--min-np 1)
    assert sim.layout() == ["a[0]"]


def test_a_peer_entering_elastic_run_just_after_the_report_still_makes_the_job_elastic() -> None:
    sim = elastic_pair()
    assert sim.job.completed(sim.id("b[0]"), sim.now, steps=0, error=ERROR, elastic=False) == ("done", "")
    sim.job.fixed.entered(sim.id("a[0]"))  # its heartbeat came a moment after b[0]'s report
    sim.exit("b[0]", CRASH)
    assert sim.outcome is None and sim.blocked("b[0]")
    assert_round(sim.join("a[0]", reason="failure"), 2, needs_sync=True)


def test_a_job_where_no_worker_entered_elastic_run_stays_fixed_size_with_what_is_known() -> None:
    sim = elastic_pair()
    set_up_fails(sim, "b[0]")
    outcome = sim.outcome
    assert outcome is not None and not outcome.success
    assert outcome.reason == f"worker {sim.id('b[0]')} (rank 1) exited with code 1: {ERROR} (a fixed-size job: " \
                             "no worker entered hvd.elastic.run)"
    sim.job.fixed.entered(sim.id("a[0]"))  # too late: the job has ended
    assert sim.outcome == outcome


def test_a_fixed_size_success_is_not_undone_by_a_later_heartbeat() -> None:
    sim = Sim(2)
    assert_round(sim.start({"a": 2}), 1, needs_sync=True)
    for slot in ("a[1]", "a[0]"):
        assert sim.job.completed(sim.id(slot), sim.now, steps=3, elastic=False) == ("done", "")
        sim.exit(slot, CLEAN)
    assert sim.outcome == Finish(True, "training completed on 2 worker(s), every one exiting 0 (a fixed-size job: "
                                       "no worker entered hvd.elastic.run)", 0)


def test_the_heartbeat_carries_elastic_and_old_workers_heartbeats_are_still_accepted() -> None:
    assert PollRequest.from_wire(PollRequest(1, 0, 0, elastic=True).to_wire()).elastic is True
    assert PollRequest.from_wire({"round": 1, "update_gen": 0, "abort_round": 0}).elastic is False  # an older worker
    with pytest.raises(ControlPlaneError, match="'elastic' must be true or false"):
        PollRequest.from_wire({"round": 1, "update_gen": 0, "abort_round": 0, "elastic": "yes"})


def test_the_control_plane_tells_the_job_when_a_heartbeat_says_elastic() -> None:
    job = HeartbeatJob()
    job.fixed = FixedSize(job)
    p, _, _, _ = plane(job)
    first, second = sorted(job.workers)
    p.handle("poll", {"worker": first, "round": 0, "update_gen": 0, "abort_round": 0})
    assert job.fixed.elastic is False
    p.handle("poll", {"worker": second, "round": 0, "update_gen": 0, "abort_round": 0, "elastic": True})
    assert job.fixed.elastic is True
    assert T0 in job.heard_at


def test_a_newcomers_refusal_reaches_the_failure_line_whole() -> None:
    # Cut at 300 characters, the refusal lost its last words, the pointer to the docs (review s63 rvU finding 7).
    from cloud_elastic.protocol_reports import error_line
    from cloud_elastic.worker.joining import refuse

    try:
        refuse("broadcast_parameters")
    except Exception as exc:
        refusal = error_line(f"{type(exc).__name__}: {exc}")  # what the worker's exit hook reports
    assert len(refusal) > 300 and refusal.endswith("its result (see docs/porting.md)")
    sim = elastic_pair()
    sim.job.fixed.entered(sim.id("a[0]"))
    # Its exit hooks: the script's end, then the exit report the failure line is made from (control_plane.py).
    assert sim.job.completed(sim.id("b[0]"), sim.now, steps=0, error=refusal, elastic=False) == ("done", "")
    sim.job.adoption.exiting(sim.id("b[0]"), 1, refusal)
    sim._collect()
    sim.exit("b[0]", CRASH)
    assert sim.job.last_failure.endswith(f"exited with code 1: {refusal}")


def test_an_error_line_is_cut_at_a_words_end_and_says_so() -> None:
    from cloud_elastic.protocol_reports import MAX_ERROR_LINE, error_line

    assert error_line("ValueError: bad\nTraceback ...") == "ValueError: bad"
    long = error_line("RuntimeError: " + "word " * 200)
    assert len(long) <= MAX_ERROR_LINE and long.endswith("word…")
    assert len(error_line("x" * 2000)) == MAX_ERROR_LINE
