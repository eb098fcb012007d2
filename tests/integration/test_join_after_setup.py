"""A worker that joins a running job joins at its first call that needs the round, after its set-up.

Horovod scripts build their model and data after ``hvd.init()``. A spare (or a
replacement) that joined inside ``init()`` was counted ready before that set-up,
and the recovery round that took it waited for all of it; here the worker
registers and checks its device in ``init()``, sets up while the job trains on,
and joins (as a spare: becomes ready) when it first asks for its rank.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.integration.events_check import of, read_events
from tests.integration.harness import HostsFile, probe_cmd
from tests.integration.test_spares import committed, spares_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def test_a_spare_is_ready_only_after_its_set_up_and_a_failure_does_not_wait_for_it(jobs, tmp_path):
    path, stop = tmp_path / "events.jsonl", tmp_path / "stop"
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    job = jobs(["run", "-np", "2", "--min-np", "1", "--spares", "1", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", "--blacklist-cooldown-range", "300", "300", "--events-file", str(path),
                "-x", "CE_PROBE_SETUP=127.0.0.3=3", *probe_cmd("--steps", "20", "--stop-when", str(stop))])
    committed(job, rank=0, step=2)
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3"])  # the spare's host, once the job trains
    [spare] = spares_ready(job)
    victim = committed(job, rank=1, step=3)
    os.kill(victim["pid"], signal.SIGKILL)
    job.wait_event("reset", size=2, rank=0)
    stop.touch()
    assert job.finish(timeout=90) == 0, job.output()
    # It set up (3 s) while the job trained, and was counted ready, and taken, only after.
    set_up = job.wait_event("set up", worker=spare, timeout=5)
    ready = next(e for e in of(read_events(path), "spares") if e["ready"] == 1)
    assert set_up["t"] < ready["ts"], (set_up, ready)
    setting_up, = job.of("setting up")
    assert setting_up["local_rank"] == 0  # its GPU, known before it joined
    hello, = [e for e in job.of("hello") if e["worker"] == spare]
    assert (hello["rank"], hello["size"]) == (1, 2)  # joined the recovery round in the victim's place
