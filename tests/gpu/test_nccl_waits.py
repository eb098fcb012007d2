"""One GPU: the facts of torch's NCCL group that the heartbeat thread's abort and the waits on the device rely on.

``worker/rounds/on_device.py`` was built without a GPU (2026-12-02) from torch's documented behaviour; what
two GPUs would show end to end is in ``test_multi_gpu.py``. This checks the premises where one GPU can:
a collective's future completes as it is queued and ``wait()`` does not hold the host, the host's waits for
the device (every stream, NCCL's included) let other threads run (the heartbeat), and ``abort()`` from another
thread returns while the training thread waits for the device. Whether torch reports the group's error
(``get_error``), whether the abort returned before the device did, and what a collective launched after the
abort does (the worker never launches one: ``group()`` refuses first) are printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.support import env
from tests.integration.harness import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(150)]


def test_nccl_waits_return_as_queued_the_hosts_wait_lets_the_heartbeat_run_and_abort_comes_from_another_thread(
        gpu_report):
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("nccl_waits_probe.py"))],
                          cwd=REPO, env={**os.environ, **env()}, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [found] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    gpu_report(f"NCCL waits: {json.dumps(found)}")
    # Behind two seconds of device time: queued, not finished, and wait() did not hold the host.
    assert found["future_done_at_once"] and found["wait_s"] < 0.5 and not found["completed_after_wait"], found
    # The host's waits for the device take that time and let the heartbeat thread run (a beat every 10 ms).
    for wait in ("device_synchronize", "item", "stream_synchronize"):
        assert found[f"{wait}_s"] > 1.0 and found[f"beats_during_{wait}"] >= 50, (wait, found)
    assert found["completed_after_device_synchronize"], found  # every stream: NCCL's included
    assert found["abort_returned"] and found["abort_error"] is None, found  # what a collective does after: printed
    assert not found["error_before"], found
