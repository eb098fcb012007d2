"""The local elastic demo: a real training job that loses a worker and gains one back.

    ./dev demo

Three workers train ``torch_synthetic.py`` on "hosts" 127.0.0.1 (2 slots) and
127.0.0.2 (1 slot), found by a discovery script. Mid-training the demo
``kill -9``s the worker on 127.0.0.2: the survivors roll back to their last
commit and carry on with two workers. Later a new "instance" 127.0.0.3
appears in discovery and is admitted without restarting anyone. The job
finishes all of its steps; the demo prints a short summary.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 400


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


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="cloud-elastic-demo-"))
    hosts = tmp / "hosts.txt"
    hosts.write_text("127.0.0.1:2\n127.0.0.2:1\n")
    script = tmp / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat '{hosts}'\n")
    script.chmod(0o755)
    cmd = [
        sys.executable, "-m", "cloud_elastic.cli", "run",
        "-np", "3", "--min-np", "1", "--max-np", "4",
        "--host-discovery-script", str(script), "--discovery-interval", "0.5",
        "--blacklist-cooldown-range", "600", "600",
        sys.executable, str(HERE / "torch_synthetic.py"), "--steps", str(STEPS), "--step-sleep", "0.03",
    ]
    say("starting: " + " ".join(c if " " not in c else repr(c) for c in cmd[2:]))
    say("discovery script reports 127.0.0.1:2 and 127.0.0.2:1 -> 3 workers")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=HERE.parent)
    job_id, killed, added, t_start = None, False, False, time.monotonic()
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
            if step and killed and not added and int(step.group(1)) >= 220:
                say("a new instance 127.0.0.3 joins the group (added to the discovery script's answer)")
                hosts.write_text("127.0.0.1:2\n127.0.0.3:1\n")
                added = True
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
    code = proc.wait()
    say(f"job exited with code {code} after {time.monotonic() - t_start:.0f}s "
        f"({'it lost a worker, kept training, and admitted a new one' if killed and added else 'see the log above'})")
    return code


if __name__ == "__main__":
    sys.exit(main())
