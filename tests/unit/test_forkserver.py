"""Which local workers the fork server may start, and which of their variables pick the server.

The forked workers themselves (real processes) are in tests/integration/test_local_launcher.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cloud_elastic.driver.launch import forkserver
from cloud_elastic.errors import ConfigError
from tests.integration.harness import process_alive as _alive

PATH = {"PATH": os.path.dirname(sys.executable)}


def test_this_python_on_a_script_or_a_module_is_forked(tmp_path):
    (tmp_path / "train.py").write_text("")
    assert forkserver.forkable([sys.executable, "train.py", "--lr", "1"], PATH, str(tmp_path)) == {
        "script": "train.py", "args": ["--lr", "1"], "unbuffered": False}
    # `python` is found on the worker's PATH, which starts with the driver's interpreter's directory.
    assert forkserver.forkable(["python", "-u", "-m", "pkg.train", "x"], PATH, str(tmp_path)) == {
        "module": "pkg.train", "args": ["x"], "unbuffered": True}


def test_anything_else_starts_from_scratch(tmp_path):
    (tmp_path / "train.py").write_text("")
    cwd = str(tmp_path)
    assert forkserver.forkable([sys.executable, "-c", "print(1)"], PATH, cwd) is None  # no script to run
    assert forkserver.forkable([sys.executable, "-X", "dev", "train.py"], PATH, cwd) is None  # an option it cannot apply
    assert forkserver.forkable([sys.executable, "missing.py"], PATH, cwd) is None
    assert forkserver.forkable(["/bin/sh", "train.py"], PATH, cwd) is None  # another program
    assert forkserver.forkable(["python", "train.py"], {"PATH": "/nonexistent"}, cwd) is None  # another python
    assert forkserver.forkable([], PATH, cwd) is None


def test_what_a_fresh_interpreter_reads_at_start_picks_the_server_and_nothing_else_does():
    env = {"PYTHONPATH": "/src", "OMP_NUM_THREADS": "1", "LD_PRELOAD": "x.so", "HOME": "/root",
           "PYTHONUNBUFFERED": "1", "CLOUD_ELASTIC_WORKER_ID": "w1", "MY_SETTING": "a", "PATH": "/bin"}
    assert dict(forkserver.startup_key(env)) == {"PYTHONPATH": "/src", "OMP_NUM_THREADS": "1",
                                                 "LD_PRELOAD": "x.so", "HOME": "/root"}
    other_worker = {**env, "CLOUD_ELASTIC_WORKER_ID": "w2", "MY_SETTING": "b", "PYTHONUNBUFFERED": ""}
    assert forkserver.startup_key(other_worker) == forkserver.startup_key(env)
    assert forkserver.startup_key({**env, "OMP_NUM_THREADS": "4"}) != forkserver.startup_key(env)


@pytest.mark.parametrize("name", ["PYTORCH_JIT", "TORCHINDUCTOR_CPP_WRAPPER", "TORCHDYNAMO_VERBOSE", "TORCH_LOGS"])
def test_torchs_own_settings_read_at_import_pick_the_server(name):
    # torch reads these as it is imported: a forked worker would keep its server's values.
    assert forkserver.startup_key({name: "1"}) == ((name, "1"),)
    assert forkserver.startup_key({name: "1"}) != forkserver.startup_key({name: "0"})


def test_the_setting_or_a_gpu_turns_it_off(tmp_path):
    assert forkserver.enabled({}, gpu_nodes=())
    assert not forkserver.enabled({"CLOUD_ELASTIC_LOCAL_FORKSERVER": "0"}, gpu_nodes=())
    assert not forkserver.enabled({"CLOUD_ELASTIC_LOCAL_FORKSERVER": "off"}, gpu_nodes=())
    (tmp_path / "nvidiactl").touch()  # a GPU's device node: forked workers have not run on a GPU yet
    assert not forkserver.enabled({}, gpu_nodes=(str(tmp_path / "nvidiactl"),))


@pytest.mark.parametrize("value", ["maybe", "O", "2"])
def test_a_setting_that_is_neither_on_nor_off_is_a_one_line_error(value):
    with pytest.raises(ConfigError, match=rf"^CLOUD_ELASTIC_LOCAL_FORKSERVER='{value}': use 1 \(fork local workers "
                                          r"when it can\) or 0 \(start each from scratch\)$"):
        forkserver.enabled({"CLOUD_ELASTIC_LOCAL_FORKSERVER": value}, gpu_nodes=())
    assert forkserver.enabled({"CLOUD_ELASTIC_LOCAL_FORKSERVER": " Yes "}, gpu_nodes=())
    assert forkserver.enabled({"CLOUD_ELASTIC_LOCAL_FORKSERVER": ""}, gpu_nodes=())  # empty is unset: the default


@pytest.mark.timeout(60)
def test_a_parent_of_servers_started_to_die_with_its_caller_ends_when_the_caller_is_killed(tmp_path):
    # The caller ends by os._exit (as pytest-timeout's thread method ends a test process): no atexit, no terminate().
    caller = subprocess.run(
        [sys.executable, "-c",
         "import os, sys\n"
         "from cloud_elastic.driver.launch import forkserver\n"
         f"proc = forkserver.start_parent({str(tmp_path / 's.sock')!r}, die_with_caller=True)\n"
         "print(proc.pid, flush=True)\n"
         "os._exit(0)\n"],
        capture_output=True, text=True, timeout=30)
    pid = int(caller.stdout.split()[0])
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the parent of servers outlived the process that started it"


