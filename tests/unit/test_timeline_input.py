"""cloud-elastic timeline on events files that are not what a driver writes: one line naming the line, bounded
memory, and only the drawn job kept (review s54: tracebacks, and 427 MB to refuse a 200 MB line)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.timeline import read_events

from .recorded_events import JOB, write_recorded_events

pytestmark = pytest.mark.timeout(60)

STARTED = '{"v":1,"ts":1.0,"event":"job_started","job":"j1","num_proc":2,"min_np":1,"max_np":2,"provider":"static"}\n'


@pytest.mark.parametrize(("second", "message"), [
    ('{"v":1,"ts":2.0,"event":"round_formed","job":"j1"}', "line 2: event 'round_formed' lacks required field(s) "
                                                           "round, size, ranks, synced"),
    ('{"v":1,"ts":"2","event":"notice","job":"j1","source":"aws","host":"h","deadline":null}',
     "line 2: 'ts' must be a number of seconds, got '2'"),
    ('{"v":1,"ts":2.0,"event":"rollback","job":"j1","commit_step":3,"steps_lost":"many"}',
     "line 2: event 'rollback' field 'steps_lost' must be int, got 'many'"),
    ('{"v":1,"ts":2.0,"event":"cost","job":"j1","dollars":"x","dollars_per_hour":1,"slot_hours":1}',
     "line 2: event 'cost' field 'dollars' must be int or float, got 'x'"),
])
def test_a_malformed_event_is_one_line_naming_its_line_and_exit_2(tmp_path: Path, second: str, message: str) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text(STARTED + second + "\n")
    result = subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "timeline", str(path), "-o",
                             str(tmp_path / "t.png")], capture_output=True, text=True, timeout=50)
    assert (result.returncode, result.stderr) == (2, f"cloud-elastic: error: {path} {message}\n")
    assert not (tmp_path / "t.png").exists()


def test_an_overlong_line_is_refused_by_its_number_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    with path.open("w") as fh:
        fh.write(STARTED + '{"v":1,"ts":2.0,"event":"notice","job":"j1","host":"h","source":"aws","pad":"')
        fh.write("a" * (24 << 20))  # and no newline: the whole rest of the file is one line
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as err:
            read_events(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == f"{path} line 2: longer than 1048576 characters"
    assert peak < 12 << 20, f"{peak} bytes held to refuse the line"


def test_only_the_drawn_job_is_held_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    old = {"v": 1, "event": "notice", "job": "older", "source": "aws", "host": "h" * 200, "deadline": None}
    with path.open("w") as fh:
        for i in range(30_000):  # a long earlier job appended to the same file
            fh.write(json.dumps({**old, "ts": float(i)}) + "\n")
    write_recorded_events(path)
    tracemalloc.start()
    try:
        events = read_events(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert {e["job"] for e in events} == {JOB} and len(events) > 20
    assert peak < 4 << 20, f"{peak} bytes held to draw a job of {len(events)} events"


def test_a_last_line_cut_short_is_left_out_with_a_note(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A driver killed mid-write leaves half a line at the end: the job before it is still drawn."""
    path = write_recorded_events(tmp_path / "e.jsonl")
    whole = read_events(str(path))
    with path.open("a") as fh:
        fh.write('{"v":1,"ts":1763900099.0,"event":"round_fo')
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.timeline"):
        assert read_events(str(path)) == whole
    lines = len(path.read_text().splitlines())
    assert caplog.messages == [f"note: {path} line {lines} has no newline at its end (the driver was stopped while "
                               "writing it): left out"]
