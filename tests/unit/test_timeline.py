"""cloud-elastic timeline: a recorded events file becomes a PNG; what the picture is built from."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cloud_elastic.timeline import build_timeline, read_events

from .recorded_events import JOB, write_recorded_events

pytestmark = pytest.mark.timeout(60)

CLI = [sys.executable, "-m", "cloud_elastic.cli"]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_timeline_command_writes_a_png_of_the_recorded_job(tmp_path: Path) -> None:
    events = write_recorded_events(tmp_path / "events.jsonl")
    out = tmp_path / "timeline.png"
    result = subprocess.run([*CLI, "timeline", str(events), "-o", str(out)], capture_output=True, text=True,
                            timeout=50)
    assert result.returncode == 0, result.stderr
    width, height = _png_size(out)
    assert width >= 600 and height >= 300
    assert result.stdout.strip() == (
        f"cloud-elastic: wrote {out} (job {JOB}: 5 workers on 5 host slots, 4 rounds, "
        "1 rollback (7 steps lost), 1 notice, cost $0.0125)"  # the recorded cost event's running total
    )


def test_the_picture_is_built_from_the_lives_rounds_notices_and_rollbacks(tmp_path: Path) -> None:
    line = build_timeline(read_events(str(write_recorded_events(tmp_path / "e.jsonl"))))
    assert [(round(t, 3), size) for t, size in line.world] == [(2.0, 3), (10.0, 2), (16.2, 1), (20.0, 2)]
    assert [(round(t, 3), d) for t, d in line.cost] == [(26.0, 0.0125)]
    killed = line.lanes[("127.0.0.1", 1)][0]
    assert (round(killed.start, 3), round(killed.ready, 3), round(killed.end, 3), killed.how) == (0.2, 1.6, 9.0, "failed")
    assert line.lanes[("127.0.0.2", 0)][0].how == "left"
    assert line.lanes[("127.0.0.1", 0)][0].how == "finished"
    assert line.lanes[("127.0.0.3", 0)][0].start == pytest.approx(18.1)
    assert line.rollbacks == [(pytest.approx(9.1), 7, 40)]
    assert line.notices == [(15.0, "127.0.0.2", "aws")]
    assert line.outcome == "succeeded"


def test_a_spare_and_a_worker_waiting_for_its_round_are_drawn_waiting_not_training(tmp_path: Path) -> None:
    line = build_timeline(read_events(str(write_recorded_events(tmp_path / "e.jsonl"))))
    # 127.0.0.3 was ready at 19.5 and trained from round 4 at 20.0; the spare on 127.0.0.4 never trained.
    assert line.lanes[("127.0.0.3", 0)][0].phases == [(pytest.approx(18.1), "starting"),
                                                       (pytest.approx(19.5), "waiting"), (20.0, "training")]
    assert [p for _, p in line.lanes[("127.0.0.4", 0)][0].phases] == ["starting", "waiting"]
    # An events file written before round_formed named its members: a ready worker counts as training.
    old = [{k: v for k, v in e.items() if k != "workers" or e["event"] != "round_formed"}
           for e in read_events(str(tmp_path / "e.jsonl"))]
    assert [p for _, p in build_timeline(old).lanes[("127.0.0.4", 0)][0].phases] == ["starting", "training"]


def test_the_last_job_in_an_appended_file_is_drawn(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    write_recorded_events(path, job="older")
    write_recorded_events(path)
    assert {e["job"] for e in read_events(str(path))} == {JOB}
    assert {e["job"] for e in read_events(str(path), job="older")} == {"older"}


@pytest.mark.parametrize(("content", "message"), [
    ('{"v":1,"ts":1,"event":"job_started","job":"j","num_proc":1,"min_np":1,"max_np":1,"provider":"p"}\n'
     'not json\n', "line 2 is not an event"),
    ("", "holds no events"),
])
def test_a_bad_events_file_is_a_one_line_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text(content)
    result = subprocess.run([*CLI, "timeline", str(path), "-o", str(tmp_path / "t.png")], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("cloud-elastic: error: ") and message in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "t.png").exists()


def test_missing_matplotlib_names_the_plot_extra(tmp_path: Path) -> None:
    events = write_recorded_events(tmp_path / "events.jsonl")
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from cloud_elastic.cli import main\n"
        f"sys.exit(main(['timeline', {str(events)!r}, '-o', {str(tmp_path / 't.png')!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr == "cloud-elastic: error: cloud-elastic timeline needs matplotlib: pip install 'cloud-elastic[plot]'\n"


@pytest.mark.parametrize("name", ["t.txt", "pic", "d/"])
def test_an_output_without_a_picture_suffix_is_a_one_line_error_and_nothing_is_written(tmp_path: Path,
                                                                                       name: str) -> None:
    """matplotlib refused t.txt with a traceback, and wrote pic.png or d/.png while the line named pic or d/."""
    events = write_recorded_events(tmp_path / "events.jsonl")
    (tmp_path / "d").mkdir()
    result = subprocess.run([*CLI, "timeline", str(events), "-o", str(tmp_path / name)], capture_output=True,
                            text=True, timeout=50)
    assert (result.returncode, result.stderr) == (2, f"cloud-elastic: error: cannot write {str(tmp_path / name)!r}: "
                                                     "the picture's file name must end in .png, .svg or .pdf\n")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["d", "events.jsonl"]
