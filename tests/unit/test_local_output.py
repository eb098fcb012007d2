"""How a worker's output stream becomes forwarded lines (local and SSH workers alike)."""

from __future__ import annotations

import io
import os
import threading
import tracemalloc

import pytest

from cloud_elastic.driver.launch.local import forward_lines

pytestmark = pytest.mark.timeout(60)


def _forwarded(data: bytes) -> list[str]:
    lines: list[str] = []
    forward_lines(io.BytesIO(data), lines.append)
    return lines


def test_lines_end_at_newlines_and_at_a_bare_carriage_return():
    assert _forwarded(b"one\ntwo\r\n\nthree") == ["one", "two", "", "three"]
    # A redrawn progress bar: only what a terminal would still show of one read is forwarded.
    assert _forwarded(b"\r 10%\r 50%\r100%\ndone\n") == ["100%", "done"]
    assert _forwarded(b"\r 10%\r 50%") == [" 10%", " 50%"]  # the last complete one, then the rest at EOF


def test_a_progress_bar_that_never_writes_a_newline_is_forwarded_in_bounded_pieces_with_bounded_memory():
    read_fd, write_fd = os.pipe()
    batch = b"".join(b"\r  epoch 1: %d/200000 [loss=0.1234567]" % i for i in range(10_000))

    def write() -> None:
        with os.fdopen(write_fd, "wb") as pipe:
            for _ in range(20):  # 200,000 updates, 8 MB, no \n at all
                pipe.write(batch)
            pipe.write(b"\rlast")

    lines: list[str] = []
    writer = threading.Thread(target=write, daemon=True)
    tracemalloc.start()
    try:
        writer.start()
        forward_lines(os.fdopen(read_fd, "rb"), lines.append)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    writer.join(10)
    assert lines[-1] == "last"
    assert len(lines) > 10 and all(line.startswith("  epoch 1: ") for line in lines[:-1])
    assert max(len(line) for line in lines) < 100  # each a single update, not the updates run together
    assert peak < 1024 * 1024, f"the reader held {peak / 1e6:.1f} MB"


def test_a_line_longer_than_a_chunk_is_forwarded_in_pieces_without_splitting_a_character():
    text = "é" * 100_000  # 200 kB of two-byte characters, no line break
    lines = _forwarded(text.encode() + b"\n")
    assert "".join(lines) == text and len(lines) > 1
    assert max(len(line.encode()) for line in lines) <= 64 * 1024
