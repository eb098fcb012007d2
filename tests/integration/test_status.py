"""``cloud-elastic status`` against a running job: what it shows, and whom it refuses.

One job on three loopback hosts: the worker on 127.0.0.2 is killed (its slot is
blacklisted for 600 s) and 127.0.0.3 gets a spot notice from its fake metadata
service (it drains; the notice stays pending until its deadline). The status
command then runs as the job's user and with a wrong secret. A second, smaller
job is asked about by ``nobody`` (needs root to switch users; CI runs as root).
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest

from tests.emulator.fake_metadata import FakeAWSMetadata, per_host
from tests.integration.harness import CLI, REPO, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def runtime_dir():
    """A private XDG_RUNTIME_DIR for the job's record (other jobs on the machine stay out of the listing).

    Traversable by everyone, as /run/user is, so another user's refusal comes from the
    record's own 0700 directories.
    """
    path = Path(tempfile.mkdtemp(prefix="ce-status-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def status(runtime_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """``cloud-elastic status ARGS`` as this test's user."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir), "PYTHONPATH": str(REPO)}
    return subprocess.run(CLI + ["status", *args], env=env, capture_output=True, text=True, timeout=60,
                          cwd="/", check=False)


def status_as_nobody(runtime_dir: Path, scratch: Path, *args: str) -> subprocess.CompletedProcess:
    """``cloud-elastic status ARGS`` as the user ``nobody`` (no groups), with the same XDG_RUNTIME_DIR.

    This process forks and the child drops to nobody's uid and gid, then runs the CLI's ``main()``
    from the modules already imported: a fresh interpreter may live where nobody cannot read it
    (a pyenv under /root), which would fail for the wrong reason.
    """
    from cloud_elastic import cli, status as _status  # noqa: F401 (imported before dropping privileges)

    nobody = pwd.getpwnam("nobody")
    out, err = scratch / "nobody.out", scratch / "nobody.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 70
            try:
                os.dup2(stdout.fileno(), 1)
                os.dup2(stderr.fileno(), 2)
                sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                os.environ.update(XDG_RUNTIME_DIR=str(runtime_dir), HOME="/nonexistent")
                code = cli.main(["status", *args])
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, wait_status = os.waitpid(pid, 0)
    return subprocess.CompletedProcess(["status", *args], os.waitstatus_to_exitcode(wait_status),
                                       out.read_text(), err.read_text())


def test_status_shows_the_running_job_and_refuses_a_wrong_secret(jobs, tmp_path, runtime_dir):
    events = tmp_path / "events.jsonl"
    with per_host(FakeAWSMetadata, ["127.0.0.1", "127.0.0.2", "127.0.0.3"]) as fakes:
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{fakes['127.0.0.1'].port}",
               "AWS_EC2_METADATA_DISABLED": "false", "XDG_RUNTIME_DIR": str(runtime_dir)}
        job = jobs(["run", "-np", "3", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                    "--notice-watcher", "aws", "--blacklist-cooldown-range", "600", "600",
                    "--events-file", str(events), *probe_cmd("--steps", "100000")], env=env)
        victim = job.wait_event("hello", rank=1)
        job.wait_event("commit", rank=0, step=3)
        os.kill(victim["pid"], signal.SIGKILL)
        job.wait_event("commit", rank=0, size=2)
        deadline = time.time() + 600
        fakes["127.0.0.3"].set_spot_action("terminate", when=deadline)
        last = job.wait_event("commit", rank=0, size=1)
        job_id = job.job_id()

        # Without a job id, the one job running for this user is shown; with it, the same.
        listed = status(runtime_dir)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.startswith(f"job {job_id}: training, up ")
        # The driver learns rank 0's commits from its heartbeats, each held up to 0.5 s: ask until
        # the one in flight when `last` was committed has come back (the rest of the reply is settled).
        until = time.time() + 30
        while True:
            shown = status(runtime_dir, job_id, "--json")
            assert shown.returncode == 0, shown.stderr
            reply = json.loads(shown.stdout)
            if (reply["commit_step"] or 0) >= last["step"] or time.time() > until:
                break
            time.sleep(0.2)
        assert (reply["job"], reply["phase"], reply["round"], reply["world_size"]) == (job_id, "training", 3, 1)
        assert (reply["num_proc"], reply["min_np"], reply["max_np"], reply["resets"]) == (3, 1, 3, 2)
        assert reply["provider"] == "static" and reply["commit_step"] >= last["step"]
        assert reply["whole_host_slots"] == 0  # without --whole-hosts
        assert reply["steps_per_s"] is not None and reply["steps_per_s"] > 0  # rank 0 is committing
        hosts = {h["host"]: h for h in reply["hosts"]}
        assert (hosts["127.0.0.1"]["state"], hosts["127.0.0.1"]["slots"]) == ("ready", 1)
        [worker] = hosts["127.0.0.1"]["workers"]
        assert (worker["slot"], worker["rank"], worker["state"]) == (0, 0, "training")
        assert (hosts["127.0.0.2"]["state"], hosts["127.0.0.2"]["workers"]) == ("ready", [])
        # Its worker left the round at a commit; its process may still be on its way out.
        assert (hosts["127.0.0.3"]["state"], hosts["127.0.0.3"]["slots"]) == ("draining", 1)  # not 0: its slot
        assert all((w["state"], w["rank"]) == ("leaving", None) for w in hosts["127.0.0.3"]["workers"])
        [blocked] = reply["blacklisted"]
        assert (blocked["host"], blocked["slot"], blocked["failures"]) == ("127.0.0.2", 0, 1)
        assert 500 < blocked["seconds_left"] <= 600
        [notice] = reply["notices"]
        assert (notice["host"], notice["source"]) == ("127.0.0.3", "aws-imds")
        assert abs(notice["deadline"] - deadline) < 1.0

        text = status(runtime_dir, job_id).stdout
        assert "round 3, world size 1 (-np 3, --min-np 1, --max-np 3)" in text
        assert "127.0.0.2[0] for " in text and "(1 failure)" in text
        assert "127.0.0.3: aws-imds, deadline in " in text

        # A wrong secret: the driver refuses the request, the command says so in one line, the job goes on.
        secret = runtime_dir / "cloud-elastic" / job_id / "secret"
        right = secret.read_text()
        secret.write_text("0" * len(right))
        refused = status(runtime_dir, job_id)
        secret.write_text(right)
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.count("\n") == 1 and f"job {job_id}" in refused.stderr, refused.stderr

        assert status(runtime_dir, job_id).returncode == 0  # the refusal cost the job nothing
        job.proc.send_signal(signal.SIGTERM)
        assert job.finish() == 143, job.output()

    # The record is gone with the driver; the events file says how the job ended.
    assert status(runtime_dir).stdout == "no cloud-elastic jobs running for this user on this machine\n"
    finished = json.loads(events.read_text().splitlines()[-1])
    assert (finished["event"], finished["outcome"], finished["exit_code"], finished["resets"]) == (
        "job_finished", "interrupted", 143, 2)


def test_status_refuses_another_user_of_the_machine(jobs, tmp_path, runtime_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root to run 'cloud-elastic status' as another user (nobody); CI runs as root")
    job = jobs(["run", "-np", "1", "-H", "127.0.0.1:1", *probe_cmd("--steps", "100000")],
               env={"XDG_RUNTIME_DIR": str(runtime_dir)})
    job.wait_event("commit", rank=0, step=1)
    job_id = job.job_id()
    assert status(runtime_dir, job_id).returncode == 0  # its own user may ask
    secret = (runtime_dir / "cloud-elastic" / job_id / "secret").read_text()

    # Another user can neither list the job nor ask for its status: one line each, exit code 2.
    listed = status_as_nobody(runtime_dir, tmp_path)
    asked = status_as_nobody(runtime_dir, tmp_path, job_id)
    for other in (listed, asked):
        assert other.returncode == 2 and other.stdout == "", other
        assert other.stderr.count("\n") == 1 and secret not in other.stderr, other.stderr
    assert listed.stderr.endswith(f"cannot read {runtime_dir}/cloud-elastic: permission denied\n"), listed.stderr
    assert f"{job_id}/driver.json: permission denied (the job belongs to another user)" in asked.stderr, asked.stderr

    assert status(runtime_dir, job_id).returncode == 0  # the refusals cost the job nothing
    job.proc.send_signal(signal.SIGTERM)
    assert job.finish() == 143, job.output()
