"""``./dev demo`` (examples/demo.py): the job it runs, the events file it records, the picture it draws."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys

import pytest

from tests.integration.harness import REPO, parent_of_servers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_demo_records_its_events_and_draws_its_timeline(tmp_path):
    out = tmp_path / "demo"
    # Its driver's fork server comes from this test process's parent of servers, as every job's of the harness
    # does (a server of its own imports torch: some 2 CPU-seconds).
    parent = parent_of_servers()
    scratch = tmp_path / "tmp"  # where the demo writes its discovery script: gone after it, with --out
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), **({"CLOUD_ELASTIC_FORKSERVER_PARENT": parent} if parent else {})}
    demo = subprocess.run([sys.executable, str(REPO / "examples" / "demo.py"), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=280, check=False, env=env)
    assert demo.returncode == 0, demo.stdout[-5000:]
    said = dict(re.findall(r"^demo: (events file|timeline picture): (.+)$", demo.stdout, re.MULTILINE))
    assert said == {"events file": str(out / "events.jsonl"), "timeline picture": str(out / "timeline.png")}
    assert "admitted a new one and let it go" in demo.stdout
    assert not list(scratch.glob("cloud-elastic-demo-*")), "the demo left its discovery script behind"

    picture = (out / "timeline.png").read_bytes()
    assert picture[:8] == b"\x89PNG\r\n\x1a\n" and picture[12:16] == b"IHDR"
    width, height = struct.unpack(">II", picture[16:24])
    assert width >= 600 and height >= 300

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert len({e["job"] for e in events}) == 1  # a rerun into the same directory starts a fresh file
    kinds = [e["event"] for e in events]
    assert kinds[0] == "job_started" and kinds[-1] == "job_finished" and events[-1]["outcome"] == "succeeded"
    [failed] = [e for e in events if e["event"] == "worker_failed"]
    assert (failed["host"], failed["signal"]) == ("127.0.0.2", "SIGKILL")
    assert len([e for e in events if e["event"] == "rollback"]) == 1
    assert [e["size"] for e in events if e["event"] == "round_formed"] == [3, 2, 3, 2]
    [left] = [e for e in events if e["event"] == "worker_left"]
    assert left["host"] == "127.0.0.3" and "left the group" in left["reason"]
