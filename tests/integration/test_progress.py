"""The driver says what it waits for during a long wait, instead of staying silent."""

from __future__ import annotations

import re

import pytest

from tests.integration.harness import probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_waiting_for_np_slots_prints_progress_then_fails_at_the_start_timeout(jobs):
    job = jobs(["run", "-np", "3", "-H", "127.0.0.1:1,127.0.0.2:1", "--start-timeout", "20", *probe_cmd()])
    assert job.finish() == 1, job.output()
    progress = [m for line in job.lines
                if (m := re.search(r"waiting for -np 3 slot\(s\): 2 available \(waiting for (\d+)s\)", line))]
    assert progress, job.output()
    assert int(progress[0].group(1)) >= 15  # the first line comes after one progress interval
    assert job.lines[-1].endswith("only 2 slot(s) available after 20s; -np 3 needed to start")
    assert not any("launched worker" in line for line in job.lines)  # nothing started while it waited
