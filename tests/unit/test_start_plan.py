"""A starting driver's plan (cloud_elastic.driver.restart.predecessor.plan_start) over real checkpoint storage
and real driver records on disk: the job's identity, resume, adopt, and the wait for a dead predecessor."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from cloud_elastic.checkpoint.alive import DriverAlive, write_driver_alive
from cloud_elastic.config import JobConfig
from cloud_elastic.driver.runtime import raised
from cloud_elastic.driver.restart.predecessor import driver_alive, open_store, plan_start
from cloud_elastic.driver.restart.record import write_record
from cloud_elastic.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


def _config(ckpt: str, **changes) -> JobConfig:
    return JobConfig(**(dict(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2, checkpoint_dir=ckpt)
                        | changes))


@contextmanager
def live_driver() -> Iterator[int]:
    """The pid of a live process whose command line is a cloud-elastic driver's, until the block ends."""
    live = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)",
                             "cloud-elastic"], stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline() == "up\n"  # its command line is the driver's by now
        yield live.pid
    finally:
        live.kill()
        live.wait()
        live.stdout.close()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _dead_driver(root, job: str, ckpt: str, *, workers: bool) -> int:
    """The records a driver of ``job`` killed a moment ago leaves on this machine."""
    directory = root / "cloud-elastic" / job
    directory.mkdir(parents=True, mode=0o700)
    from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, write_job_record

    # As it started, it wrote its job record to --checkpoint-dir (plan_start): a store holding nothing is
    # another storage, refused (test_start_plan's test_a_dead_drivers_storage_found_empty_is_refused).
    write_job_record(CheckpointStore(ckpt), DurableJobRecord(job, ("python", "train.py"), time.time()),
                     only_if_absent=True)
    pid = _dead_pid()
    (directory / "driver.json").write_text(json.dumps({"pid": pid}))
    (directory / "secret").write_text("s" * 64)
    write_record(directory, {
        "job": job, "checkpoint_dir": ckpt, "advertised": "127.0.0.1", "bind": "127.0.0.1", "control_port": 1,
        "store_port": 2, "grace_s": 60.0, "seq": 1,
        "workers": [{"id": "127.0.0.1[0]#1", "host": "127.0.0.1", "slot": 0, "seq": 1,
                     "handle": {"kind": "local", "pid": pid, "start": 0}}] if workers else [],
    })
    return pid


def test_without_a_checkpoint_dir_the_plan_is_a_plain_start() -> None:
    config = JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2)
    plan = plan_start(config, open_store(config), job_id="j1")
    assert (plan.job_id, plan.resumed, plan.adopt, plan.wait_until, plan.predecessor_gone) == (
        "j1", False, None, None, True)


def test_a_new_checkpoint_dir_records_the_job_and_a_second_driver_takes_its_identity(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = _config(str(tmp_path / "ckpt"))
    first = plan_start(config, open_store(config), job_id="j1")
    assert first.job_id == "j1" and not first.resumed  # no checkpoint yet: training starts from the beginning
    second = plan_start(config, open_store(config), job_id="other")
    assert second.job_id == "j1" and not second.resumed and second.adopt is None


def test_a_predecessor_dead_within_its_grace_is_adopted_and_waited_for_should_none_come_back(tmp_path,
                                                                                            monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _dead_driver(tmp_path, "a1b2c3d4", ckpt, workers=True)
    config = _config(ckpt)
    plan = plan_start(config, open_store(config), job_id="mine")
    assert plan.job_id == "a1b2c3d4" and plan.adopt is not None and plan.adopt.job_id == "a1b2c3d4"
    assert not plan.predecessor_gone and plan.wait_until is not None and plan.wait_until > time.time()
    assert plan.without_adoption().adopt is None


def test_the_workers_of_another_jobs_record_are_not_adopted(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    config = _config(ckpt)
    plan_start(config, open_store(config), job_id="theirs")  # the storage belongs to job "theirs"
    _dead_driver(tmp_path, "a1b2c3d4", ckpt, workers=True)
    plan = plan_start(config, open_store(config), job_id="mine")
    assert plan.job_id == "theirs" and plan.adopt is None


def test_a_live_driver_of_the_job_refuses_a_second_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = _config(str(tmp_path / "ckpt"))
    plan_start(config, open_store(config), job_id="j1")
    directory = tmp_path / "cloud-elastic" / "j1"
    directory.mkdir(parents=True, mode=0o700)
    with live_driver() as pid:
        (directory / "driver.json").write_text(json.dumps({"pid": pid}))
        with pytest.raises(ConfigError, match=f"job j1 is already running here \\(driver pid {pid}\\)"):
            plan_start(config, open_store(config), job_id="other")


def test_a_dead_pid_is_no_live_driver() -> None:
    assert not driver_alive(_dead_pid())


@pytest.mark.parametrize("pid", [0, -1])
def test_a_pid_naming_a_group_or_every_process_is_no_live_driver(pid) -> None:
    # A record in storage may say anything: kill(0) and kill(-1) reach groups, so they would "exist".
    assert not driver_alive(pid)


def test_the_groups_a_crashed_predecessor_raised_are_taken_over_and_set_back_once_nothing_needs_them(
        tmp_path, monkeypatch) -> None:
    from tests.unit.test_job_sourcing import Sourced

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = _config(str(tmp_path / "ckpt"))
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    # The driver on another machine died with the on-demand group raised (its last refresh, not "stopped").
    write_driver_alive(store, DriverAlive("j1", time.time() - 2, 60.0, "driver-vm", 4242, raised=(("od", 2),)))
    plan = plan_start(config, open_store(config), job_id="j2")
    assert plan.job_id == "j1" and plan.previous_alive.raised == (("od", 2),)
    sim = Sourced(1, manage_capacity=True)
    raised.inherit(sim.job, raised.carried(plan.previous_alive))
    assert sim.job.capacity.sourcing.raised() == {"od": 2}
    sim.groups(a=1, od=2)  # a spot slot is enough
    sim.advance(1)
    assert [(a.source, a.hosts) for a in sim.capacity] == [("od", 0)]
    # A predecessor that stopped cleanly set its groups back itself: nothing is taken over.
    write_driver_alive(store, DriverAlive("j1", time.time(), 60.0, "driver-vm", 4242, stopped=True,
                                          raised=(("od", 2),)))
    assert plan_start(config, open_store(config), job_id="j3").previous_alive is None


def test_checkpoints_without_a_job_record_are_resumed_under_their_job_never_trained_over(tmp_path, monkeypatch):
    # job.json deleted (or not copied with the checkpoints): a fresh job id trained from the start, and its first
    # saves pruned the trained checkpoints away (found by review).
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = _config(str(tmp_path / "ckpt"))
    store = open_store(config)
    store.save(500, {"step": 500}, {"job_id": "j1"})
    store.save(600, {"step": 600}, {"job_id": "j1"})
    plan = plan_start(config, open_store(config), job_id="fresh")
    assert (plan.job_id, plan.resumed) == ("j1", True)
    assert (tmp_path / "ckpt" / "job.json").exists()


def test_checkpoints_that_name_no_job_and_have_no_record_stop_the_start_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = _config(str(tmp_path / "ckpt"))
    open_store(config).save(500, {"step": 500})
    with pytest.raises(ConfigError, match=r"holds checkpoints but no job record \(job.json\), and no checkpoint "
                                          r"names its job: not starting the training over them") as refused:
        plan_start(config, open_store(config), job_id="fresh")
    assert "\n" not in str(refused.value)


def test_checkpoints_none_of_which_can_be_read_are_never_taken_for_no_checkpoint(tmp_path, monkeypatch):
    # A package downgraded under manifests of a newer format, or every manifest torn: "no checkpoint yet, so
    # training starts over" was said, and the unreadable checkpoints were pruned by the new run's saves.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = _config(str(tmp_path / "ckpt"))
    plan_start(config, open_store(config), job_id="j1")  # the job record
    saved = open_store(config).save(500, {"step": 500}, {"job_id": "j1"})
    manifest = tmp_path / "ckpt" / saved.name / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"format_version": 1', '"format_version": 99'))
    with pytest.raises(ConfigError, match=r"holds 1 checkpoint\(s\) and none can be read .*not starting the "
                                          r"training over; was it written by a newer cloud-elastic\?"):
        plan_start(config, open_store(config), job_id="other")


def test_a_record_naming_this_process_pid_is_a_dead_driver_whose_pid_it_reuses() -> None:
    """A container's PID 1 restarted in place finds its predecessor's records naming pid 1, its own: that
    driver is dead (to be waited out or adopted), not a live one refusing this start."""
    check = ("import os; from cloud_elastic.driver.restart.predecessor import driver_alive; "
             "print(driver_alive(os.getpid()), driver_alive(os.getppid()))")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    # Its own pid is no live driver; its parent (pytest, not a cloud-elastic command) is none either.
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_a_dead_drivers_pid_reused_by_another_cloud_process_does_not_block_the_restart(tmp_path, monkeypatch):
    """Days after the driver was killed its pid is amazon-cloudwatch-agent's (or cloud-init's, another job's fork
    server's): 'already running here', exit 2, was refused for good, and a supervisor does not retry exit 2."""
    import os

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = _config(str(tmp_path / "ckpt"))
    store = open_store(config)
    plan_start(config, store, job_id="j1")  # the job record
    long_ago = time.time() - 3 * 24 * 3600
    directory = tmp_path / "cloud-elastic" / "j1"
    directory.mkdir(parents=True, mode=0o700)
    with live_driver() as other:  # started now, long after the dead driver wrote its records
        (directory / "driver.json").write_text(json.dumps({"pid": other, "started": long_ago}))
        os.utime(directory / "driver.json", (long_ago, long_ago))
        plan = plan_start(config, open_store(config), job_id="j2")
        assert plan.job_id == "j1" and plan.wait_until is not None and plan.wait_until < time.time()
        # No local record at all (a reboot emptied the runtime directory): the sign of life beside the checkpoints
        # names the same reused pid on this host.
        (directory / "driver.json").unlink()
        write_driver_alive(store, DriverAlive("j1", long_ago, 60.0, socket.gethostname(), other))
        plan = plan_start(config, open_store(config), job_id="j3")
        assert plan.job_id == "j1" and plan.previous_alive.pid == other
        # The same process, had it written the sign of life since it started, is a live driver: refused.
        write_driver_alive(store, DriverAlive("j1", time.time(), 60.0, socket.gethostname(), other))
        with pytest.raises(ConfigError, match=f"job j1 is already running here \\(driver pid {other}\\)"):
            plan_start(config, open_store(config), job_id="j4")


def test_a_start_on_a_finished_jobs_directory_says_that_job_succeeded_there_before_resuming_it(
        tmp_path, monkeypatch, caplog) -> None:
    """The same command again (or a new script) on a finished job's directory resumed it without a word: 'succeeded'
    with zero steps trained, or 'training state lost' for another model's checkpoint."""
    import logging

    from cloud_elastic.driver.restart.finished import mark_succeeded

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = _config(str(tmp_path / "ckpt"))
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    store.save(20, {"step": 20}, {"job_id": "j1"})
    with caplog.at_level(logging.WARNING):
        assert plan_start(config, open_store(config), job_id="j2").resumed
    assert "already succeeded" not in caplog.text  # a job that did not finish: resumed as ever
    mark_succeeded(store, "j1")  # what its driver writes once the job succeeded
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        plan = plan_start(config, open_store(config), job_id="j3")
    assert plan.job_id == "j1" and plan.resumed, "a finished job is still resumed (a longer schedule, a reshard)"
    line = next(r.getMessage() for r in caplog.records if "already succeeded" in r.getMessage())
    assert f"job j1 already succeeded on {tmp_path / 'ckpt'}" in line and "at step 20" in line
    assert "a new job (another script or model) wants a fresh --checkpoint-dir" in line
    # Trained on (a longer schedule) and stopped at step 25 before it succeeded again: no longer a finished job
    # (it said 'already succeeded at step 10' and resumed from 21 in the reviewer's stale_success.sh).
    store.save(25, {"step": 25}, {"job_id": "j1"})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert plan_start(config, open_store(config), job_id="j4").resumed
    assert "already succeeded" not in caplog.text


@pytest.mark.parametrize(("workers", "then"), [(True, "missing"), (False, "empty")])
def test_a_dead_drivers_storage_found_empty_is_refused(tmp_path, monkeypatch, workers: bool, then: str) -> None:
    # Review h25: a driver killed, its --checkpoint-dir renamed away (a volume not mounted after a reboot looks the
    # same), the same command run again: it said "the previous workers wrote no checkpoint", trained from initial
    # weights and succeeded. This machine's record of that driver says the storage held its job.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = tmp_path / "ckpt"
    _dead_driver(tmp_path, "a1b2c3d4", str(ckpt), workers=workers)
    shutil.rmtree(ckpt)
    if then == "empty":
        ckpt.mkdir()
    config = _config(str(ckpt))
    with pytest.raises(ConfigError) as raised:
        plan_start(config, open_store(config), job_id="mine")
    record = tmp_path / "cloud-elastic" / "a1b2c3d4" / "adopt.json"
    assert re.fullmatch(
        rf"job a1b2c3d4's driver \(pid \d+\) checkpointed to {re.escape(str(ckpt))} and died \d+s ago, but "
        rf"{re.escape(str(ckpt))} holds nothing of it now \(no job.json, checkpoint or claim\): not training it again "
        rf"from initial weights; mount or restore that storage, or, to start a new job there from initial weights, "
        rf"remove that driver's record \({re.escape(str(record))}\)", str(raised.value)), raised.value
    assert not (ckpt / "job.json").exists()  # nothing claimed by the refused start
    record.unlink()  # what the line says to do: a new job, from initial weights, as asked
    plan = plan_start(config, open_store(config), job_id="mine")
    assert plan.job_id == "mine" and not plan.resumed and plan.adopt is None


def test_a_relative_checkpoint_dir_names_the_store_of_the_directory_the_driver_ran_in(tmp_path, monkeypatch) -> None:
    # Review h27: a driver killed in proj1 with --checkpoint-dir ckpt; a new job in proj2 with its own empty ./ckpt
    # was refused as if proj1's record were its own (and a restart could have adopted proj1's workers).
    from cloud_elastic.driver.restart.record import SuccessorRecord, find_records, location

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    proj1, proj2 = tmp_path / "proj1", tmp_path / "proj2"
    for proj in (proj1, proj2):
        proj.mkdir()
    monkeypatch.chdir(proj1)
    _dead_driver(tmp_path, "a1b2c3d4", location("ckpt"), workers=True)  # what SuccessorRecord writes there
    successor = SuccessorRecord("a1b2c3d4", "ckpt", 60.0)
    assert successor._checkpoint_dir == str(proj1 / "ckpt") == location(f"file://{proj1}/ckpt")
    assert location("s3://bucket/ckpt") == "s3://bucket/ckpt"
    assert [r.job_id for r, *_ in find_records(tmp_path / "cloud-elastic", "ckpt")] == ["a1b2c3d4"]
    monkeypatch.chdir(proj2)
    assert find_records(tmp_path / "cloud-elastic", "ckpt") == []
    config = _config("ckpt")
    plan = plan_start(config, open_store(config), job_id="mine")  # proj2's own new job
    assert plan.job_id == "mine" and plan.adopt is None
