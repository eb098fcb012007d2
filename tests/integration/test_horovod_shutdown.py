"""``hvd.shutdown()`` across two real workers: it un-initializes as Horovod's does, and a worker that works on
after it past the heartbeat timeout is not given up as silent (its heartbeats stopped there, and the job
failed with "stopped answering heartbeats"). ``allgather_object`` and ``grouped_allgather`` ride along.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.integration.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ENV = {"PYTHONPATH": str(REPO)}  # the workers import this checkout's cloud_elastic (see test_horovod_api.py)


def test_a_worker_that_works_on_after_shutdown_keeps_the_job_alive_and_collectives_refuse(jobs):
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--heartbeat-timeout", "1", sys.executable,
                "tests/integration/shutdown_check.py", "4"], env=ENV)
    assert job.finish(timeout=45) == 0, job.output()
    assert "every one exiting 0" in job.lines[-1], job.output()
    assert "stopped answering heartbeats" not in job.output(), job.output()
    rows = [json.loads(line.split("CHECK ", 1)[1]) for line in job.lines if "CHECK " in line]
    checks = sorted((r for r in rows if "worked_on" not in r), key=lambda r: r["rank"])
    assert [r["rank"] for r in checks] == [0, 1], job.output()
    for row in checks:
        assert row["allgather_object"] is True and row["grouped_allgather"] is True, row
        assert row["is_initialized_after_shutdown"] is False, row
        assert row["allreduce_after_shutdown"] == ("cloud_elastic.torch was shut down (hvd.shutdown()); call "
                                                   "hvd.init() to use it again"), row
    assert sorted(r["rank"] for r in rows if r.get("worked_on")) == [0, 1], job.output()
