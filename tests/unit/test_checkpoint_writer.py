"""CheckpointWriter: the caller never waits for the upload, writes what was submitted, one at a time.

Slow storage is a LocalBackend whose writes of the data object wait for the
test to release them, so "a write is in flight" is a state the test holds,
not a race it hopes to win.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import BinaryIO, Callable

import pytest
import torch

from cloud_elastic.checkpoint import CheckpointError, CheckpointStore, CheckpointWriter, PeriodicCheckpointer
from cloud_elastic.checkpoint.backend import LocalBackend

pytestmark = pytest.mark.timeout(60)


class _GatedBackend(LocalBackend):
    """A local directory whose data writes block until ``release`` is set (or fail when ``fail`` is)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.release = threading.Event()
        self.writing = threading.Event()
        self.fail = False

    def write(self, path: str, produce: Callable[[BinaryIO], None]) -> None:
        if path.endswith("state.pt"):
            self.writing.set()
            if not self.release.wait(30):
                raise TimeoutError("the test never released the write")
            if self.fail:
                raise OSError("No space left on device")
        super().write(path, produce)


def _gated_store(tmp_path: Path) -> tuple[CheckpointStore, _GatedBackend]:
    backend = _GatedBackend(str(tmp_path))
    return CheckpointStore(str(tmp_path), keep=3, backend=backend), backend


def test_submit_returns_while_the_upload_is_stuck_and_writes_the_values_submitted(tmp_path: Path) -> None:
    store, backend = _gated_store(tmp_path)
    weights = torch.arange(1000, dtype=torch.float32)
    with CheckpointWriter(store) as writer:
        assert writer.submit(5, {"w": weights, "epoch": 1}, {"epoch": 1}) is True
        assert backend.writing.wait(10)
        assert writer.busy and store.latest() is None  # the write has not finished: no checkpoint yet
        weights.mul_(-1)  # training goes on and changes the tensor in place
        # A second checkpoint while the first is in flight is refused without copying anything.
        assert writer.submit(6, {"w": weights, "epoch": 1}) is False
        backend.release.set()
        assert writer.wait(10)
        latest = store.latest()
        assert latest.info.step == 5 and latest.info.epoch == 1
        assert torch.equal(latest.payload["w"], torch.arange(1000, dtype=torch.float32))
        # Idle again: the next commit's submit goes through.
        assert writer.submit(7, {"w": weights, "epoch": 2}) is True
    assert store.latest().info.step == 7 and torch.equal(store.latest().payload["w"], weights)
    stats = writer.stats()
    assert (stats.submitted, stats.skipped, stats.written, stats.failed) == (3, 1, 2, 0)
    assert stats.last_written.step == 7


def test_close_flushes_the_checkpoint_in_flight(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    writer = CheckpointWriter(store).start()
    assert writer.submit(3, {"w": torch.ones(10)})
    assert writer.close(timeout=30) is True
    assert store.latest().info.step == 3
    with pytest.raises(CheckpointError, match="not running"):
        writer.submit(4, {"w": torch.ones(10)})


def test_close_with_a_timeout_returns_false_while_the_write_is_stuck(tmp_path: Path) -> None:
    store, backend = _gated_store(tmp_path)
    writer = CheckpointWriter(store).start()
    writer.submit(1, {"w": torch.ones(3)})
    assert backend.writing.wait(10)
    assert writer.close(timeout=0.2) is False
    assert store.latest() is None
    backend.release.set()
    assert writer.wait(10) and store.latest().info.step == 1


def test_a_failed_write_is_a_warning_and_the_next_one_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, backend = _gated_store(tmp_path)
    backend.fail = True
    backend.release.set()
    with CheckpointWriter(store) as writer:
        with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
            assert writer.submit(1, {"w": torch.ones(3)})
            assert writer.wait(10)
        assert writer.stats().failed == 1 and "No space left" in writer.stats().last_error
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "step 1 was not written" in warnings[0] and "No space left" in warnings[0]
        backend.fail = False
        assert writer.submit(2, {"w": torch.ones(3)})
        assert writer.wait(10)
    assert store.latest().info.step == 2


def test_a_payload_that_cannot_be_checkpointed_is_refused_at_submit(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    with CheckpointWriter(store) as writer:
        with pytest.raises(CheckpointError, match=r"payload\['fn'\]"):
            writer.submit(1, {"w": torch.ones(3), "fn": print})
        assert not writer.busy
        assert writer.submit(2, {"w": torch.ones(3)})
    assert store.latest().info.step == 2


def test_submit_before_start_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="start"):
        CheckpointWriter(CheckpointStore(str(tmp_path))).submit(1, {})


def test_the_copy_reuses_its_buffers_and_follows_a_changed_structure(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    a = torch.zeros(100)
    with CheckpointWriter(store) as writer:
        writer.submit(1, {"a": a})
        writer.wait(10)
        first = writer._staged["a"]
        a.add_(1)
        writer.submit(2, {"a": a})
        writer.wait(10)
        assert writer._staged["a"] is first  # same buffer, refilled
        writer.submit(3, {"a": torch.ones(5), "b": [torch.ones(2)]})  # shapes and keys changed
        writer.wait(10)
    payload = store.latest().payload
    assert torch.equal(payload["a"], torch.ones(5)) and torch.equal(payload["b"][0], torch.ones(2))


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_periodic_checkpoints_at_the_first_commit_then_each_interval_and_retries_when_busy(tmp_path: Path) -> None:
    store, backend = _gated_store(tmp_path)
    clock = _Clock()
    built = []

    def payload(state: dict) -> dict:
        built.append(state["step"])
        return dict(state)

    with CheckpointWriter(store) as writer:
        periodic = PeriodicCheckpointer(writer, interval_s=10, clock=clock, payload=payload)
        assert periodic.after_commit({"step": 1}, 1) is True  # the first commit is protected at once
        assert backend.writing.wait(10)
        clock.now += 11  # the interval has passed, but the first write is still stuck
        assert periodic.after_commit({"step": 2}, 2) is False
        assert built == [1], "no payload is built while the writer is busy"
        backend.release.set()
        assert writer.wait(10)
        assert periodic.after_commit({"step": 3}, 3) is True  # the next commit after the writer is free
        assert writer.wait(10)
        clock.now += 5
        assert periodic.after_commit({"step": 4}, 4) is False  # 5 s since the last one
        clock.now += 5
        assert periodic.after_commit({"step": 5}, 5) is True
    assert built == [1, 3, 5]
    assert [info.step for info in store.list()] == [5, 3, 1]


def test_periodic_refuses_a_non_positive_interval(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="interval"):
        PeriodicCheckpointer(CheckpointWriter(CheckpointStore(str(tmp_path))), interval_s=0)
