"""The driver's book of workers: exited ones stay readable, but a step's scans cost only the live ones."""

from __future__ import annotations

from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.workers import WorkerBook, WorkerRecord, WorkerState
from tests.unit.test_job import started

S = WorkerState


def _record(n: int) -> WorkerRecord:
    return WorkerRecord(f"w{n}", Slot("h", n % 8), n, launched_at=0.0, last_seen=0.0)


def test_unexited_lists_the_workers_not_exited_in_the_order_they_came_and_the_book_keeps_them_all():
    book = WorkerBook()
    for n in range(4):
        book[f"w{n}"] = _record(n)
    book["w1"].to(S.LOST, "silent")
    book["w2"].to(S.EXITED, "done")
    assert [w.worker_id for w in book.unexited()] == ["w0", "w1", "w3"]
    book["w1"].to(S.EXITED, "gone")
    book["w4"] = _record(4)
    assert [w.worker_id for w in book.unexited()] == ["w0", "w3", "w4"]
    assert list(book) == ["w0", "w1", "w2", "w3", "w4"] and book["w2"].state is S.EXITED
    del book["w0"]
    assert [w.worker_id for w in book.unexited()] == ["w3", "w4"]


class _Counted(WorkerRecord):
    """An exited worker of the job's history that counts how often anything reads its state."""

    reads = 0

    @property
    def state(self) -> WorkerState:  # type: ignore[override]
        _Counted.reads += 1
        return self._state

    @state.setter
    def state(self, value: WorkerState) -> None:
        self._state = value


def test_a_job_that_churned_through_thousands_of_workers_steps_without_reading_its_history():
    sim = started(2, {"a": 2}, min_np=1)
    live = sim.job.alive()
    for n in range(5_000):  # the history of a long job with churn
        w = _Counted(f"old{n}", Slot("a", n % 2), 10_000 + n, launched_at=0.0, last_seen=0.0)
        w.to(S.EXITED, "ended")
        sim.job.workers[w.worker_id] = w
    assert sim.job.alive() == live
    _Counted.reads = 0
    for _ in range(50):  # steps and heartbeats (the driver's loop, not Sim.advance, which scans every record)
        sim.now += 0.05
        for w in live:
            sim.job.heartbeat(w.worker_id, sim.now, None)
        sim.job.tick(sim.now)
    assert sim.job.alive() == live and sim.outcome is None
    # Each step scanned every record before (250,000 reads here), taking most of a 50 ms tick by 20,000 records.
    assert _Counted.reads == 0
