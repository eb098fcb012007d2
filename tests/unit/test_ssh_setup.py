"""An SSH worker's connection set-up without sshd: a stand-in for the ssh client shows whose turn it is."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Callable, TypeVar

import pytest

from cloud_elastic.driver.launch.api import ExitStatus, WorkerSpec
from cloud_elastic.driver.launch.ssh import SSHWorkerProcess
from cloud_elastic.driver.launch.ssh_setup import SETUP_RETRIES, HostGate, refused_before_key_exchange

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


_BANNER = "*** Authorized use only. Activity is monitored. ***"


def _ssh(*steps: str) -> str:
    """A stand-in for ssh that writes ``steps`` ("err:..." to stderr, "out:..." to stdout, "exit:N") in order."""
    body = ["import sys"]
    for step in steps:
        kind, _, text = step.partition(":")
        if kind == "exit":
            body.append(f"sys.exit({int(text)})")
        else:
            stream = "sys.stderr" if kind == "err" else "sys.stdout"
            body.append(f"{stream}.write({text + chr(10)!r}); {stream}.flush()")
    return "\n".join(body)


def _ended(script: str, nonce: str = "n1") -> tuple[ExitStatus, list[str]]:
    out: list[str] = []
    worker = _worker(HostGate(), nonce, script, out)
    worker.start()
    return _wait(worker.poll, "the worker's end"), out


def test_an_sshd_banner_is_shown_only_when_ssh_fails_before_the_connection_is_set_up():
    status, out = _ended(_ssh(f"err:{_BANNER}", "err:CLOUD_ELASTIC_STARTED n1", "out:hello from worker",
                              "err:CLOUD_ELASTIC_EXIT n1 0 -", "exit:0"))
    assert status == ExitStatus(0) and out == ["hello from worker"]
    status, out = _ended(_ssh(f"err:{_BANNER}", "err:u@10.0.0.1: Permission denied (publickey).", "exit:255"))
    assert "authentication refused (ssh said: u@10.0.0.1: Permission denied (publickey).)" in status.transport_error
    assert out == [_BANNER, "u@10.0.0.1: Permission denied (publickey)."]


@pytest.mark.parametrize("after_start, named", [
    ([], "the remote wrapper ended without reporting the worker's status (killed by a signal?)"),
    (["Timeout, server 10.0.0.1 not responding."], "connection lost: the server stopped responding (ssh said: "
                                                   "Timeout, server 10.0.0.1 not responding.)"),
])
def test_a_connection_lost_after_the_start_is_named_from_what_ssh_said_since(after_start, named):
    status, out = _ended(_ssh(f"err:{_BANNER}", "err:CLOUD_ELASTIC_STARTED n1", "out:up",
                              *[f"err:{line}" for line in after_start], "exit:255"))
    assert status.code == 255 and status.transport_error.endswith(named), status.transport_error
    assert sorted(out) == sorted(["up", *after_start])  # two pipes: their order is not kept


def test_an_older_wrapper_that_never_says_started_gives_the_turn_back_at_the_workers_output_then_soon():
    gate, out = HostGate(1), []
    # An older wrapper runs its worker without a word on stderr; the second one's worker prints nothing.
    first = _worker(gate, "n1", "import sys\nprint('the first worker runs', flush=True)\nsys.stdin.read()", out)
    silent = _worker(gate, "n2", "import sys\nsys.stdin.read()", out)
    third = _worker(gate, "n3", "print('the third ssh ran')", out)
    for worker in (first, silent, third):
        worker.start()
        _wait(lambda: worker.ssh_pid, "its ssh")  # in order: each waited for the one before to give its turn
    _wait(lambda: "the third ssh ran" in out, "the third worker's output")
    assert first.poll() is None and silent.poll() is None  # still running: only their set-ups ended
    for worker in (first, silent, third):
        worker.kill()
        _wait(worker.poll, "the end")


def test_a_changed_host_key_warning_before_the_connection_is_shown_and_a_banner_is_not() -> None:
    """ssh prints the warning and connects anyway under StrictHostKeyChecking=no: the user must still see it."""
    from cloud_elastic.driver.launch.ssh_setup import ConnectionLines

    shown: list[str] = []
    lines = ConnectionLines(shown.append)
    for line in ("*** Authorized use only ***", "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@",
                 "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @"):
        lines.add(line)
    lines.connect()
    assert shown == ["@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@",
                     "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @"]


_REFUSED = "ssh: connect to host 10.0.0.1 port 22: Connection refused"


def test_a_connection_refused_while_sshd_is_not_listening_yet_is_tried_again(tmp_path):
    """The pod's sshd is not listening yet (or restarting): nothing ran there, so trying again is safe."""
    tries = tmp_path / "tries"
    script = (f"import pathlib, sys\np = pathlib.Path({str(tries)!r})\nn = int(p.read_text() or 0) if p.exists() "
              f"else 0\np.write_text(str(n + 1))\nif n == 0:\n    sys.stderr.write({_REFUSED + chr(10)!r})\n"
              "    sys.exit(255)\n" + _ssh("err:CLOUD_ELASTIC_STARTED n1", "out:hello from worker",
                                         "err:CLOUD_ELASTIC_EXIT n1 0 -", "exit:0"))
    status, out = _ended(script)
    assert status == ExitStatus(0) and out == [_REFUSED, "hello from worker"]  # the first try's words, as ssh's
    assert tries.read_text() == "2"


def test_only_ssh_s_own_connection_refused_counts_as_refused_at_the_door():
    assert refused_before_key_exchange([_REFUSED])
    assert refused_before_key_exchange(["ssh: connect to host pod-0.train port 2222: Connection refused"])
    # The remote side's words (a worker, the wrapper) are not ssh's: it may have run.
    assert not refused_before_key_exchange(["ConnectionRefusedError: [Errno 111] Connection refused"])


def test_a_connection_refused_on_every_try_ends_in_one_line_naming_it(tmp_path, caplog):
    tries = tmp_path / "tries"
    script = f"import pathlib\npathlib.Path({str(tries)!r}).open('a').write('x')\n" + _ssh(f"err:{_REFUSED}", "exit:255")
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.driver.launch.ssh"):
        status, out = _ended(script)
    error = status.transport_error
    assert status.code == 255 and "\n" not in error, error
    assert error == ("SSH failure on u@10.0.0.1:22 (not a worker failure): host unreachable: connection refused "
                     f"(nothing listens on the ssh port: sshd not started, or restarting) (ssh said: {_REFUSED})")
    assert tries.read_text() == "x" * (SETUP_RETRIES + 1)  # bounded: the retries, then the failure
    assert caplog.text.count("was refused (sshd not listening yet, or restarting?): trying again") == SETUP_RETRIES


def test_the_launcher_holds_an_exit_until_it_has_read_the_bytes_the_wrapper_counted_before_its_marker():
    # ssh's client keeps up to its channel's window of stdout that a slow driver has not read, while the marker on
    # stderr goes past it: the wrapper's count says how much is still to come, however long the output pauses.
    import io

    from cloud_elastic.driver.launch.ssh_setup import QUIET_S, Stdout
    from cloud_elastic.driver.launch.ssh_wire import sent_line

    pipe_r, pipe_w = os.pipe()  # ssh's stdout pipe
    out = Stdout(pipe_r)
    out.idle.set()  # the reader waits in a read, all it read forwarded
    os.write(pipe_w, b"x")
    assert out.behind(0.0, alive=True)  # a byte in the pipe
    os.read(pipe_r, 1)
    assert not out.heard(sent_line("other", 5), "n")  # another launch's line, a forged nonce
    assert not out.heard("CLOUD_ELASTIC_SENT n -5", "n") and not out.heard("CLOUD_ELASTIC_SENT n \u0661\u0662", "n")
    assert not out.heard("CLOUD_ELASTIC_EXIT n 0 -", "n") and out.sent is None
    out.read_at = 100.0
    assert out.behind(100.0 + QUIET_S / 2, alive=True)  # an older wrapper, which counts none: a quiet spell
    assert not out.behind(100.0 + 2 * QUIET_S, alive=True)

    assert out.heard(sent_line("n", 12), "n") and out.sent == 12
    stream = out.stream(io.BufferedReader(io.BytesIO(b"first line\nsecond\n")))
    assert stream.read1(11) == b"first line\n" and out.read == 11
    assert out.behind(1e9, alive=True)  # one byte still in ssh, however long since the last line
    assert not out.behind(1e9, alive=False)  # the reader ended (ssh's stdout closed): nothing more will come
    assert stream.read1(100) == b"second\n" and out.read == 18
    assert out.behind(1e9, alive=True)  # all read, the last chunk not yet forwarded: the end waits for it
    out.idle.set()  # forwarded, the reader back in a read
    assert not out.behind(1e9, alive=True)  # more than counted (a login shell's own line): told, not held
    os.close(pipe_r)
    os.close(pipe_w)
