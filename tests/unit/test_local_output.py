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
    # A redrawn progress bar: its first state, the latest one held back when a \n-ended line comes, that line.
    assert _forwarded(b"\r 10%\r 20%\r 50%\r100%\ndone\n") == [" 10%", " 50%", "100%", "done"]
    assert _forwarded(b"\r 10%\r 50%") == [" 10%", " 50%"]  # the last complete one, then the rest at EOF
    assert _forwarded(b"\r 10%\r 20%\r 50%\r") == [" 10%", " 50%"]  # the held one at EOF


class _Chunks:
    """A stream that hands out one chunk per read, and a clock that says which read it is on (1/8 s apart)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks, self.reads = list(chunks), 0

    def read1(self, _size: int) -> bytes:
        self.reads += 1
        return self._chunks.pop(0) if self._chunks else b""

    def clock(self) -> float:
        return self.reads * 0.125

    def close(self) -> None:
        pass


def _bar(chunks: list[bytes]) -> list[str]:
    stream, lines = _Chunks(chunks), []
    forward_lines(stream, lines.append, clock=stream.clock)
    return lines


def test_a_progress_bar_redrawn_eight_times_a_second_is_forwarded_once_every_five_seconds_and_at_its_end():
    redraws = [b"\r%3d%%|%s|" % (i, b"#" * (i // 10)) for i in range(101)]  # tqdm: \r, then the bar
    lines = _bar(redraws + [b"\n", b"EVENT done\n"])  # 12.6 s of redraws, then the bar's \n
    assert lines == ["  0%||", " 40%|####|", " 80%|########|", " 99%|#########|", "100%|##########|", "EVENT done"]


def test_lines_among_redraws_keep_their_order_and_are_never_merged_with_a_bar():
    # As tqdm.write prints under a bar: wipe the bar with spaces, write the line, draw the bar again.
    lines = _bar([b"\r 1%", b"\r 2%", b"\r   \rEVENT a\n", b"\r 2%", b"\r 3%", b"\r   \rEVENT b\n\r 3%",
                  b"\r 4%", b"\n"])
    assert lines == [" 1%", " 2%", "EVENT a", " 3%", "EVENT b", " 3%", " 4%"]


def test_a_progress_bar_that_never_writes_a_newline_is_forwarded_in_single_updates_with_bounded_memory():
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
    assert len(lines) >= 2 and all(line.startswith("  epoch 1: ") for line in lines[:-1])
    assert max(len(line) for line in lines) < 100  # each a single update, not the updates run together
    assert peak < 1024 * 1024, f"the reader held {peak / 1e6:.1f} MB"


def test_a_line_longer_than_a_chunk_is_forwarded_in_pieces_without_splitting_a_character():
    text = "é" * 100_000  # 200 kB of two-byte characters, no line break
    lines = _forwarded(text.encode() + b"\n")
    assert "".join(lines) == text and len(lines) > 1
    assert max(len(line.encode()) for line in lines) <= 64 * 1024
