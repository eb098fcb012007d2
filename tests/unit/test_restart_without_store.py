"""The same command run again without ``--checkpoint-dir`` after its driver died waits out the old workers.

Without a checkpoint store nothing can be adopted or resumed, but the dead driver's workers train
on for its ``--driver-grace`` on the same hosts (on GPUs, holding the devices' memory). A new
generation started beside them trained a second copy of the job from initial weights with no word
said. The restarted driver now finds the dead one by its command in this user's records on this
machine and waits until its workers have stopped (one line saying so, and that --checkpoint-dir
would have kept their progress), then starts over; a supervisor (systemd ``Restart=on-failure``,
which does not restart a driver that exits 2) gets a job that runs again, not a refusal.
"""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.restart import predecessor
from cloud_elastic.driver.restart.predecessor import plan_start, wait_for_predecessor
from cloud_elastic.records import find_jobs, write_driver_record

pytestmark = pytest.mark.timeout(30)

COMMAND = ("python", "train.py")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _dead_driver(job_id: str, *, command=COMMAND, grace_s: float | None = 30.0, died_s_ago: float = 2.0) -> float:
    """The records a driver of ``command`` killed ``died_s_ago`` seconds ago leaves; returns its last sign of life."""
    directory = write_driver_record(job_id, "127.0.0.1:1", "s3cret", pid=_dead_pid(), command=command,
                                    grace_s=grace_s)
    last = time.time() - died_s_ago
    os.utime(directory / "driver.json", (last, last))
    return last


@pytest.fixture(autouse=True)
def _runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


def _config(**kw) -> JobConfig:
    return JobConfig(**(dict(command=COMMAND, num_proc=2, min_np=2, max_np=2, driver_grace_s=30.0) | kw))


def test_the_driver_of_the_same_command_waits_until_the_dead_drivers_workers_stop_then_starts_over(
        caplog, monkeypatch) -> None:
    last = _dead_driver("0ldj0b01")
    plan = plan_start(_config(), None, job_id="n3wj0b01")
    assert plan.job_id == "n3wj0b01" and not plan.resumed and plan.adopt is None
    # Its workers stop at its last sign of life (refreshed every 2 s) plus their grace, and a moment to exit.
    assert plan.wait_until is not None and last + 30 < plan.wait_until <= last + 30 + 10
    # The driver's wait blocks on its lock; here each wait moves the predecessor module's clock on instead.
    clock = [time.time()]
    monkeypatch.setattr(predecessor, "time", SimpleNamespace(time=lambda: clock[0]))
    waited: list[float] = []

    def wait(seconds: float) -> bool:
        waited.append(seconds)
        clock[0] += seconds
        return False

    stops: list = []
    with caplog.at_level(logging.INFO, logger=predecessor.__name__):
        outcome = wait_for_predecessor(plan, None, wait, lambda reason, code: stops.append((reason, code)),
                                       resumed=False)
    assert stops == [] and outcome.predecessor_gone and not outcome.resumed
    assert clock[0] >= plan.wait_until and sum(waited) > 25
    text = caplog.text
    assert "job 0ldj0b01" in text and "without --checkpoint-dir its workers cannot be adopted" in text
    assert "waiting" in text and "training starts over" in text


@pytest.mark.parametrize("case", ["other command", "another directory", "grace over", "driver alive"])
def test_no_wait_for_another_command_a_grace_run_out_or_a_live_driver(case: str, tmp_path, monkeypatch) -> None:
    if case == "other command":
        _dead_driver("0ldj0b01", command=("python", "other.py"))
    elif case == "another directory":  # `python train.py` of another project, found by the session's review
        elsewhere = tmp_path / "other-project"
        elsewhere.mkdir()
        here = os.getcwd()
        monkeypatch.chdir(elsewhere)
        _dead_driver("0ldj0b01")
        monkeypatch.chdir(here)
    elif case == "grace over":
        _dead_driver("0ldj0b01", died_s_ago=60.0)
    else:  # two drivers of one command at once are not a restart: left as they always were
        live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "cloud-elastic"])
        deadline = time.monotonic() + 10  # until it has exec'd: before, its command line is this test's
        while b"cloud-elastic" not in pathlib.Path(f"/proc/{live.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        write_driver_record("0ldj0b01", "127.0.0.1:1", "s3cret", pid=live.pid, command=COMMAND, grace_s=30.0)
    if case == "another directory":
        (tmp_path / "other-project" / "train.py").write_text("")  # its own train.py, not this one's
        (tmp_path / "train.py").write_text("")
        monkeypatch.chdir(tmp_path)
    try:
        plan = plan_start(_config(), None, job_id="n3wj0b01")
    finally:
        if case == "driver alive":
            live.kill()
            live.wait()
    assert plan.wait_until is None and plan.predecessor_gone


def test_the_dead_drivers_own_grace_is_waited_for_not_ours() -> None:
    last = _dead_driver("0ldj0b01", grace_s=5.0)
    plan = plan_start(_config(driver_grace_s=600.0), None, job_id="n3wj0b01")
    assert plan.wait_until is not None and plan.wait_until <= last + 5 + 10
    job, = find_jobs(COMMAND)
    assert job.grace_s == 5.0  # what 'cloud-elastic status' shows of it too


@pytest.mark.parametrize("label", ["<ray actor>", "<spark task>"])
def test_ray_and_spark_drivers_wait_for_nothing(label: str) -> None:
    # Found by the session's review: a notebook's next executor.run(train) after a crashed kernel waited
    # grace + 5 s for actors or tasks that died with their driver, naming a flag these APIs do not have.
    _dead_driver("0ldj0b01", command=(label, "train"))
    plan = plan_start(_config(command=(label, "train")), None, job_id="n3wj0b01")
    assert plan.wait_until is None and plan.predecessor_gone


def test_the_same_script_by_its_absolute_path_from_another_directory_is_waited_for(tmp_path, monkeypatch) -> None:
    # Found by review: `cloud-elastic run python /abs/train.py` restarted from another directory (a unit, a
    # wrapper that cd's) is the same job, and its workers must be waited out.
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    command = ("python", str(script))
    monkeypatch.chdir(script.parent)
    _dead_driver("0ldj0b01", command=command)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    plan = plan_start(_config(command=command), None, job_id="n3wj0b01")
    assert plan.wait_until is not None


def test_a_restart_that_adds_a_checkpoint_dir_still_waits_until_the_dead_drivers_workers_stop(tmp_path) -> None:
    """The first run had no --checkpoint-dir (or another one), as the restart's own warning suggests adding: its
    workers trained on for 5 s after the new job's workers had started on the same slots (two processes per GPU)."""
    from cloud_elastic.driver.restart.predecessor import open_store

    last = _dead_driver("0ldj0b01")
    config = _config(checkpoint_dir=str(tmp_path / "ckpt"))
    plan = plan_start(config, open_store(config), job_id="n3wj0b01")
    assert plan.job_id == "n3wj0b01" and not plan.resumed and plan.adopt is None
    assert plan.wait_until is not None and last + 30 < plan.wait_until <= last + 30 + 10
    assert "job 0ldj0b01" in plan.waiting_for and f"did not checkpoint to {tmp_path / 'ckpt'}" in plan.waiting_for
    assert not plan.predecessor_gone


def test_a_restart_that_forgot_the_dead_drivers_checkpoint_dir_is_told_which_one_it_was(tmp_path) -> None:
    # Review h25: the same command run again without --checkpoint-dir said "use --checkpoint-dir to keep their
    # progress" and started over; the dead driver's own record says where its checkpoints are.
    from cloud_elastic.driver.restart.record import write_record
    from cloud_elastic.records import job_dir

    _dead_driver("0ldj0b01")
    ckpt = str(tmp_path / "ckpt")
    write_record(job_dir("0ldj0b01"), {
        "job": "0ldj0b01", "checkpoint_dir": ckpt, "advertised": "127.0.0.1", "bind": "127.0.0.1",
        "control_port": 1, "store_port": 2, "grace_s": 30.0, "seq": 1, "workers": []})
    plan = plan_start(_config(), None, job_id="n3wj0b01")
    assert plan.waiting_for.endswith(f"without --checkpoint-dir its workers cannot be adopted (it checkpointed to "
                                     f"{ckpt}: stop this one and run it again with --checkpoint-dir {ckpt} to resume "
                                     f"its progress)"), plan.waiting_for


@pytest.mark.parametrize("died_s_ago", [2.0, 600.0])  # within the dead workers' grace, and long past it
def test_a_restart_whose_checkpoint_dir_changed_to_an_empty_one_is_refused_naming_the_dead_drivers(
        tmp_path, died_s_ago) -> None:
    """Review h32: the same command run again with --checkpoint-dir mistyped or changed (a ConfigMap edit) waited out
    the old workers, then trained the job again from initial weights and succeeded, its progress left in the
    directory the dead driver checkpointed to. Refused now, naming both; removing the record is starting over on
    purpose."""
    from cloud_elastic.driver.restart.predecessor import open_store
    from cloud_elastic.driver.restart.record import write_record
    from cloud_elastic.errors import ConfigError
    from cloud_elastic.records import job_dir

    _dead_driver("0ldj0b01", died_s_ago=died_s_ago)
    theirs = str(tmp_path / "my-job")
    write_record(job_dir("0ldj0b01"), {
        "job": "0ldj0b01", "checkpoint_dir": theirs, "advertised": "127.0.0.1", "bind": "127.0.0.1",
        "control_port": 1, "store_port": 2, "grace_s": 30.0, "seq": 1, "workers": []})
    config = _config(checkpoint_dir=str(tmp_path / "my-jbo"))
    with pytest.raises(ConfigError) as refused:
        plan_start(config, open_store(config), job_id="n3wj0b01")
    assert str(refused.value).startswith(
        f"the previous driver of this command (job 0ldj0b01, pid ") and (
        f"having checkpointed to {theirs}, and {tmp_path / 'my-jbo'} holds nothing: not training the job again from "
        f"initial weights; run it with --checkpoint-dir {theirs} to resume it, or remove "
        f"{job_dir('0ldj0b01') / 'adopt.json'} to start a new job here on purpose") in str(refused.value), refused.value
    assert not (tmp_path / "my-jbo" / "job.json").exists()  # nothing claimed by the refused start
    (job_dir("0ldj0b01") / "adopt.json").unlink()
    plan = plan_start(config, open_store(config), job_id="n3wj0b01")
    assert plan.job_id == "n3wj0b01" and not plan.resumed


@pytest.mark.parametrize("label", ["<ray actor>", "<spark task>"])
def test_ray_and_spark_jobs_of_other_checkpoint_dirs_are_not_the_same_command(tmp_path, label: str) -> None:
    """Every Ray (or Spark) job's driver records the same stand-in command: a crashed one says nothing of another."""
    from cloud_elastic.driver.restart.predecessor import open_store
    from cloud_elastic.driver.restart.record import write_record
    from cloud_elastic.records import job_dir

    _dead_driver("0ldj0b01", command=(label,))
    write_record(job_dir("0ldj0b01"), {
        "job": "0ldj0b01", "checkpoint_dir": str(tmp_path / "one"), "advertised": "127.0.0.1", "bind": "127.0.0.1",
        "control_port": 1, "store_port": 2, "grace_s": 30.0, "seq": 1, "workers": []})
    config = _config(command=(label,), checkpoint_dir=str(tmp_path / "another"))
    assert plan_start(config, open_store(config), job_id="n3wj0b01").job_id == "n3wj0b01"
