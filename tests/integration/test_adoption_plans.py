"""A restarted driver numbers its plans from 1, as its predecessor did: plans must not be confused across drivers.

The first driver admits a third host through its plan 1, so its workers train in a round formed from plan 1;
it is SIGKILLed there. The restarted driver adopts the three workers, and a fourth host appears: the new driver
admits it through *its* plan 1. Before the fix the adopted workers took the new driver's silence about their
round's plan for a plan given up (they aborted their own, adopted round at once, with no line saying why), and
ignored the new plan 1 as the one they were in already (the newcomer could not form its group): the job
recovered only by luck and rounds, and in a chaos run it aborted every round for over a minute.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.integration.harness import EventFiles, HostsFile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

ADOPT_PROBE = Path(__file__).with_name("adopt_probe.py")
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]


def test_a_driver_restarted_in_a_planned_round_goes_on_in_it_and_admits_a_newcomer_through_its_own_plan(
        jobs, tmp_path):
    (tmp_path / "run").mkdir()
    events_dir = tmp_path / "events"
    events_dir.mkdir()
    stop = tmp_path / "stop"
    hosts = HostsFile(tmp_path, HOSTS[:2])
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    args = ["run", "-np", "2", "--min-np", "1", "--max-np", "4", "--host-discovery-script", str(hosts.script),
            "--discovery-interval", "0.2", "--blacklist-cooldown-range", "600", "600",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "1", "--driver-grace", "40",
            sys.executable, str(ADOPT_PROBE), str(events_dir), "--steps", "20", "--step-sleep", "0.1",
            "--stop-when", str(stop)]
    events = EventFiles(events_dir)

    first = jobs(args, env=env)
    events.wait_for(lambda e: e.of("commit", step=5), 90, "training", driver=first)
    hosts.set(HOSTS[:3])
    first.wait_for(lambda j: "round 2 formed with 3 worker(s) (sync=True, planned" in j.output(), 60,
                   "the third host admitted through plan 1")
    # Every member trains in the planned round (the newcomer too), then the driver dies there.
    events.wait_for(lambda e: len({ev["worker"] for ev in e.of("commit", size=3)}) == 3, 60,
                    "commits of the planned round", driver=first)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()

    second = jobs(args, env=env)
    second.wait_for(lambda j: "adopted 3 running worker(s) of round 2" in j.output(), 60, "the adoption")
    # The adopted round trains on under the new driver, whose heartbeat replies name no plan for it (2 s: four
    # replies, each held 0.5 s, before any plan of the new driver).
    adopted = time.time()
    events.wait_for(lambda e: all(e.of("commit", worker=w) and e.of("commit", worker=w)[-1]["t"] > adopted + 2
                                  for w in {ev["worker"] for ev in e.of("commit", size=3)}), 60,
                    "the adopted round training under the new driver", driver=second)
    hosts.set(HOSTS)
    # The newcomer trains: a round of 4 formed, and it committed in it.
    events.wait_for(lambda e: any(ev["worker"].startswith(HOSTS[3]) for ev in e.of("commit", size=4)), 60,
                    "the fourth host training after the restart", driver=second)
    stop.touch()
    assert second.finish(60) == 0, second.output()
    out = second.output()
    # The adopted round went on until the newcomer's planned round replaced it: nothing was aborted, no step
    # rolled back, and the new driver's plan 1 was formed by all four, not dropped.
    assert not re.search(r"round \d+ aborted", out), out[-6000:]
    assert "dropped" not in out, out[-6000:]
    assert "round 3 formed with 4 worker(s) (sync=True, planned" in out, out[-6000:]
    old = [ev for ev in events.of("commit") if not ev["worker"].startswith(HOSTS[3])]
    for worker in {ev["worker"] for ev in old}:
        steps = [ev["step"] for ev in old if ev["worker"] == worker]
        assert steps == sorted(set(steps)), f"{worker} repeated a committed step: {steps}"
