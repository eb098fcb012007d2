"""Horovod's API beyond allreduce and broadcast, across three real workers on two loopback hosts.

Each worker computes what every call must return from inputs it can
regenerate for every rank (by hand, or with torch's own BatchNorm over the
batches of all ranks together) and prints the comparison; this asserts on it.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.integration.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: Workers run scripts from tests/integration, where `import cloud_elastic` would find whatever checkout the
#: virtualenv's editable install points at: this checkout's, put first.
ENV = {"PYTHONPATH": str(REPO)}


def test_horovod_collectives_ops_compression_and_sync_batch_norm_across_workers(jobs):
    job = jobs(["run", "-np", "3", "-H", "127.0.0.1:2,127.0.0.2:1", sys.executable,
                "tests/integration/horovod_api_check.py"], env=ENV)
    # Like collectives_check.py, the script does not use elastic.run: a fixed-size job, which succeeds
    # when every worker exits 0.
    assert job.finish() == 0, job.output()
    rows = [json.loads(line.split("CHECK ", 1)[1]) for line in job.lines if "CHECK " in line]
    assert sorted(r["rank"] for r in rows) == [0, 1, 2], job.output()
    for row in rows:
        failed = {name: value for name, value in row.items() if value is not True and name not in ("rank", "size",
                                                                                                     "reducescatter_rows")}
        assert not failed, (row["rank"], failed)
        assert row["reducescatter_rows"] == [3, 2, 2]  # 7 rows over 3 workers, as Horovod splits them
