"""A silent worker is found by its peers waiting on it, and named; a busy one is not given up.

Three loopback hosts, one worker each, ``tests/integration/busy_probe.py``, at the default
heartbeat settings (the fast rule of ``driver/job/liveness.py`` applies).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.integration.events_check import of, only, read_events

HOSTS = "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1"
BUSY = [sys.executable, str(Path(__file__).with_name("busy_probe.py"))]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _run(jobs, events: Path, *probe_args: str):
    return jobs(["run", "-np", "3", "--min-np", "2", "--max-np", "3", "-H", HOSTS, "--blacklist-cooldown-range",
                 "300", "300", "--events-file", str(events), *BUSY, *probe_args])


def test_a_worker_stopped_during_a_collective_is_named_before_its_round_is_aborted(jobs, tmp_path):
    """SIGSTOP while its peers train: they wait for it in the next gradient allreduce, and the driver's log
    and events file name its rank, worker, host and the collective's number before the round is aborted."""
    path = tmp_path / "events.jsonl"
    # Training until the test has seen steps at two: 6 s before the stop, at most a heartbeat timeout (5 s) until it
    # is given up, then steps at two (it trained 20 s, of which the last 8-10 s at two had nothing left to show).
    stop = tmp_path / "stop"
    job = _run(jobs, path, "--stop-when", str(stop), "--step-sleep", "0.02")
    first = job.wait_event("step", rank=1, step=1, timeout=120)
    # Trained 6 s: the driver has heard enough of its heartbeats to judge its silence by the fast rule.
    victim = job.wait_for(lambda j: next((e for e in j.of("step", rank=1) if e["t"] > first["t"] + 6), None),
                          60, "six seconds of training")
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        job.wait_event("step", rank=0, size=2, timeout=120)
        stop.touch()
        assert job.finish(timeout=120) == 0, job.output()
    finally:
        try:
            os.kill(victim["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    out = job.output()
    lines = out.splitlines()
    named = next(i for i, line in enumerate(lines) if "stalled: rank(s)" in line)
    aborted = next(i for i, line in enumerate(lines) if " aborted; " in line)
    assert named < aborted, out
    assert f"rank 1 (worker {victim['worker']} on host 127.0.0.2" in lines[named], lines[named]
    assert "(gradient allreduce) of round 1" in lines[named] or "of round 1 stalled" in lines[named], lines[named]
    events = read_events(path)
    stalled = only(events, "collective_stalled")
    assert stalled["verdict"] == "silent rank(s) given up" and stalled["round"] == 1 and stalled["seq"] > 6
    assert [(m["rank"], m["worker"], m["host"]) for m in stalled["missing"]] == [(1, victim["worker"], "127.0.0.2")]
    assert sorted(stalled["waiting"]) == [0, 2] and stalled["waited_s"] > 0
    failed = only(events, "worker_failed")
    assert failed["worker"] == victim["worker"] and "while rank(s) 0, 2 waited" in failed["reason"], failed
    kinds = [e["event"] for e in events]
    assert kinds.index("collective_stalled") < kinds.index("worker_failed") < kinds.index("rollback"), kinds
    assert {e["size"] for e in job.of("done")} == {2}


def test_a_worker_whose_first_step_takes_10_s_is_not_given_up(jobs, tmp_path):
    """Its first step is 10 s of compile-like work (Python, torch kernels, full garbage collections over
    300,000 objects), twice the heartbeat timeout, while its peers wait for it in the first gradient allreduce:
    it heartbeats all along, so it is named as the one they wait for, still heartbeating, and nobody is given up."""
    path = tmp_path / "events.jsonl"
    job = _run(jobs, path, "--steps", "30", "--only-slot", "127.0.0.2", "--first-step-s", "10",
               "--heap", "300000")
    assert job.finish(timeout=200) == 0, job.output()
    events = read_events(path)
    assert not of(events, "worker_failed") and not of(events, "rollback"), job.output()
    assert len(of(events, "round_formed")) == 1
    stalled = only(events, "collective_stalled")
    assert stalled["verdict"] == "still heartbeating" and stalled["op"] == "gradient allreduce", stalled
    assert [(m["rank"], m["host"]) for m in stalled["missing"]] == [(1, "127.0.0.2")]
    done = job.of("done")
    assert sorted(e["rank"] for e in done) == [0, 1, 2] and {e["step"] for e in done} == {30}
