"""An SSH worker's connection set-up without sshd: a stand-in for the ssh client shows whose turn it is."""

from __future__ import annotations

import signal
import sys
import time
from typing import Callable, TypeVar

import pytest

from cloud_elastic.driver.launch.api import ExitStatus, WorkerSpec
from cloud_elastic.driver.launch.ssh import SSHWorkerProcess
from cloud_elastic.driver.launch.ssh_setup import HostGate, refused_before_key_exchange

pytestmark = pytest.mark.timeout(30)

T = TypeVar("T")


def _wait(predicate: Callable[[], T], what: str, timeout_s: float = 15.0) -> T:
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def _worker(gate: HostGate, nonce: str, script: str, out: list[str]) -> SSHWorkerProcess:
    """A worker whose "ssh" is ``python -c script`` (it gets the secret line on stdin, as ssh would)."""
    spec = WorkerSpec(worker_id=f"w-{nonce}", host="10.0.0.1", slot=0, command=("train",), env={}, secret="s",
                      cwd="/")
    return SSHWorkerProcess(spec, [sys.executable, "-c", script], nonce, out.append, "u@10.0.0.1:22", 0.0,
                            kill_wait_s=0.2, gate=gate)


def test_past_the_hosts_limit_a_worker_waits_and_one_stopped_while_waiting_never_starts():
    gate, out = HostGate(1), []
    silent = _worker(gate, "n1", "import sys; sys.stdin.read()", out)  # never says it started: keeps the turn
    queued = _worker(gate, "n2", "print('the second ssh ran')", out)
    silent.start()
    _wait(lambda: silent.ssh_pid, "the first ssh")
    queued.start()
    queued.kill()
    assert _wait(queued.poll, "the queued worker's end") == ExitStatus(-signal.SIGKILL)
    assert queued.ssh_pid is None and out == []
    silent.kill()
    _wait(silent.poll, "the first worker's end")


def test_the_hosts_turn_passes_on_once_the_remote_wrapper_says_the_worker_runs():
    gate, out = HostGate(1), []
    first = _worker(gate, "n1", "import sys\nsys.stderr.write('CLOUD_ELASTIC_STARTED n1\\n')\nsys.stderr.flush()\n"
                                "sys.stdin.read()", out)
    second = _worker(gate, "n2", "print('the second ssh ran')", out)
    first.start()
    second.start()
    _wait(lambda: "the second ssh ran" in out, "the second worker's turn")
    assert first.poll() is None  # still running: its set-up ended when the wrapper spoke
    assert "CLOUD_ELASTIC_STARTED n1" not in out
    first.kill()
    _wait(first.poll, "the first worker's end")
    _wait(second.poll, "the second worker's end")


def test_only_a_connection_dropped_before_key_exchange_counts_as_refused_at_the_door():
    assert refused_before_key_exchange(["kex_exchange_identification: read: Connection reset by peer"])
    assert refused_before_key_exchange(["kex_exchange_identification: Connection closed by remote host"])
    assert not refused_before_key_exchange(["Connection reset by 10.0.0.1 port 22"])  # the worker may have run
    assert not refused_before_key_exchange(["u@10.0.0.1: Permission denied (publickey)."])
