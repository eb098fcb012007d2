"""Hostile or broken checkpoint storage seen by real processes: a driver restarted over a ``driver-alive.json``
with numbers it cannot wait on, and a checkpoint written to a full disk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, write_job_record
from tests.integration.harness import REPO, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.mark.parametrize("grace", ["1e12", "Infinity", "NaN"])
def test_a_restarted_driver_refuses_a_sign_of_life_it_cannot_wait_on_in_one_line_and_runs_the_job(
        jobs, tmp_path, grace):
    """Before: 1e12 and Infinity crashed the driver with OverflowError in its wait; NaN disabled the wait."""
    ckpt = tmp_path / "ckpt"
    write_job_record(CheckpointStore(str(ckpt)), DurableJobRecord("hostile1", ("python", "train.py"), time.time()))
    (ckpt / "driver-alive.json").write_text(
        '{"format": "cloud-elastic-checkpoint", "job_id": "hostile1", "host": "other-vm", "pid": 4242, '
        f'"stopped": false, "alive": {time.time()}, "grace_s": {grace}}}')
    (tmp_path / "run").mkdir()
    job = jobs(["run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", str(ckpt), "--driver-grace", "1",
                *probe_cmd("--steps", "3")], env={"XDG_RUNTIME_DIR": str(tmp_path / "run")})
    assert job.finish(90) == 0, job.output()
    out = job.output()
    refused = [line for line in job.lines if "driver-alive.json is unreadable: grace_s" in line]
    assert len(refused) == 1 and "is not a number of seconds in [0, 604800]" in refused[0], out
    assert "Traceback" not in out and "OverflowError" not in out, out


_FULL_DISK_SAVE = """
import sys, torch
from cloud_elastic.checkpoint import CheckpointError, CheckpointStore
store = CheckpointStore(sys.argv[1])
try:
    store.save(1, {"w": torch.zeros(200_000)})  # 800 kB into a 256 kB file system
except CheckpointError as exc:
    print("REFUSED", exc)
"""


_FULL_DISK_SHARDED_SAVE = """
import sys
sys.path.insert(0, ".")
from tests.unit.test_sharded_checkpoint import _ctx, _job_store, _state, _train
from cloud_elastic.worker.durable.sharded import ShardedCheckpoints
from cloud_elastic.worker.durable.rank_zero import DurableSettings
state = _state()
_train(state, 1)
print("REFUSED", ShardedCheckpoints(DurableSettings(_job_store(sys.argv[1]), background=False), _ctx()).finish(state))
"""


def _unavailable(reason: str) -> None:
    """Skip where the machine cannot mount a small file system; under CI (which runs as root, where it can)
    that is a failure, so the full-disk tests never silently stop running there."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI requires it)", pytrace=False)
    pytest.skip(reason)


def _on_a_full_disk(tmp_path, size: str, code: str) -> str:
    """Run ``code`` with a checkpoint folder on a real full file system: a small tmpfs mounted in a private mount
    namespace (unshare: no root needed where user namespaces are allowed); its REFUSED line."""
    if shutil.which("unshare") is None:
        _unavailable("no unshare(1) to mount a small file system")
    mount = tmp_path / "small"
    mount.mkdir()
    script = f"mount -t tmpfs -o size={size} tmpfs {mount} || exit 77; exec {sys.executable} -c '{code}' {mount}/ckpt"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=90)
    if done.returncode == 77 or "unshare:" in done.stderr:
        _unavailable(f"cannot mount a small file system here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    return line


def test_a_checkpoint_written_to_a_full_disk_says_no_space_left_on_device(tmp_path):
    """Before: torch's ``unexpected pos 704 vs 598``."""
    line = _on_a_full_disk(tmp_path, "256k", _FULL_DISK_SAVE)
    assert "no space left on device" in line and "unexpected pos" not in line, line
    assert f"{tmp_path}/small/ckpt/ckpt-" in line  # the checkpoint it could not write


def test_a_sharded_checkpoint_written_to_a_full_disk_says_no_space_left_on_device(tmp_path):
    line = _on_a_full_disk(tmp_path, "24k", _FULL_DISK_SHARDED_SAVE)
    assert line.startswith("REFUSED the final checkpoint (step 1) was not written: torch DCP could not write the "
                           "shards: no space left on device"), line


def test_a_resume_falls_back_past_a_checkpoint_whose_key_nests_too_deep_and_trains_on(jobs, tmp_path):
    """Review s63 rvX F2: the newest checkpoint forged to hold, in place of one attribute, a tuple key nested 250
    deep under dicts nested 250 deep. Before: chosen by the store, then RecursionError in every worker's load, three
    times, and the job failed with the intact checkpoint before it never tried."""
    from tests.unit.test_checkpoint_forged_bounds import deep_key_under_deep_dicts, forge

    ckpt = tmp_path / "ckpt"
    (tmp_path / "run").mkdir()

    def run(steps: int):
        return jobs(["run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", str(ckpt), "--checkpoint-keep", "3",
                     *probe_cmd("--steps", str(steps), "--step-sleep", "0.02")],
                    env={"XDG_RUNTIME_DIR": str(tmp_path / "run")})

    first = run(4)
    assert first.finish(90) == 0, first.output()
    store = CheckpointStore(str(ckpt), keep=3)
    intact = store.latest()
    assert intact.info.step == 4
    forged = forge(store, 5, {**intact.payload, "resets": deep_key_under_deep_dicts(250)})

    second = run(6)
    assert second.finish(90) == 0, second.output()
    out = second.output()
    unusable = [line for line in second.lines if forged in line and "is unusable" in line]
    assert len(unusable) == 1 and "nests containers more than 256 deep" in unusable[0], out
    assert len([line for line in second.lines if "resumed from the checkpoint of step 4 (" in line]) == 1, out
    assert [e["step"] for e in second.of("done")] == [6], out
    assert "RecursionError" not in out and "Traceback" not in out, out
