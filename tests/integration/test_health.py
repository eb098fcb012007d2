"""Slow, sick and unwanted workers, with real processes on loopback hosts (issue 26).

- a worker made slow by the test (an extra sleep per step on 127.0.0.3 only) is drained within
  the straggler window plus a commit, with no step repeated, and the job refills from a fourth host;
- a newcomer whose device self-test fails (the test gives it a timeout nothing can meet) is
  refused with a one-line reason and its slot blacklisted, while the others train on;
- ``cloud-elastic drain JOB HOST`` sends a host away at its next commit, with zero rollback, and
  refuses an unknown host with a one-line error.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.integration.events_check import of, read_events
from tests.integration.harness import REPO, HostsFile, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def test_a_slow_worker_is_drained_without_a_rollback_and_replaced_from_discovery(jobs, tmp_path):
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    events = tmp_path / "events.jsonl"
    # Trains until the test ends it (--stop-when is never created): a fixed number of steps could end
    # before the replacement joined on a loaded machine (a fresh-clone run saw that).
    job = jobs(["run", "-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.3", "--straggler-factor", "1.5", "--straggler-window", "4",
                "--events-file", str(events), "-x", "CE_PROBE_SLOW=127.0.0.3=0.15",
                *probe_cmd("--steps", "10", "--step-sleep", "0.02", "--stop-when", str(tmp_path / "never"))])
    job.wait_event("commit", size=3, step=5)
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"])  # a spare the job can take
    job.wait_for(lambda j: [e for e in j.of("commit") if e["worker"].startswith("127.0.0.4") and e["size"] == 3],
                 timeout=90, what="the spare host's worker training in a round of three")
    # The straggler is out of the rounds once its commit has passed, and a forked spare can train before
    # the straggler's process has finished leaving (releasing its group takes up to 5 s): wait for its exit.
    job.wait_for(lambda j: re.search(r"worker 127\.0\.0\.3\[0\]#\d+ left \(straggler", j.output()), timeout=60,
                 what="the straggler's process to leave")
    job.proc.terminate()  # enough: what follows is checked on what happened so far
    job.finish(60)
    out = job.output()
    recorded = read_events(events)
    stragglers = of(recorded, "straggler")
    assert len(stragglers) == 1 and stragglers[0]["host"] == "127.0.0.3", out
    assert stragglers[0]["compute_s"] >= 1.5 * stragglers[0]["median_s"]
    left = [e for e in of(recorded, "worker_left") if e["host"] == "127.0.0.3"]
    assert left and left[0]["reason"].startswith("straggler:")
    assert not of(recorded, "rollback"), "the straggler's departure rolled the others back"
    # No step was repeated: each survivor's commits only go up.
    for worker in {e["worker"] for e in job.of("commit") if not e["worker"].startswith(("127.0.0.3", "127.0.0.4"))}:
        steps = [e["step"] for e in job.of("commit") if e["worker"] == worker]
        assert steps == sorted(set(steps)), f"{worker} repeated steps: {steps}"
    assert "is a straggler" in out and "slot 127.0.0.3[0] is blacklisted" in out


def test_a_newcomer_whose_device_self_test_fails_is_refused_in_one_line_and_blacklisted(jobs, tmp_path):
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    events = tmp_path / "events.jsonl"
    # Only the worker on 127.0.0.3 gets a self-test timeout nothing can meet (a wedged device).
    # The others train until the test has seen the refusal (a newcomer's start-up can outlast a fixed
    # number of steps on a loaded machine; a fresh-clone run saw the job end before it was refused).
    stop = tmp_path / "stop"
    job = jobs(["run", "-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.3", "--blacklist-cooldown-range", "600", "600",
                "--events-file", str(events), *probe_cmd("--steps", "30", "--step-sleep", "0.05", "--stop-when",
                                                         str(stop))],
               env={"CE_PROBE_ENV": "127.0.0.3=CLOUD_ELASTIC_SELFTEST_TIMEOUT_S=0.000001"})
    job.wait_event("commit", step=5)
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    job.wait_for(lambda j: "self-test" in j.output() and "blacklisted" in j.output(), timeout=90,
                 what="the newcomer refused")
    stop.touch()
    assert job.finish() == 0, job.output()
    out = job.output()
    line = next(line for line in job.lines if "127.0.0.3[0]" in line and "self-test" in line and "blacklisted" in line)
    assert "did not finish within 1e-06s" in line, line
    failed = [e for e in of(read_events(events), "worker_failed") if e["host"] == "127.0.0.3"]
    assert len(failed) == 1 and "self-test" in failed[0]["reason"]
    assert not of(read_events(events), "rollback")  # the running workers never waited for it
    assert not [e for e in job.of("hello") if e["worker"].startswith("127.0.0.3")], out
    done = job.of("done")
    assert len(done) == 2 and {e["size"] for e in done} == {2}


def test_cloud_elastic_drain_sends_a_host_away_at_a_commit_and_refuses_what_it_does_not_know(jobs, tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir()
    stop = tmp_path / "stop"  # the job trains until the drain has happened (not a fixed number of steps)
    job = jobs(["run", "-np", "3", "--min-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                *probe_cmd("--steps", "20", "--step-sleep", "0.05", "--stop-when", str(stop))], env=env)
    job.wait_event("commit", size=3, step=5)

    def drain(target: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "drain", job.job_id(), target], cwd=REPO,
                              env={**__import__("os").environ, **env}, capture_output=True, text=True, timeout=60)

    refused = drain("127.0.0.9")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        f"cloud-elastic: error: job {job.job_id()}: the driver refused to drain 127.0.0.9: no host 127.0.0.9 in this job"]
    done = drain("127.0.0.3")
    assert done.returncode == 0 and "host 127.0.0.3 drains" in done.stdout, done.stderr
    job.wait_for(lambda j: any(e["size"] == 2 for e in j.of("commit")), timeout=60, what="training on without it")
    stop.touch()
    assert job.finish() == 0, job.output()
    out = job.output()
    assert "notice from operator for host 127.0.0.3" in out
    assert "aborted" not in out and not [e for e in job.of("reset") if e["executed"] != e["step"]]
    done_events = job.of("done")
    assert len(done_events) == 2 and {e["size"] for e in done_events} == {2}


def test_a_worker_whose_interpreter_is_stuck_prints_its_stacks_before_it_is_given_up(jobs, tmp_path):
    # Its training thread never lets go of the interpreter: no heartbeat goes out, so no stacks can be
    # asked for over the control plane; the driver asks by signal, and faulthandler answers from C.
    job, recorded = _stuck_at_step_5(jobs, tmp_path, steps=30)
    # The same stacks, gathered from its output, are in the events file.
    assert [e["host"] for e in recorded] == ["127.0.0.3"], job.output()
    assert "in one_step" in recorded[0]["text"] and "Thread 0x" in recorded[0]["text"], recorded
    lines = job.lines
    assert any("asked worker 127.0.0.3[0]" in line and "stacks" in line for line in lines), job.output()
    # The driver gives the worker up (logged), signals it, then logs that it asked; the stacks the signal makes the
    # worker print come through its output pipe, so they may reach the job's output before or after that last line.
    given_up = next(i for i, line in enumerate(lines)
                    if "127.0.0.3[0]" in line and "stopped answering heartbeats" in line)
    stacks = [line for line in lines[given_up:] if "<127.0.0.3[0]>" in line]
    assert any("Current thread" in line or "Thread 0x" in line for line in stacks), job.output()
    assert any("in one_step" in line for line in stacks), job.output()
    done = job.of("done")
    assert {e["worker"].split("[")[0] for e in done} == {"127.0.0.1", "127.0.0.2"} and {e["step"] for e in done} == {30}


def test_the_stacks_asked_by_signal_reach_the_events_file_of_a_job_that_ends_at_once(jobs, tmp_path):
    # A clean-clone run: the stuck worker's stacks were printed, but the job ended (its survivors one step from the
    # end) within the second the driver gives the stacks before its KILL, and it exited without their event.
    job, recorded = _stuck_at_step_5(jobs, tmp_path, steps=6)
    assert [e["host"] for e in recorded] == ["127.0.0.3"] and "in one_step" in recorded[0]["text"], job.output()


def _stuck_at_step_5(jobs, tmp_path, steps: int):
    """A job of three whose worker on 127.0.0.3 holds the GIL from step 5 (given up after 5 s of silence, asked for
    its stacks by signal), the others training to ``steps``; it has ended well. Returns it and the stacks events
    the driver recorded from the signal."""
    events = tmp_path / "stuck.jsonl"
    job = jobs(["run", "-np", "3", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                "--heartbeat-timeout", "5", "--blacklist-cooldown-range", "600", "600", "--events-file", str(events),
                *probe_cmd("--steps", str(steps), "--hold-gil-at-step", "5", "--only-slot", "127.0.0.3")])
    assert job.finish() == 0, job.output()
    return job, [e for e in of(read_events(events), "stacks") if e.get("via") == "signal"]
