"""What a job's workers or its local launcher would refuse is refused by ``cloud-elastic run`` before anything starts.

A bad ``CLOUD_ELASTIC_*_S`` worker variable started every worker, each printed a 20-line
traceback, and the job failed with "all workers failed", never naming the variable; a bad
``CLOUD_ELASTIC_LOCAL_FORKSERVER`` exited 2 only after the events file and the checkpoint
directory had been written (a corrected rerun then "resumed" the empty job). Exit code 2
means nothing was started: one line, and no file written.
"""

from __future__ import annotations

import pytest

from cloud_elastic.cli import main
from cloud_elastic.errors import ConfigError

pytestmark = pytest.mark.timeout(30)  # without the checks a real (one-worker, `python -c 1`) job would run


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("CLOUD_ELASTIC_"):
            monkeypatch.delenv(name)


def _run(tmp_path, *extra: str) -> list[str]:
    return ["run", "-np", "1", "-H", "127.0.0.1:1", "--events-file", str(tmp_path / "ev.jsonl"),
            "--checkpoint-dir", str(tmp_path / "ck"), *extra, "python", "-c", "1"]


def _refused_before_anything(capsys, tmp_path, argv: list[str], words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "ev.jsonl").exists() and not (tmp_path / "ck").exists()


@pytest.mark.parametrize(("name", "value"), [
    ("CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S", "inf"),
    ("CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S", "nan"),
    ("CLOUD_ELASTIC_SELFTEST_TIMEOUT_S", "soon"),
])
def test_a_bad_worker_variable_in_the_environment_is_one_line_exit_2(name, value, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(name, value)
    _refused_before_anything(capsys, tmp_path, _run(tmp_path), f"error: {name}=")


def test_a_bad_worker_variable_given_by_x_is_one_line_exit_2(capsys, tmp_path):
    argv = _run(tmp_path, "-x", "CLOUD_ELASTIC_TERM_GRACE_S=1e12")
    _refused_before_anything(capsys, tmp_path, argv, "CLOUD_ELASTIC_TERM_GRACE_S=1000000000000.0: must be a finite")


def test_a_bad_local_forkserver_setting_is_one_line_exit_2_with_nothing_written(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CLOUD_ELASTIC_LOCAL_FORKSERVER", "maybe")
    _refused_before_anything(capsys, tmp_path, _run(tmp_path), "CLOUD_ELASTIC_LOCAL_FORKSERVER='maybe'")


def test_what_the_driver_sets_for_each_worker_is_its_own_not_the_environments():
    from cloud_elastic.worker.settings import check_environ

    # The driver's flags replace these in every worker's environment: a stale value in the shell is harmless...
    check_environ({"CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S": "nan", "CLOUD_ELASTIC_DRIVER": "x",
                   "CLOUD_ELASTIC_SLOT": "?", "CLOUD_ELASTIC_CHECKPOINT_INTERVAL_S": "0"}, {}, checkpointing=True)
    # ...-x cannot forward over them (below), and without --checkpoint-dir the shell's checkpoint value reaches it.
    with pytest.raises(ConfigError, match="CLOUD_ELASTIC_CHECKPOINT_INTERVAL_S"):
        check_environ({"CLOUD_ELASTIC_CHECKPOINT_INTERVAL_S": "0"}, {}, checkpointing=False)


@pytest.mark.parametrize(("name", "says"), [
    ("CLOUD_ELASTIC_DRIVER_GRACE_S", "sets it from --driver-grace (a Python API's setting of that name, where it has "
                                     "one), and the two must agree"),
    ("CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S", "sets it from --heartbeat-timeout"),
    ("CLOUD_ELASTIC_HEARTBEAT_INTERVAL_S", "sets it (the heartbeat pace its --heartbeat-timeout counts on)"),
    ("CLOUD_ELASTIC_NETWORK_INTERFACE", "sets it from --network-interface"),
    ("CLOUD_ELASTIC_CHECKPOINT_DIR", "sets it from --checkpoint-dir"),
    ("CLOUD_ELASTIC_CHECKPOINT_INTERVAL_S", "sets it from --checkpoint-interval"),
    ("CLOUD_ELASTIC_CHECKPOINT_KEEP", "sets it from --checkpoint-keep"),
])
def test_x_of_what_the_driver_sets_from_its_flags_is_one_line_exit_2(capsys, tmp_path, name: str, says: str):
    """Review h26: the README said these were refused; -x replaced them on the workers only (a forwarded grace the
    restarted driver's plan did not count on, a heartbeat pace its timeout did not)."""
    argv = _run(tmp_path, "-x", f"{name}=5")
    _refused_before_anything(capsys, tmp_path, argv, f"{name} cannot be forwarded to the workers (-x, or a Python "
                                                     f"API's env): the driver {says}")


def test_x_of_who_the_worker_is_is_one_line_exit_2(capsys, tmp_path):
    """-x CLOUD_ELASTIC_SLOT=-1 started the job, and its worker died at init() with a 20-line traceback."""
    argv = _run(tmp_path, "-x", "CLOUD_ELASTIC_SLOT=-1")
    _refused_before_anything(capsys, tmp_path, argv, "CLOUD_ELASTIC_SLOT cannot be forwarded to the workers (-x")


def test_who_the_worker_is_stays_the_drivers_whatever_x_says():
    from cloud_elastic.config import JobConfig
    from cloud_elastic.driver.job.actions import Launch
    from cloud_elastic.driver.job.hosts import Slot
    from cloud_elastic.driver.runtime.driver import Driver
    from cloud_elastic.providers.static import StaticHosts

    config = JobConfig(command=("python", "t.py"), num_proc=1, min_np=1, max_np=1,
                       forward_env=("CLOUD_ELASTIC_SLOT=-1", "CLOUD_ELASTIC_WORKER_ID=w", "MINE=1"))
    driver = Driver(config, StaticHosts({"127.0.0.1": 2}), job_id="j1")
    driver._endpoints.start("127.0.0.1", advertised="127.0.0.1")
    try:
        env = driver._processes.spec(Launch(Slot("127.0.0.1", 1), "127.0.0.1[1]#1")).env
    finally:
        driver._endpoints.close()
    assert (env["CLOUD_ELASTIC_SLOT"], env["CLOUD_ELASTIC_WORKER_ID"], env["MINE"]) == ("1", "127.0.0.1[1]#1", "1")


class _Started(Exception):
    """The driver was made: the job would start (it does not)."""


def _start(*args, **kwargs):
    raise _Started()


def test_the_drivers_environment_is_checked_only_for_workers_that_inherit_it(monkeypatch, capsys):
    """SSH workers get nothing of the driver's environment (docs/ssh.md): a stale value there refused an SSH job."""
    from cloud_elastic import cli
    from cloud_elastic.driver.runtime import driver as driver_module

    monkeypatch.setattr(cli, "_setup_logging", lambda verbose: None)
    monkeypatch.setattr(driver_module, "Driver", _start)
    monkeypatch.setenv("CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S", "")
    remote = ["run", "-np", "1", "-H", "192.0.2.10:1", "python", "-c", "1"]
    with pytest.raises(_Started):
        main(remote)
    # A local host's workers inherit it, and an -x value reaches every worker: both are still refused.
    assert main(["run", "-np", "1", "-H", "localhost:1", "python", "-c", "1"]) == 2
    assert main([*remote[:5], "-x", "CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S=inf", *remote[5:]]) == 2
    err = capsys.readouterr().err
    assert "CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S=''" in err and "CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S=inf" in err
