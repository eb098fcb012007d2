"""A resumed job's stall warning named the first random job id, not the one the driver took from its checkpoint
(checkpoint review s56, s3_stall_jobid.sh): the silence watch kept the id it was built with."""

from __future__ import annotations

import logging
import random

import pytest

from cloud_elastic.driver.job.elastic_job import ElasticJob, Policy
from cloud_elastic.driver.job.hosts import Blacklist, HostManager
from cloud_elastic.protocol import FlightEntry
from tests.unit.test_silence_rule import Sim as SilenceSim, members, steady, waiting_since

pytestmark = pytest.mark.timeout(10)


def test_a_resumed_jobs_stall_warning_names_its_current_id(caplog) -> None:
    caplog.set_level(logging.WARNING)
    job = ElasticJob(Policy(3, 3, 3), HostManager(Blacklist((10.0, 300.0), random.Random(0))), job_id="first")
    job.job_id = "resumed"  # the driver took the checkpoint's id (Driver._set_job_id)
    sim = SilenceSim(members())
    sim.watch = job.silence
    beats = steady("w1", 0.0, 40.0, FlightEntry(1, 6, "broadcast parameters", "completed", 0.0))
    for wid in ("w0", "w2"):
        beats += steady(wid, 0.0, 3.0, None) + steady(wid, 3.0, 40.0, waiting_since(3.0, seq=7))
    sim.run(beats, until=23.0)
    stalls = [r.getMessage() for r in caplog.records if "still heartbeating" in r.getMessage()]
    assert stalls and all(m.startswith("job resumed: ") for m in stalls)
