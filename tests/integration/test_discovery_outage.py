"""Discovery failing mid-job for longer than ``--elastic-timeout``: a real job on loopback, a real discovery script.

Review s64 rvK: a job whose round trained healthily was ended once discovery had failed for ``--elastic-timeout``
(an AWS API throttled for 10 minutes, a permission taken away, a Kubernetes control-plane upgrade), and without
``--checkpoint-dir`` all its training was lost. Discovery is the job's word on which hosts exist, not on whether
its workers live: the job keeps its hosts and trains on. Only a job below ``--min-np`` (with no discovery to bring
a host) ends after the timeout, in one line, its newest commit checkpointed first.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from cloud_elastic.checkpoint import CheckpointStore
from tests.integration.harness import HostsFile, probe_cmd, worker_on

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ADOPT_PROBE = Path(__file__).with_name("adopt_probe.py")
#: Short, so that the outage outlasts it several times within seconds.
ELASTIC_TIMEOUT_S = 2.0


def _break(hosts: HostsFile, body: str) -> None:
    """From the next call on, the discovery script does ``body`` instead of listing the hosts."""
    tmp = hosts.script.with_suffix(".tmp")
    tmp.write_text("#!/bin/sh\n" + body)
    tmp.chmod(0o755)
    tmp.replace(hosts.script)


def _run(jobs, tmp_path, *args: str, probe: tuple[str, ...]):
    hosts = HostsFile(tmp_path, ["127.0.0.1:1", "127.0.0.2:1"])
    job = jobs(["run", "-np", "2", "--host-discovery-script", str(hosts.script), "--discovery-interval", "0.2",
                "--elastic-timeout", str(ELASTIC_TIMEOUT_S), *args, *probe_cmd(*probe)])
    job.wait_event("commit", step=3)  # the round trains
    return hosts, job


def _fails_for(job, seconds: float, what: str) -> None:
    """Discovery has failed (its first WARNING is out) for ``seconds`` of wall time."""
    job.wait_for(lambda j: any("host discovery failed" in line and what in line for line in j.lines),
                 what=f"discovery failing with {what!r}")
    time.sleep(seconds)  # the outage itself: what is tested is that this much time passes without an end


def test_a_job_whose_discovery_fails_mid_job_past_the_elastic_timeout_trains_to_the_end(jobs, tmp_path):
    stop = tmp_path / "stop"
    hosts, job = _run(jobs, tmp_path, probe=("--steps", "10", "--step-sleep", "0.05", "--stop-when", str(stop)))
    _break(hosts, "echo 'AccessDenied: not authorized to describe the group' >&2\nexit 1\n")
    _fails_for(job, 3 * ELASTIC_TIMEOUT_S, "exited with code 1")
    _break(hosts, "echo '@@garbage@@'\n")  # another error: said once, with the count of calls failed so far
    job.wait_for(lambda j: any("line 1 is not host[:slots]" in line and "calls in a row" in line for line in j.lines),
                 what="the second error")
    assert job.proc.poll() is None, job.output()
    stop.touch()
    assert job.finish() == 0, job.output()
    out = job.output()
    assert "kept failing" not in out and "elastic timeout" not in out, out
    first = next(line for line in job.lines if "host discovery failed" in line)
    assert "the job trains on with its current 2 host(s) and 2 worker(s)" in first, first
    assert "cannot see new hosts, reclaims announced only through discovery, or a scale-in" in first, first
    assert len([line for line in job.lines if "host discovery failed" in line]) == 2, out  # not one a call
    assert {e["step"] for e in job.of("done")} == {max(e["step"] for e in job.of("commit"))}
    assert len(job.of("done")) == 2 and not job.of("reset"), out  # one round throughout: no rollback, no re-form
    assert "training completed" in job.lines[-1], job.lines[-1]


def test_below_min_np_while_discovery_fails_the_job_checkpoints_and_ends_in_one_line_after_the_timeout(jobs, tmp_path):
    ckpt = tmp_path / "ckpt"
    # The killed worker's slot cools down for 60 s: no round of --min-np 2 can form within the timeout.
    hosts, job = _run(jobs, tmp_path, "--checkpoint-dir", str(ckpt), "--blacklist-cooldown-range", "60", "60",
                      probe=("--steps", "100000", "--step-sleep", "0.05"))
    _break(hosts, "echo RequestLimitExceeded >&2\nexit 1\n")
    _fails_for(job, ELASTIC_TIMEOUT_S + 1, "exited with code 1")
    assert job.proc.poll() is None, job.output()
    os.kill(worker_on(job.job_id(), "127.0.0.2"), signal.SIGKILL)
    assert job.finish() == 1, job.output()
    last = job.lines[-1]
    assert f"fewer than --min-np 2 worker(s) for {ELASTIC_TIMEOUT_S:g}s (elastic timeout); last failure: " in last, last
    assert "; host discovery has failed for " in last and "exited with code 1" in last, last
    assert "written; the same command resumes from it" in last, last
    assert "kept failing" not in job.output()
    step = CheckpointStore(str(ckpt)).list()[0].step
    assert step >= 3 and f"checkpoint of step {step} written" in last, last


def test_a_restarted_driver_whose_discovery_never_answers_adopts_the_workers_and_trains_to_the_end(jobs, tmp_path):
    """fixK left alone: a driver restarted (``--checkpoint-dir`` adoption) during an outage ended the job after
    ``--elastic-timeout``, and meanwhile sent its adopted workers away ("host ... left the group"), although its
    predecessor's discovery had answered and they were training. It now goes on with the hosts of the workers it
    adopted, and the outage rule holds for it: the job trains to its end in the same round, nothing relaunched."""
    (tmp_path / "run").mkdir()
    events = tmp_path / "events"
    events.mkdir()
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    hosts = HostsFile(tmp_path, ["127.0.0.1:1", "127.0.0.2:1"])
    stop = tmp_path / "stop"  # trains until the test has seen the adoption and the outage outlast the timeout
    args = ["run", "-np", "2", "--host-discovery-script", str(hosts.script), "--discovery-interval", "0.2",
            "--elastic-timeout", str(ELASTIC_TIMEOUT_S), "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--driver-grace", "40", sys.executable, str(ADOPT_PROBE), str(events), "--steps", "10",
            "--step-sleep", "0.05", "--stop-when", str(stop)]
    first = jobs(args, env=env)
    first.wait_for(lambda j: any(e["step"] >= 5 for e in j.of("commit")), timeout=60, what="training")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    _break(hosts, "echo 'AccessDenied: not authorized to describe the group' >&2\nexit 1\n")
    second = jobs(args, env=env)
    second.wait_for(lambda j: any("host discovery has not answered this driver" in line for line in j.lines),
                    timeout=60, what="the adoption with discovery failing")
    time.sleep(2 * ELASTIC_TIMEOUT_S)  # the outage itself: what is tested is that this much time passes without an end
    assert second.proc.poll() is None, second.output()
    stop.touch()
    assert second.finish(60) == 0, second.output()
    out = second.output()
    assert "adopted 2 running worker(s) of round 1" in out, out
    assert "host discovery has not answered this driver (discovery script " in out and "AccessDenied" in out, out
    assert "kept failing" not in out and "left the group" not in out and "launched worker" not in out, out
    assert "training completed on 2 worker(s) after 0 reset(s)" in second.lines[-1], second.lines[-1]
    done = [json.loads(line) for path in events.glob("*.jsonl") for line in path.read_text().splitlines()
            if '"kind": "done"' in line]
    commits = {path.stem: [json.loads(line)["step"] for line in path.read_text().splitlines() if '"kind": "commit"' in line]
               for path in events.glob("*.jsonl")}
    assert len(commits) == 2 and all(steps == sorted(set(steps)) for steps in commits.values()), commits  # none redone
    assert len(done) == 2 and {e["step"] for e in done} == {max(max(steps) for steps in commits.values())}, done
