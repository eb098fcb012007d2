"""The events schema (v1), the JSON-lines writer and the documentation of every kind."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from cloud_elastic.events import SCHEMA, JsonLinesEvents, NullEvents, TeeEvents, validate

from .recorded_events import JOB, T0, TIMELINE, write_recorded_events

pytestmark = pytest.mark.timeout(20)

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def test_the_recorded_job_covers_every_kind_and_is_written_one_flushed_line_per_event(tmp_path: Path) -> None:
    path = write_recorded_events(tmp_path / "events.jsonl")
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == len(TIMELINE)
    assert {r["event"] for r in records} == set(SCHEMA)
    first = records[0]
    assert first == {"v": 1, "ts": T0, "event": "job_started", "job": JOB, "num_proc": 3, "min_np": 1,
                     "max_np": 4, "provider": "static", "command": ["python", "train.py"]}
    failed = next(r for r in records if r["event"] == "worker_failed")
    assert (failed["host"], failed["slot"], failed["signal"], failed["blacklisted_s"]) == ("127.0.0.1", 1, "SIGKILL", 10.0)


def test_each_event_is_on_disk_as_soon_as_it_is_emitted(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sink = JsonLinesEvents(str(path), "j")
    assert not path.exists()  # the constructor does no I/O
    sink.start()
    sink.emit("notice", source="gcp", host="10.0.0.5", deadline=None)
    assert json.loads(path.read_text())["host"] == "10.0.0.5"  # read while the file is still open
    sink.close()


def test_a_second_job_appends_and_keeps_the_first(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    for job in ("first", "second"):
        with JsonLinesEvents(str(path), job) as sink:
            sink.emit("job_finished", outcome="succeeded", exit_code=0, resets=0, wall_s=1.5)
    assert [json.loads(line)["job"] for line in path.read_text().splitlines()] == ["first", "second"]


def test_threads_emitting_at_once_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with JsonLinesEvents(str(path), "j") as sink:
        def burst(n: int) -> None:
            for i in range(200):
                sink.emit("worker_left", host=f"host-{n}-" + "x" * 200, slot=i, reason="host draining")
        threads = [threading.Thread(target=burst, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 1600
    assert sorted(r["slot"] for r in records if r["host"].startswith("host-3-")) == list(range(200))


@pytest.mark.parametrize(("kind", "fields", "message"), [
    ("worker_crashed", {}, "unknown event kind 'worker_crashed'"),
    ("worker_failed", {"host": "h", "slot": 0, "exit_code": 1}, "lacks required field(s) blacklisted_s"),
    ("worker_failed", {"host": "h", "slot": 0, "exit_code": 1, "blacklisted_s": 10, "cooldown": 3},
     "has no field 'cooldown'"),
    ("worker_failed", {"host": "h", "slot": "0", "exit_code": 1, "blacklisted_s": None}, "field 'slot' must be int"),
    ("round_formed", {"round": 1, "size": 2, "ranks": {}, "synced": 1}, "field 'synced' must be bool"),
    ("rollback", {"commit_step": 4, "steps_lost": True}, "field 'steps_lost' must be int"),
    ("notice", {"source": "aws", "host": "h"}, "lacks required field(s) deadline"),
])
def test_a_wrong_or_missing_field_is_refused_by_every_sink(kind: str, fields: dict, message: str, tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    with JsonLinesEvents(str(path), "j") as sink:
        for target in (sink, NullEvents(), TeeEvents(sink)):
            with pytest.raises(ValueError, match=re.escape(message)):
                target.emit(kind, **fields)
    assert path.read_text() == ""


def test_a_write_failure_is_logged_once_and_training_goes_on(tmp_path: Path, caplog) -> None:
    sink = JsonLinesEvents("/dev/full", "j")
    sink.start()
    for _ in range(3):
        sink.emit("checkpoint_saved", step=1, path="/ck")  # must not raise
    sink.close()
    assert len([r for r in caplog.records if "/dev/full" in r.getMessage()]) == 1


def test_docs_describe_every_kind_and_every_field_of_schema_v1() -> None:
    doc = DOC.read_text()
    assert '"v": 1' in doc
    for kind in SCHEMA.values():
        section = doc.split(f"### `{kind.name}`", 1)
        assert len(section) == 2, f"docs/events.md has no section for {kind.name}"
        body = section[1].split("\n### ", 1)[0]
        for name in (*kind.required, *kind.optional):
            assert f"`{name}`" in body, f"docs/events.md does not describe {kind.name}.{name}"


def test_every_recorded_event_validates() -> None:
    for _, kind, fields in TIMELINE:
        validate(kind, fields)


def test_open_sinks_feeds_the_file_and_the_metrics_and_refuses_a_taken_port(tmp_path: Path) -> None:
    import socket
    import urllib.request

    from cloud_elastic.errors import ConfigError
    from cloud_elastic.events import open_sinks

    path = tmp_path / "events.jsonl"
    opened = open_sinks("j", str(path), 0)
    try:
        opened.sink.emit("rollback", commit_step=10, steps_lost=4)
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{opened.metrics.port}/metrics", timeout=5).read().decode()
    finally:
        opened.close()
    assert json.loads(path.read_text())["steps_lost"] == 4
    assert "cloud_elastic_steps_lost_total 4.0" in scraped

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port {port}: "):
            open_sinks("j", str(tmp_path / "other.jsonl"), port)
    with pytest.raises(ConfigError, match="--events-file /nonexistent/e.jsonl: No such file or directory"):
        open_sinks("j", "/nonexistent/e.jsonl", None)
    nothing = open_sinks("j", None, None)
    nothing.sink.emit("checkpoint_loaded", step=1, path="/ck")
    assert nothing.metrics is None
