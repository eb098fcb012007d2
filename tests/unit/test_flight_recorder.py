"""A worker's flight record: its last collectives, numbered alike on every rank, newest on the heartbeat."""

from __future__ import annotations

import tracemalloc

import pytest

from cloud_elastic.protocol import FlightEntry, PollRequest
from cloud_elastic.worker.link.pauses import BUSY_S, Pauses
from cloud_elastic.worker.rounds.flight import RING_SIZE, FlightRecorder

pytestmark = pytest.mark.timeout(120)  # the compile test imports dynamo: seconds on a loaded machine


def test_collectives_are_numbered_per_round_and_the_newest_rides_on_the_heartbeat() -> None:
    rec = FlightRecorder()
    assert rec.latest() is None
    rec.new_round(3)
    done = rec.entered("membership check", now=10.0)
    rec.completed(done, now=10.1)
    waiting = rec.entered("gradient allreduce", now=10.2)
    assert rec.latest(now=11.2) == {"round": 3, "seq": 2, "op": "gradient allreduce", "state": "entered",
                                    "age_s": 1.0}
    rec.completed(waiting, ok=False, now=11.5)
    assert rec.latest(now=12.0)["state"] == "failed" and rec.latest(now=12.0)["age_s"] == 0.5
    rec.new_round(4)
    rec.entered("broadcast parameters", now=13.0)
    assert (rec.latest(now=13.0)["round"], rec.latest(now=13.0)["seq"]) == (4, 1)
    # The entry travels as an optional field of the heartbeat and is checked on the way in.
    wire = PollRequest(4, 0, 0, flight=FlightEntry(**rec.latest(now=13.5))).to_wire()
    assert PollRequest.from_wire(wire).flight == FlightEntry(4, 1, "broadcast parameters", "entered", 0.5)
    assert PollRequest.from_wire({k: v for k, v in wire.items() if k != "flight"}).flight is None


def test_the_ring_keeps_its_last_collectives_and_allocates_nothing_per_collective() -> None:
    rec = FlightRecorder()
    rec.new_round(1)
    ops = [f"op{i}" for i in range(RING_SIZE * 3)]
    for op in ops[:RING_SIZE]:
        rec.completed(rec.entered(op, now=1.0), now=1.0)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for op in ops[RING_SIZE:]:
        rec.completed(rec.entered(op, now=2.0), now=2.0)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename")
                if s.traceback[0].filename.endswith("flight.py"))
    tracemalloc.stop()
    assert grown <= 0, f"{grown} bytes allocated by {2 * RING_SIZE} collectives"
    lines = rec.format(now=3.0).splitlines()
    assert len(lines) == RING_SIZE + 1 and lines[1].startswith(f"  round 1 #{2 * RING_SIZE + 1} op{2 * RING_SIZE}:")
    assert lines[-1].startswith(f"  round 1 #{3 * RING_SIZE} op{3 * RING_SIZE - 1}: entered 1.000s ago, completed")


def test_a_malformed_flight_entry_is_refused() -> None:
    from cloud_elastic.errors import ControlPlaneError

    for bad in ({"round": 1, "seq": 1, "op": "x", "state": "lost", "age_s": 0}, {"round": 1, "seq": "1", "op": "x",
                "state": "entered", "age_s": 0}, {"round": 1, "seq": 1, "op": 3, "state": "entered", "age_s": 0},
                {"round": 1, "seq": 1, "op": "x", "state": "entered", "age_s": -1}, ["entered"]):
        with pytest.raises(ControlPlaneError):
            PollRequest.from_wire({"round": 1, "update_gen": 0, "abort_round": 0, "flight": bad})


def test_the_expected_garbage_collector_pause_grows_with_the_heap_and_remembers_a_measured_one() -> None:
    import gc

    pauses = Pauses()
    pauses.start()
    try:
        small = pauses.expected_s()
        heap = [[i] for i in range(1_000_000)]
        big = pauses.expected_s()
        assert big > small + 0.1  # the prior: a full collection of a larger heap holds the GIL longer
        gc.collect()
        measured = pauses._longest
        del heap
        assert measured > 0 and pauses.expected_s() >= round(measured, 3)  # remembered after the heap is gone
        assert pauses.expected_s(first_step=True) == BUSY_S  # a round's first step may compile
    finally:
        pauses.close()
    assert pauses._callback not in gc.callbacks


def test_a_worker_compiling_announces_a_long_pause_once_dynamo_is_in_use() -> None:
    import torch

    pauses = Pauses()
    pauses.start()
    try:
        seen = []
        model = torch.nn.Linear(4, 4)

        def spy(gm, example_inputs):
            seen.append(pauses.expected_s())  # called while dynamo compiles
            return gm.forward

        pauses.expected_s()  # the heartbeat thread looks: dynamo is not in use yet, nothing hooked
        compiled = torch.compile(model, backend=spy)
        import torch._dynamo.callback  # noqa: F401 (what torch.compile's first call imports)
        pauses.expected_s()  # hooked now
        compiled(torch.randn(2, 4))
        assert seen == [BUSY_S] and pauses.expected_s() < BUSY_S
    finally:
        pauses.close()
