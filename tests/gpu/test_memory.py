"""GPU memory stays flat across resets: in a survivor whose peer keeps dying, and in NCCL groups formed and aborted.

Memory left behind at each reset (a kept commit's buffers, a clone made by a
restore, a communicator never freed) adds up over a long spot job until the
GPU is full. Each test measures after every reset and prints the series in the
run's summary; growth past the first two resets beyond a small slack fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.support import env, probe
from tests.integration.harness import REPO

pytestmark = pytest.mark.gpu

MIB = 1 << 20
#: Live tensors may differ by this much from reset to reset (the model's parameters are 4 MiB, its kept
#: commit 12 MiB): a buffer of the state's size left behind at every reset exceeds it within a few resets.
ALLOCATED_SLACK = 16 * MIB
#: The caching allocator's pool (blocks of 2 and 20 MiB) may take a little more as allocations vary.
RESERVED_SLACK = 64 * MIB
#: NCCL's own device allocations are outside torch's allocator: measured as the device's used memory.
DEVICE_SLACK = 64 * MIB


def _series(values: list[int]) -> str:
    return " ".join(f"{v / MIB:.1f}" for v in values)


@pytest.mark.timeout(180)
def test_a_survivors_gpu_memory_stays_flat_while_its_peer_is_killed_and_replaced_ten_times(jobs, gpu_report):
    # 127.0.0.2's worker kills itself after 4 steps of its own, every time it is started (0 1: a failed slot
    # is retried at once; 0 0 would end a slot at the first failure of its worker's own doing):
    # each cycle is two resets of the survivor, a failure (it restores its kept commit) and an admission.
    # Ten resets (five cycles, each a worker start: about 16 s on an H100 host): the GPU suite's five minutes.
    resets = 10
    job = jobs(["run", "-np", "2", "--min-np", "1", "--max-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1",
                "--blacklist-cooldown-range", "0", "1", "--elastic-timeout", "60", "-x", "CLOUD_ELASTIC_BACKEND=gloo",
                *probe("--steps", "10", "--min-resets", str(resets), "--tail-steps", "2", "--width", "1024",
                       "--log-every", "1", "--memory", "--churn", "127.0.0.2/0", "--die-after", "4")],
               env=env())
    assert job.finish(170) == 0, job.output()
    survivor = [e for e in job.of("memory") if e["slot"] == "127.0.0.1/0"]
    assert len({e["pid"] for e in survivor}) == 1
    assert [e["resets"] for e in survivor] == list(range(resets + 1)), survivor
    restores = [e for e in job.of("resumed") if e["slot"] == "127.0.0.1/0" and e["size"] == 1]
    assert len(restores) >= resets // 2 - 1, "the peer did not die often enough"
    allocated = [e["allocated"] for e in survivor]
    reserved = [e["reserved"] for e in survivor]
    device = [e["device_used"] for e in survivor]
    gpu_report(f"survivor over {resets} resets, MiB allocated: {_series(allocated)}")
    gpu_report(f"  reserved: {_series(reserved)}")
    gpu_report(f"  device used (all processes on the GPU, the peer's included): {_series(device)}")
    # From the second reset on (the kept commit's buffers and the first restore's pool are in place by then).
    assert max(allocated[2:]) - allocated[2] <= ALLOCATED_SLACK, _series(allocated)
    assert max(reserved[2:]) - reserved[2] <= RESERVED_SLACK, _series(reserved)


@pytest.mark.timeout(120)
def test_nccl_groups_formed_used_and_aborted_round_after_round_leave_device_memory_flat(gpu_report):
    cycles = 12
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("nccl_cycles.py")), "--cycles", str(cycles)],
                          cwd=REPO, env={**os.environ, **env()}, capture_output=True, text=True,
                          timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    rounds = [r for r in lines if r.get("cycle")]
    [final] = [r for r in lines if r.get("final")]
    assert len(rounds) == cycles, proc.stdout + proc.stderr
    assert all(r["ok"] for r in rounds), "a collective gave a wrong result"
    assert all(r["quiet"] for r in rounds), "the GPU did not become idle after an abort"
    assert (final["reclaimed"], final["leaked"]) == (cycles, 0), final
    used = [r["device_used"] for r in rounds] + [final["device_used"]]
    seconds = [r["seconds"] for r in rounds]
    gpu_report(f"{cycles} NCCL groups formed, used and aborted: {sum(seconds):.1f} s in all "
               f"({max(seconds):.2f} s the slowest); device MiB used after each: {_series(used)}")
    assert max(used[2:]) - used[2] <= DEVICE_SLACK, _series(used)
    assert final["allocated"] <= rounds[0]["allocated"], (final, rounds[0])
