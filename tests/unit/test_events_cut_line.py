"""An events file whose last line a stopped driver cut short, then appended to by the next driver (review s54,
5b63947: the next driver's first event joined the cut line and ``cloud-elastic timeline`` refused the whole
file, 'line 2 is not an event')."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.events import JsonLinesEvents
from cloud_elastic.timeline import read_events

pytestmark = pytest.mark.timeout(60)

CUT = '{"v":1,"ts":1.0,"event":"worker_started","job":"job-a","wo'
STARTED = '{"v":1,"ts":2.0,"event":"job_started","job":"job-b","num_proc":1,"min_np":1,"max_np":1,"provider":"p"}'


def _driver(path: Path, job: str) -> None:
    with JsonLinesEvents(str(path), job) as sink:
        sink.emit("worker_started", worker="h[0]#1", host="h", slot=0)


def test_the_next_driver_starts_a_new_line_and_timeline_reads_past_the_cut_one(tmp_path: Path, caplog) -> None:
    path = tmp_path / "events.jsonl"
    _driver(path, "job-a")
    with open(path, "a") as fh:
        fh.write(CUT)  # the killed driver's last line
    _driver(path, "job-b")
    lines = path.read_text().splitlines()
    assert lines[1] == CUT and len(lines) == 3
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.timeline"):
        assert [(e["job"], e["worker"]) for e in read_events(str(path))] == [("job-b", "h[0]#1")]
    assert caplog.messages == [f"note: {path} line 2 is an event cut short (a driver was stopped while writing "
                               "it): left out"]
    assert [e["job"] for e in read_events(str(path), job="job-a")] == ["job-a"]


@pytest.mark.parametrize("before", ["", STARTED + "\n"])
def test_a_file_that_ends_its_lines_gets_no_blank_line(tmp_path: Path, before: str) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(before)
    _driver(path, "job-b")
    _driver(path, "job-b")
    assert "\n\n" not in path.read_text() and path.read_text().startswith(before)


def test_an_older_driver_s_event_joined_to_the_cut_line_is_read(tmp_path: Path, caplog) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(CUT + STARTED + "\n")  # written by a driver that did not start a new line
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.timeline"):
        assert [e["event"] for e in read_events(str(path))] == ["job_started"]
    assert caplog.messages == [f"note: {path} line 1 begins with an event cut short (a driver was stopped while "
                               "writing it): left out"]


@pytest.mark.parametrize("content", [CUT + "\nnot json\n" + STARTED + "\n", STARTED + "\n" + CUT + "\n"],
                         ids=["two-in-a-row", "followed-by-nothing"])
def test_a_broken_line_not_followed_by_an_event_is_still_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(content)
    line = 1 if content.startswith(CUT) else 2
    with pytest.raises(ConfigError, match=rf"line {line} is not an event \(a JSON object with 'event' and 'ts'\)$"):
        read_events(str(path))
