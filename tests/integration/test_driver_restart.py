"""Driver restart: the same ``cloud-elastic run`` command resumes its job from the checkpoint directory.

The driver is SIGKILLed mid-training. Its workers train on for ``--driver-grace``
(rank 0 checkpointing at every commit it can), then stop: no process is left.
The same command, run again, waits for them, keeps the job's id and resumes
from the latest checkpoint, so the steps the workers made without their driver
are not lost either. It waits for them even when this machine's record of the
dead driver is gone (a driver restarted on another machine): the dead driver's
last sign of life beside the checkpoints is enough.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import pytest

from cloud_elastic.checkpoint import CheckpointStore, read_job_record
from tests.integration.harness import probe_cmd, process_alive as _alive, processes_of_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GRACE_S = 4.0


def _args(ckpt, *extra: str) -> list[str]:
    return ["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--checkpoint-dir", str(ckpt),
            "--checkpoint-interval", "1", "--driver-grace", str(GRACE_S), *extra]


def _wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _train_then_kill_the_driver(jobs, tmp_path):
    """Start the job, let it train and checkpoint, SIGKILL its driver: (args, env, job id, workers, last step seen)."""
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir()
    # 100 steps of 0.1 s: the orphans make some 40 in the grace, the restarted driver's workers the rest.
    args = _args(tmp_path / "ckpt", *probe_cmd("--steps", "100", "--step-sleep", "0.1"))
    first = jobs(args, env=env)
    first.wait_for(lambda j: any(e["step"] >= 10 for e in j.of("commit")) and "checkpoint of step" in j.output(),
                   timeout=120, what="training with checkpoints")
    job_id = first.job_id()
    workers = processes_of_job(job_id)
    assert len(workers) == 2
    seen_before_kill = max(e["step"] for e in first.of("commit"))
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    return args, env, job_id, workers, seen_before_kill


def test_a_killed_driver_is_resumed_by_the_same_command_and_no_worker_outlives_the_grace(jobs, tmp_path):
    args, env, job_id, _, seen_before_kill = _train_then_kill_the_driver(jobs, tmp_path)
    ckpt = tmp_path / "ckpt"

    # Without their driver the workers train on (and checkpoint) for the grace, then stop.
    store = CheckpointStore(str(ckpt))
    _wait_until(lambda: store.list() and store.list()[0].step > seen_before_kill + 2, GRACE_S + 30,
                "a checkpoint written without the driver")
    _wait_until(lambda: not processes_of_job(job_id), GRACE_S + 30, "the orphaned workers to stop")
    latest = store.list()[0].step
    assert read_job_record(store).job_id == job_id

    second = jobs(args, env=env)
    assert second.finish(180) == 0, second.output()
    out = second.output()
    assert second.job_id() == job_id, "the restarted driver did not keep the job's identity"
    assert f"resumed from the checkpoint of step {latest}" in out, out
    resumed = [e for e in second.of("commit")]
    assert resumed and min(e["step"] for e in resumed) == latest + 1, "training did not continue from the checkpoint"
    done = second.of("done")
    assert len(done) == 2 and {e["step"] for e in done} == {100} and len({e["checksum"] for e in done}) == 1
    assert not processes_of_job(job_id)


def _when_gone(pids: set[int]) -> dict[str, float]:
    """Fill ``{"t": time.monotonic()}`` as soon as none of ``pids`` is alive (watched every 50 ms)."""
    gone: dict[str, float] = {}

    def watch() -> None:
        while any(_alive(pid) for pid in pids):
            time.sleep(0.05)
        gone["t"] = time.monotonic()

    threading.Thread(target=watch, daemon=True).start()
    return gone


def _removed(path) -> bool:
    try:
        shutil.rmtree(path)
    except OSError:  # a file appeared between rmtree's listing and its rmdir
        return False
    return True


def test_a_driver_restarted_without_the_local_record_waits_for_the_old_workers_first(jobs, tmp_path):
    args, env, job_id, workers, _ = _train_then_kill_the_driver(jobs, tmp_path)
    # This machine forgets the dead driver, as another machine (or a rebooted VM) never knew it. The orphans add
    # their kept output (.out-<worker>.log, .fifo) to the directory meanwhile: rmtree then finds it not empty.
    _wait_until(lambda: _removed(tmp_path / "run" / "cloud-elastic" / job_id), 20, "the driver's record removed")
    gone = _when_gone(set(workers))

    second = jobs(args, env=env)
    assert second.finish(180) == 0, second.output()
    out = second.output()
    assert "driver-alive.json, and this machine has no record of it" in out, out
    assert "waiting" in out and "for them to stop before starting new ones" in out, out
    launched = [t for t, line in zip(second.times, second.lines) if "launched worker" in line]
    assert launched and "t" in gone, out
    assert min(launched) > gone["t"], "new workers started while the dead driver's workers still trained"
    assert second.job_id() == job_id and "resumed from the checkpoint of step" in out
    assert not processes_of_job(job_id)


def test_a_driver_refreshing_the_entry_elsewhere_keeps_a_second_driver_from_starting_workers(jobs, tmp_path):
    # A live driver on another machine: its entry beside the checkpoints keeps being refreshed.
    from cloud_elastic.checkpoint import DurableJobRecord, write_job_record
    from cloud_elastic.checkpoint.alive import DriverAlive, read_driver_alive, write_driver_alive

    ckpt = tmp_path / "ckpt"
    store = CheckpointStore(str(ckpt))
    write_job_record(store, DurableJobRecord("elsewhere1", ("python", "train.py"), time.time()))
    done = threading.Event()
    overwritten: list = []  # entries the second driver wrote over the live one's

    def other_driver() -> None:
        while not done.is_set():
            seen = read_driver_alive(store)
            if seen is not None and seen.pid != 4242:
                overwritten.append(seen)
            write_driver_alive(store, DriverAlive("elsewhere1", time.time(), 1.0, "other-vm", 4242))
            done.wait(1.0)

    threading.Thread(target=other_driver, daemon=True).start()
    try:
        (tmp_path / "run").mkdir()
        second = jobs(["run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", str(ckpt), "--driver-grace", "1",
                       *probe_cmd("--steps", "5")], env={"XDG_RUNTIME_DIR": str(tmp_path / "run")})
        assert second.finish(60) == 2, second.output()
    finally:
        done.set()
    out = second.output()
    assert "(pid 4242 on other-vm) was last alive" in out and "waiting" in out, out
    assert "job elsewhere1 is already running: its driver (pid 4242 on other-vm) was alive" in second.lines[-1], out
    assert "launched worker" not in out and not processes_of_job("elsewhere1")
    # While it waited, it wrote no sign of life of its own over the live driver's (which would hide it).
    assert not overwritten, overwritten


def test_a_live_driver_whose_local_record_is_gone_is_not_run_twice_on_its_machine(jobs, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = ["run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", str(ckpt),
            *probe_cmd("--steps", "100000", "--step-sleep", "0.1")]
    for runtime in ("run-a", "run-b"):
        (tmp_path / runtime).mkdir()
    first = jobs(args, env={"XDG_RUNTIME_DIR": str(tmp_path / "run-a")})
    first.wait_event("commit")
    assert (ckpt / "driver-alive.json").exists()
    # Another runtime directory: this driver cannot see the first one's local record.
    second = jobs(args, env={"XDG_RUNTIME_DIR": str(tmp_path / "run-b")})
    assert second.finish(60) == 2, second.output()
    assert f"is already running here (driver pid {first.proc.pid})" in second.output()
    assert first.proc.poll() is None


def test_a_driver_restarted_before_any_checkpoint_resumes_from_what_the_old_workers_wrote_meanwhile(jobs, tmp_path):
    """The old workers write their first checkpoints while the restarted driver waits out their grace:
    it must look again after the wait, not start training over from initial weights."""
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir()
    ckpt, gate = tmp_path / "ckpt", tmp_path / "train-now"
    # The workers train (and so checkpoint) only once the gate exists: after the restarted driver has
    # looked for checkpoints and found none. Their grace outlasts the restarted driver's start-up (2 s here,
    # a few more under load) and a checkpoint interval; the restarted driver waits all of it out, and 12 s more.
    # In it they make 110 steps at most (0.1 s each): the restarted driver's workers train the rest.
    args = ["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--checkpoint-dir", str(ckpt),
            "--checkpoint-interval", "1", "--driver-grace", "11",
            *probe_cmd("--steps", "150", "--step-sleep", "0.1", "--start-when", str(gate))]
    first = jobs(args, env=env)
    first.wait_for(lambda j: len(j.of("hello")) == 2, timeout=120, what="the workers in their first round")
    job_id = first.job_id()
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    # As on another machine: no local record of the dead driver, so no adoption, only the wait.
    shutil.rmtree(tmp_path / "run" / "cloud-elastic" / job_id)

    second = jobs(args, env=env)
    second.wait_for(lambda j: "it has no checkpoint yet" in j.output(), timeout=60, what="the restarted driver")
    gate.touch()
    store = CheckpointStore(str(ckpt))
    _wait_until(lambda: store.list(), 30, "a checkpoint from the old workers")
    assert second.finish(180) == 0, second.output()
    out = second.output()
    assert "for them to stop before starting new ones" in out, out
    assert second.job_id() == job_id
    loaded = [line for line in second.lines if "resumed from the checkpoint of step" in line]
    assert loaded, out
    step = int(loaded[0].split("resumed from the checkpoint of step ")[1].split()[0])
    resumed = second.of("commit")
    assert step >= 1 and resumed and min(e["step"] for e in resumed) == step + 1, (
        "training started over from initial weights")
    assert not processes_of_job(job_id)


@pytest.mark.timeout(60)
def test_a_dead_drivers_pid_reused_by_another_cloud_process_does_not_refuse_the_restart(jobs, tmp_path):
    """The dead driver's record survived (a reboot keeps ~/.cloud-elastic); its pid is now amazon-cloudwatch-agent's.
    The restart was refused as 'already running here' with exit code 2, which a supervisor never retries."""
    import json
    import subprocess
    import sys

    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir()
    args = ["run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", str(tmp_path / "ckpt"), "--driver-grace", "1",
            sys.executable, "-c", "pass"]  # a plain command: it never connects, the job fails (exit 1) but runs
    first = jobs(args, env=env)
    assert first.finish(60) == 1, first.output()
    job_id = first.job_id()
    other = subprocess.Popen(["bash", "-c", "exec -a /usr/bin/amazon-cloudwatch-agent sleep 60"])
    try:
        _wait_until(lambda: b"cloud" in open(f"/proc/{other.pid}/cmdline", "rb").read(), 10, "the other process")
        long_ago = time.time() - 3 * 24 * 3600
        record = tmp_path / "run" / "cloud-elastic" / job_id / "driver.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"v": 1, "job": job_id, "address": "127.0.0.1:1", "pid": other.pid,
                                      "started": long_ago, "command": args[-3:], "cwd": str(tmp_path)}))
        os.utime(record, (long_ago, long_ago))
        second = jobs(args, env=env)
        assert second.finish(60) == 1, second.output()
        out = second.output()
        assert "already running" not in out and "without ever connecting to the driver" in out, out
        assert second.job_id() == job_id
    finally:
        other.kill()
        other.wait()
