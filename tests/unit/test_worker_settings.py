"""worker/settings.py: the worker's environment, read once, validated, secret kept out of logs."""

from __future__ import annotations

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(10)

DRIVER = {"CLOUD_ELASTIC_DRIVER": "10.0.0.1:4000", "CLOUD_ELASTIC_STORE": "10.0.0.1:4001",
          "CLOUD_ELASTIC_SECRET": "s" * 64, "CLOUD_ELASTIC_WORKER_ID": "h[1]#3", "CLOUD_ELASTIC_SLOT": "1"}


def test_a_script_run_directly_is_standalone():
    s = WorkerSettings.from_environ({})
    assert s.standalone and s.zero_copy_commit and s.malloc_tuning and s.slot == 0


def test_driver_environment_is_read_once_into_the_settings():
    s = WorkerSettings.from_environ({**DRIVER, "CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S": "2.5",
                                     "CLOUD_ELASTIC_ZERO_COPY_COMMIT": "0", "CLOUD_ELASTIC_BACKEND": "GLOO"})
    assert not s.standalone
    assert (s.worker_id, s.slot, s.heartbeat_timeout_s, s.backend) == ("h[1]#3", 1, 2.5, "gloo")
    assert s.zero_copy_commit is False
    assert "s" * 64 not in repr(s)


@pytest.mark.parametrize("name", ["MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"])
def test_the_users_glibc_settings_turn_malloc_tuning_off(name):
    assert WorkerSettings.from_environ({name: "1"}).malloc_tuning is False


@pytest.mark.parametrize("env,message", [
    ({"CLOUD_ELASTIC_SECRET": ""}, "the job's secret is missing"),
    ({"CLOUD_ELASTIC_STORE": "nohost"}, "CLOUD_ELASTIC_STORE='nohost': expected HOST:PORT"),
    ({"CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S": "soon"}, "CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S='soon': not a number"),
    ({"CLOUD_ELASTIC_BACKEND": "mpi"}, "use gloo or nccl"),
    ({"CLOUD_ELASTIC_ZERO_COPY_COMMIT": "maybe"}, "use 0 or 1"),
    ({"CLOUD_ELASTIC_SLOT": "-1"}, "must be >= 0"),
    ({"CLOUD_ELASTIC_SHARDED_CHECKPOINT_WRITES": "later"}, "CLOUD_ELASTIC_SHARDED_CHECKPOINT_WRITES='later': use "
                                                          "background or sync"),
])
def test_bad_values_are_one_line_errors_naming_the_variable(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        WorkerSettings.from_environ({**DRIVER, **env})
    assert "\n" not in str(info.value)


def test_what_the_driver_writes_is_read_back_as_the_same_settings_and_holds_no_secret():
    from cloud_elastic.worker.settings import SECRET_ENV

    given = WorkerSettings(standalone=False, driver_address="10.0.0.1:4000", store_address="10.0.0.1:4001",
                           job_id="j1", worker_id="h[1]#3", hostname="h", slot=1, host_key="h/1/ab",
                           network_interface="eth1", heartbeat_interval_s=0.25, heartbeat_timeout_s=2.5,
                           driver_grace_s=45.0, checkpoint_dir="s3://b/ckpt", checkpoint_interval_s=60.0,
                           checkpoint_keep=3, secret="s" * 64)
    env = given.to_environ()
    assert all(name.startswith("CLOUD_ELASTIC_") for name in env) and "s" * 64 not in env.values()
    assert WorkerSettings.from_environ({**env, SECRET_ENV: "s" * 64}) == given
    plain = WorkerSettings(standalone=False, driver_address="a:1", store_address="a:2", secret="s" * 64)
    assert not {"CLOUD_ELASTIC_CHECKPOINT_DIR", "CLOUD_ELASTIC_HOST_KEY",
                "CLOUD_ELASTIC_NETWORK_INTERFACE"} & set(plain.to_environ())


def test_the_secret_is_read_once_from_its_pipe_which_is_closed_and_its_variable_dropped(monkeypatch):
    """What a worker started from scratch does as the worker library loads: the launcher's pipe (its write end
    closed) is read without blocking and closed, so the script's subprocesses inherit neither it nor its
    number, and a variable naming a descriptor that is not such a pipe takes nothing."""
    import os

    from cloud_elastic.driver.launch.ssh_remote import secret_pipe
    from cloud_elastic.worker import settings

    monkeypatch.setattr(settings, "_taken", [])
    fd = secret_pipe("s" * 64)
    monkeypatch.setenv(settings.SECRET_FD_ENV, str(fd))
    assert settings.take_secret() == "s" * 64 and settings.taken_secret() == "s" * 64
    assert settings.SECRET_FD_ENV not in os.environ
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    read_end, write_end = os.pipe()  # a writer still open: not the launcher's pipe
    try:
        for foreign in (str(write_end), str(read_end), "not-a-number"):
            monkeypatch.setattr(settings, "_taken", [])
            monkeypatch.setenv(settings.SECRET_FD_ENV, foreign)
            assert settings.take_secret() == ""
        os.fstat(read_end)  # left open for its owner
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_worker_whose_wrapper_did_not_pass_the_pipe_on_reads_it_through_its_parent(tmp_path):
    """``python wrap.py`` starting the training with ``subprocess`` (which closes inherited descriptors): the worker
    reads the launcher's pipe through its parent, that very pipe only (its inode), and nothing else's."""
    import os
    import subprocess
    import sys

    from cloud_elastic.driver.launch.ssh_remote import secret_fd_value, secret_pipe
    from cloud_elastic.worker.settings import SECRET_FD_ENV

    child = "from cloud_elastic.worker.settings import taken_secret; print(repr(taken_secret()))"
    wrapper = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {child!r}]))"

    def run(value: str, fd: int) -> str:
        env = {**os.environ, SECRET_FD_ENV: value}
        out = subprocess.run([sys.executable, "-c", wrapper], env=env, pass_fds=(fd,), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    fd = secret_pipe("w" * 64)
    try:
        assert run(secret_fd_value(fd), fd) == repr("w" * 64)
    finally:
        os.close(fd)
    other = secret_pipe("x" * 64)  # a pipe whose inode is not the one named: never read
    try:
        number, _, inode = secret_fd_value(other).partition(":")
        assert run(f"{number}:{int(inode) + 1}", other) == repr("")
    finally:
        os.close(other)


def test_a_python_started_by_the_worker_before_it_imports_cloud_elastic_leaves_it_the_secret():
    """The worker's script runs a Python child before its own ``import cloud_elastic``: the child, which inherited
    the variable but not the descriptor, copies the secret through its parent without taking it from the pipe."""
    import os
    import subprocess
    import sys

    from cloud_elastic.driver.launch.ssh_remote import secret_fd_value, secret_pipe
    from cloud_elastic.worker import settings

    fd = secret_pipe("v" * 64)  # this process plays the worker, its pipe not read yet
    child = "from cloud_elastic.worker.settings import taken_secret; print(repr(taken_secret()))"
    out = subprocess.run([sys.executable, "-c", child], env={**os.environ, settings.SECRET_FD_ENV: secret_fd_value(fd)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr("v" * 64)
    assert settings._read_pipe(secret_fd_value(fd)) == "v" * 64  # still there for the worker, which closes it
