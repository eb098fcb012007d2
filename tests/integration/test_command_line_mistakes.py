"""Mistakes on the command line that cost a user minutes, each said in one line (review s63 rvU findings 3-5).

Real jobs on loopback hosts:

* a host whose name does not resolve where its worker runs (``127.nosuch``, like a name only the driver's
  ``~/.ssh/config`` knows) failed every round "Cannot resolve ..." for the whole ``--elastic-timeout``, next to
  a good host that would have met ``--min-np``, and the end line blamed the firewall. Its worker now exits with
  one line before it registers, its slot is blacklisted, and the good host trains;
* a script's name mistyped ended "exited with code 2" only: the interpreter's line is in the end line now;
* ``--checkpoint-dir python train.py`` (the directory forgotten) is warned of at start, and so is ``-x NAME``
  with NAME not set in the driver's environment (a forgotten ``export``: remote workers ran without it, unsaid);
* ``status JOB`` just after the job ended says how it ended, not "no job JOB on this machine" (finding 8), and
  exits 0, as an answer, not as a mistake on the command line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.integration.harness import CLI, PROBE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_a_host_whose_name_does_not_resolve_is_left_out_and_the_good_host_trains(jobs):
    job = jobs(["run", "-np", "2", "--min-np", "1", "-H", "127.0.0.1:1,127.nosuch:1", "--elastic-timeout", "30",
                "--blacklist-cooldown-range", "300", "300", sys.executable, str(PROBE), "--steps", "10"])
    assert job.finish(timeout=45) == 0, job.output()
    out = job.output()
    assert "host name '127.nosuch' does not resolve on that host (" in out, out
    assert "slot 127.nosuch[0] blacklisted" in out and "Cannot resolve" not in out, out
    assert [e["step"] for e in job.events if e.kind == "done"] == [10], out


def test_a_mistyped_script_name_is_in_the_jobs_last_line(jobs, tmp_path):
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:2", sys.executable, "trian.py"], cwd=tmp_path)
    assert job.finish(timeout=45) == 1, job.output()
    last = job.lines[-1]
    assert "failed: all workers failed" in last and "exited with code 2 after printing: " in last, last
    assert f"can't open file '{tmp_path / 'trian.py'}': [Errno 2] No such file or directory" in last, last


def test_a_forgotten_checkpoint_dir_value_is_warned_of(jobs, tmp_path):
    (tmp_path / "train.sh").write_text("echo trained\n")  # sh is on every PATH, as python is on a user's
    job = jobs(["run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", "sh", "train.sh"], cwd=tmp_path)
    job.finish(timeout=45)  # 'train.sh' is no command: the job fails, as given
    assert job.lines[0] == ("cloud-elastic: warning: --checkpoint-dir 'sh' names a program, and the command "
                            "left starts with the script 'train.sh', which is no program: was --checkpoint-dir's "
                            "value forgotten? (--checkpoint-dir DIR sh train.sh ...)"), job.output()


def test_a_forwarded_variable_the_driver_does_not_have_is_warned_of(jobs, tmp_path):
    """``-x NAME`` passes the driver's value; a forgotten ``export`` left remote workers without it, unsaid."""
    env = {k: v for k, v in os.environ.items() if k != "CE_NOT_EXPORTED"}
    job = jobs(["run", "-np", "1", "-H", "127.0.0.1:1", "-x", "CE_NOT_EXPORTED", "-x", "CE_GIVEN=1",
                sys.executable, str(PROBE), "--steps", "2"], env=env)
    assert job.finish(timeout=45) == 0, job.output()
    assert job.lines[0] == ("cloud-elastic: warning: -x CE_NOT_EXPORTED: not set in the driver's environment, so not "
                            "passed to the workers (export it, or give -x NAME=VALUE)"), job.output()


def test_status_right_after_the_job_ended_says_how_it_ended(jobs, tmp_path):
    # "no job JOB on this machine" read as "it never existed" (review s63 rvU finding 8).
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    job = jobs(["run", "-np", "1", "-H", "127.0.0.1:1", sys.executable, str(PROBE), "--steps", "3"], env=env)
    assert job.finish(timeout=45) == 0, job.output()
    job_id = re.search(r"job (\w+) succeeded: ", job.lines[-1]).group(1)
    status = subprocess.run([*CLI, "status", job_id], env={**os.environ, **env}, capture_output=True,
                            text=True, timeout=30)
    # An answer, not an error: one plain line and exit 0, as --json (below); exit 2 is for a mistyped job id.
    assert (status.returncode, status.stderr) == (0, ""), status
    assert re.fullmatch(rf"job {job_id} is not running: it ended \d+s ago \(succeeded: "
                        r"training completed on 1 worker\(s\) after 0 reset\(s\)\)\n", status.stdout), status.stdout
    # --json says it as JSON, for scripts (review h9: it printed the text line alone, on stderr).
    status = subprocess.run([*CLI, "status", "--json", job_id], env={**os.environ, **env}, capture_output=True,
                            text=True, timeout=30)
    assert status.returncode == 0, status
    told = json.loads(status.stdout)
    assert (told["job"], told["running"], told["how"]) == (
        job_id, False, "succeeded: training completed on 1 worker(s) after 0 reset(s)"), told
    assert abs(told["ended_at"] - time.time()) < 60
