"""The driver hears of the commit a checkpoint holds before that checkpoint can exist (review h25).

`-np 2 --min-np 1 --spares 1 --checkpoint-dir`: both members were killed just after rank 0 published the first
checkpoint and before its "saved" report (and before any heartbeat carried the commit). The driver had heard of no
commit, so the spare formed a round from the initial weights over that checkpoint, and the job succeeded. Rank 0's
writer now reports "writing" (its commit) before the store publishes anything: every chain link is tested here,
the writer's order with a real store, the report's shape, the control plane's answer, and the round it leads to.
"""

from __future__ import annotations

import pytest

from cloud_elastic.checkpoint import CheckpointStore
from cloud_elastic.checkpoint.writer import CheckpointWriter
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol_reports import CheckpointReport
from tests.unit.test_control_plane import plane
from tests.unit.test_job import KILLED, Sim, assert_round

pytestmark = pytest.mark.timeout(30)


def test_the_writer_reports_before_the_store_publishes_anything(tmp_path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    seen: list[tuple[int, dict, int]] = []
    writer = CheckpointWriter(store, before_write=lambda step, meta: seen.append((step, dict(meta), len(store.list()))))
    writer.start()
    try:
        assert writer.submit(7, {"step": 7}, {"commit_seq": 40})
        assert writer.wait(20)
    finally:
        writer.close(20)
    assert seen == [(7, {"commit_seq": 40}, 0)]  # heard of while no checkpoint of it existed
    assert [c.step for c in store.list()] == [7]


def test_a_report_that_fails_does_not_stop_the_write(tmp_path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))

    def unreachable(step, meta):
        raise ConnectionRefusedError("the driver is away")

    writer = CheckpointWriter(store, before_write=unreachable).start()
    try:
        assert writer.submit(7, {"step": 7}, {"commit_seq": 40}) and writer.wait(20)
    finally:
        writer.close(20)
    assert [c.step for c in store.list()] == [7]


def test_the_writing_report_carries_its_commit_and_a_malformed_one_is_refused() -> None:
    assert CheckpointReport.from_wire({"event": "writing", "step": 7, "commit_seq": 40}) == \
        CheckpointReport("writing", 7, commit_seq=40)
    p, job, stops, sink = plane()
    worker = sorted(job.workers)[0]
    for bad in ({}, {"commit_seq": -1}, {"commit_seq": "40"}):
        with pytest.raises(ControlPlaneError, match="malformed checkpoint message"):
            p.handle("checkpoint", {"worker": worker, "event": "writing", "step": 7, **bad})
    assert p.handle("checkpoint", {"worker": worker, "event": "writing", "step": 7, "commit_seq": 40}) == {"ok": True}
    assert job.workers[worker].commit_seq == 40 and stops == [] and sink.events == []  # no event: nothing stored yet


def test_members_lost_once_the_write_was_heard_of_leave_the_spare_a_round_from_the_checkpoint() -> None:
    sim = Sim(2, spares=1, min_np=1, checkpointing=True)
    sim.discover({"a": 1, "b": 1, "c": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    assert sim.join("c[0]") == {"c[0]": None}  # the spare waits
    sim.job.note_commits(sim.job.workers[sim.id("a[0]")], None, 20)  # what the control plane does for "writing"
    sim.exit("a[0]", KILLED)
    sim.exit("b[0]", KILLED)
    sim.advance(1)
    formed = [f for kind, f in sim.events if kind == "round_formed"][-1]
    assert sim.layout() == ["c[0]"] and formed["from_checkpoint"], formed  # not from the initial weights
