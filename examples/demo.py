"""The local elastic demo: a real training job that loses a worker, gains one, and sees one leave.

    ./dev demo [--out DIR]

Three workers train ``torch_synthetic.py`` on "hosts" 127.0.0.1 (2 slots) and
127.0.0.2 (1 slot), found by a discovery script. Mid-training the demo
``kill -9``s the worker on 127.0.0.2: the survivors roll back to their last
commit and carry on with two workers. Later a new "instance" 127.0.0.3
appears in discovery and is admitted without restarting anyone; later still it
is scaled in (it vanishes from discovery) and its worker leaves at a commit,
without a rollback. The job finishes all of its steps.

The job's events go to ``DIR/events.jsonl`` (``--events-file``) and the demo
draws them to ``DIR/timeline.png`` with ``cloud-elastic timeline``; it says
where both are. ``DIR`` defaults to a new temporary directory.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 300  # the kill at step 100, the join, the scale-in 60 steps later and its leave: done by step 200 here


def say(text: str) -> None:
    print(f"\033[1;36mdemo: {text}\033[0m" if sys.stdout.isatty() else f"demo: {text}", flush=True)


def worker_pid(job_id: str, host: str) -> int | None:
    """Find a worker of this job on ``host`` by process listing."""
    want_job = f"CLOUD_ELASTIC_JOB_ID={job_id}".encode()
    want_host = f"CLOUD_ELASTIC_HOSTNAME={host}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if want_job in env and want_host in env:
                return int(entry.name)
    return None


def draw(events: Path, picture: Path) -> None:
    """Draw the events with the CLI, as a user would; say where the files are."""
    say(f"events file: {events}")
    drawn = subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "timeline", str(events), "-o", str(picture)],
                           capture_output=True, text=True, cwd=HERE.parent, check=False)
    if drawn.returncode == 0:
        say(f"timeline picture: {picture}")
    else:  # e.g. matplotlib missing: the message names the extra to install
        say(f"no timeline picture: {(drawn.stderr or drawn.stdout).strip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="directory for events.jsonl and timeline.png (default: a new temp dir)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cloud-elastic-demo-"))  # the discovery script and its answer
    out = args.out or tmp
    try:
        return run(tmp, out)
    finally:
        if args.out is not None:  # else the events and the picture are there
            shutil.rmtree(tmp, ignore_errors=True)


def run(tmp: Path, out: Path) -> int:
    """The demo's job, its discovery script in ``tmp``, its events file and picture in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    events, picture = out.resolve() / "events.jsonl", out.resolve() / "timeline.png"
    if events.exists():
        events.unlink()  # the file is appended to; keep only this run's job
    hosts = tmp / "hosts.txt"
    hosts.write_text("127.0.0.1:2\n127.0.0.2:1\n")
    script = tmp / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat '{hosts}'\n")
    script.chmod(0o755)
    cmd = [
        sys.executable, "-m", "cloud_elastic.cli", "run",
        "-np", "3", "--min-np", "1", "--max-np", "4",
        "--host-discovery-script", str(script), "--discovery-interval", "0.5", "--host-missing-grace", "1",
        "--blacklist-cooldown-range", "600", "600", "--events-file", str(events),
        sys.executable, str(HERE / "torch_synthetic.py"), "--steps", str(STEPS), "--step-sleep", "0.05",
    ]
    say("starting: " + " ".join(c if " " not in c else repr(c) for c in cmd[2:]))
    say("discovery script reports 127.0.0.1:2 and 127.0.0.2:1 -> 3 workers")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=HERE.parent)
    job_id, killed, added, removed, t_start = None, False, False, False, time.monotonic()
    joined_at = None  # the step at which the newcomer's round formed
    last_step = 0
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            print(line, flush=True)
            job_id = job_id or (re.search(r"job (\w+): driver at", line) or [None, None])[1]
            step = re.search(r"step (\d+)/", line)
            if step and job_id and not killed and int(step.group(1)) >= 100:
                pid = worker_pid(job_id, "127.0.0.2")
                if pid:
                    say(f"simulating a lost spot instance: kill -9 of the worker on 127.0.0.2 (pid {pid})")
                    os.kill(pid, signal.SIGKILL)
                    killed = True
            # Added as soon as the survivors have re-formed, so that the newcomer (which has to
            # import torch first) joins well before the end even on a busy machine.
            if killed and not added and re.search(r"round \d+ formed with 2 worker", line):
                say("a new instance 127.0.0.3 joins the group (added to the discovery script's answer)")
                hosts.write_text("127.0.0.1:2\n127.0.0.3:1\n")
                added = True
            if added and joined_at is None and re.search(r"round \d+ formed with 3 worker", line):
                joined_at = last_step
            if step:
                last_step = int(step.group(1))
            if step and joined_at is not None and not removed and last_step >= joined_at + 60:
                say("127.0.0.3 is scaled in (gone from the discovery answer): its worker leaves at a commit")
                hosts.write_text("127.0.0.1:2\n")
                removed = True
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
    code = proc.wait()
    story = "it lost a worker, kept training, admitted a new one and let it go" if removed else "see the log above"
    say(f"job exited with code {code} after {time.monotonic() - t_start:.0f}s ({story})")
    if events.exists():
        draw(events, picture)
    return code


if __name__ == "__main__":
    sys.exit(main())
