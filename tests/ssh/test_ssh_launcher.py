"""SSHLauncher through a real sshd on loopback (127.0.0.2/3 play the remote hosts)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from cloud_elastic.driver.launch.ssh import SECRET_ENV, SSHLauncher
from ssh_support import (
    REFUSING_HOST, UNREACHABLE_HOST, Output, processes_with, spec, start, wait_exit, wait_gone, wait_until,
)

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(60)]

REMOTE = "127.0.0.2"


@pytest.fixture
def launcher(sshd) -> Iterator[SSHLauncher]:
    # What users' ssh configs often say (distributions send the locale; bastion users share connections).
    options = ("SendEnv=LANG LC_*", "ControlMaster=auto", "ControlPath=/tmp/cetest-%C", "ControlPersist=no")
    config = dataclasses.replace(sshd.config, extra_options=sshd.config.extra_options + options)
    launcher = SSHLauncher(config, disconnect_grace_s=2.0)
    yield launcher
    launcher.close()


def _ready(out: Output) -> tuple[int, int]:
    _, worker, child = out.wait_for("ready ").split()
    return int(worker), int(child)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_output_env_cwd_and_secret(launcher, marker, tmp_path, monkeypatch):
    monkeypatch.setenv("LC_MY_DB_PASSWORD", marker)  # the driver's own: ssh_config's "SendEnv LC_*" must not send it
    secret = "job-secret-" + marker
    tricky = "a b 'c' \"d\" $HOME `x` \\ ; end"
    wrapper_tmp = tmp_path / "wrapper-tmp"  # -x TMPDIR: the wrapper's own socket goes there too (it did not, once)
    wrapper_tmp.mkdir()
    proc, out = start(launcher, REMOTE, marker, "report",
                      env={"CLOUD_ELASTIC_JOB": "j1", "TRICKY": tricky, "TMPDIR": str(wrapper_tmp)},
                      secret=secret, cwd=str(tmp_path))
    status = wait_exit(proc)
    assert (status.code, status.transport_error) == (0, None)
    report = json.loads(out.wait_for("{"))
    assert report["cwd"] == str(tmp_path)
    assert report["env"]["CLOUD_ELASTIC_JOB"] == "j1"
    assert report["env"]["TRICKY"] == tricky
    assert "LC_MY_DB_PASSWORD" not in report["env"]
    assert report["secret"] == secret  # through the descriptor the wrapper passed, not the environment
    assert SECRET_ENV not in report["env"] and not report["secret_in_proc_environ"]
    assert report["env"]["SSH_CONNECTION"].split()[2] == REMOTE  # really went through sshd
    assert report["env"]["PATH"].split(":")[0] == os.path.dirname(sys.executable)
    assert os.path.dirname(report["executable"]) == os.path.dirname(sys.executable)
    assert report["pgid"] == report["pid"] == report["sid"], "worker must lead its own session and group"
    assert not any(line.startswith("CLOUD_ELASTIC_EXIT") for line in out.lines)
    assert [p.name for p in wrapper_tmp.iterdir()] == [f"cloud-elastic-{os.getuid()}"]


def test_secret_is_on_stdin_never_on_a_command_line_nor_in_an_environment(launcher, marker):
    secret = "never-in-argv-" + marker
    token = "hf_never_in_argv_" + marker + "b" * 100_000  # more than ssh's stdin pipe holds: the rest follows
    proc, out = start(launcher, REMOTE, marker, "sleep", secret=secret, env={"HF_TOKEN": token})
    worker, child = _ready(out)
    # Neither on a command line nor in any /proc/PID/environ (the wrapper's, the worker's, its child's), which
    # every process of the user can read for the worker's life.
    assert processes_with(secret) == [], "the secret is on a command line or in an environment"
    # A variable's value (-x) is in the worker's environment, on no command line (the local ssh's included).
    assert processes_with(token, cmdline_only=True) == [], "a forwarded variable is on a command line"
    with open(f"/proc/{worker}/environ", "rb") as f:
        assert f"HF_TOKEN={token}".encode() in f.read().split(b"\0")
    found = processes_with(marker)
    assert {p.pid for p in found} >= {worker, child, proc.ssh_pid}, f"expected {worker}, {child}, ssh: {found}"
    proc.terminate(2.0)
    wait_gone(marker, 10)


def test_output_is_forwarded_line_by_line(launcher, marker):
    proc, out = start(launcher, REMOTE, marker, "lines", "500")
    assert wait_exit(proc).code == 0
    # Every line, in order. Not necessarily all before the exit is told: it waits for the output at most 2 s after
    # the last line read (a clean-clone run on two busy cores had 499 then); the tests below hold it to the order.
    deadline = time.monotonic() + 10
    while sum(line.startswith("line ") for line in out.lines) < 500 and time.monotonic() < deadline:
        time.sleep(0.05)  # past it, the comparison below shows which lines came
    assert [line for line in out.lines if line.startswith("line ")] == [f"line {i}" for i in range(500)]


@pytest.mark.parametrize("code", [0, 3, 127, 255])
def test_worker_exit_code_passes_through(launcher, marker, code):
    proc, _ = start(launcher, REMOTE, marker, "exit", str(code))
    status = wait_exit(proc)
    assert (status.code, status.transport_error) == (code, None)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_worker_signal_death_passes_through(launcher, marker, sig):
    proc, _ = start(launcher, REMOTE, marker, "signal", str(int(sig)))
    status = wait_exit(proc)
    assert (status.code, status.transport_error) == (-sig, None)
    assert status.describe == f"killed by signal {int(sig)}"


def test_a_worker_killed_while_a_child_it_left_holds_its_output_is_told_ended_with_its_last_words(sshd, marker):
    """fixS: a worker killed with SIGKILL (the OOM killer, kill -9) whose child still held its output, and would
    not die of the wrapper's TERM (or had left its group), was told ended only once the wrapper had stopped that
    child (the grace, 5 s) or its pipe's wait ran out (5 s): past the driver's heartbeat timeout, so it was judged
    "stopped answering heartbeats", and the survivors stood idle that long. Its end is told once what it wrote is
    forwarded, its last line first; the wrapper stops the child after. The grace is raised so that waiting for that
    stop would fail the test rather than pass after it."""
    with SSHLauncher(sshd.config, disconnect_grace_s=600.0) as launcher:
        proc, out = start(launcher, REMOTE, marker, "die-leaving-child")
        try:
            status = wait_exit(proc, 30)
            lines = list(out.lines)  # what the driver judges the end with
            worker, child = _ready(out)
            assert (status.code, status.transport_error) == (-signal.SIGKILL, None), status
            assert lines[-1] == "RuntimeError: the worker's last words", lines
            assert child in {p.pid for p in processes_with(marker)}, "the child was gone: nothing held the output"
            assert worker not in {p.pid for p in processes_with(marker)}
        finally:  # the wrapper waits to KILL the child after the grace: end it here, and the wrapper ends too
            for left in processes_with(marker, cmdline_only=True):
                if "SIG_IGN" in left.cmdline:
                    os.kill(left.pid, signal.SIGKILL)
        wait_gone(marker, 10)


def test_a_worker_that_dies_after_a_burst_is_told_after_its_last_line_behind_a_slow_driver_output(sshd, marker):
    """1.5 MB printed just before the worker dies, to a driver whose output takes 0.2 ms a line (a terminal over a slow
    link, a log shipper): ssh still holds much of it when the wrapper's marker comes; the exit is told only once its
    last line is in, which the job's end line names (review rvQ: told 2 s after the marker, half the lines in)."""
    class Slow(Output):
        def __call__(self, line: str) -> None:
            time.sleep(0.0002)
            super().__call__(line)

    out = Slow()
    with SSHLauncher(sshd.config, disconnect_grace_s=5.0) as launcher:
        proc = launcher.launch(spec(REMOTE, marker, "burst", "1500000"), out)
        status = wait_exit(proc, 120)
        lines = list(out.lines)
    assert (status.code, status.transport_error) == (1, None), status
    assert len(lines) == 15001 and lines[-1] == "RuntimeError: the worker's last words", (len(lines), lines[-1:])
    wait_gone(marker, 20)


def test_a_burst_behind_a_slow_driver_output_is_all_shown_before_the_exit_even_when_ssh_stalls(sshd, marker):
    """The burst above, with the driver's ssh client stopped for 0.6 s once 5,000 lines are in (long after the
    wrapper's marker came): on a loaded driver machine ssh is not scheduled for a while, the pipe runs dry and no
    line comes. The exit still waits for the bytes the wrapper counted before its marker (ssh_wire.SENT); a
    quiet spell of 50 ms was taken for the end before (a clean clone under load: told 591 lines early)."""
    class Stalling(Output):
        proc = None

        def __call__(self, line: str) -> None:
            time.sleep(0.0002)
            super().__call__(line)
            if len(self.lines) == 5000:
                pid = self.proc.ssh_pid
                os.kill(pid, signal.SIGSTOP)
                threading.Timer(0.6, os.kill, (pid, signal.SIGCONT)).start()

    out = Stalling()
    with SSHLauncher(sshd.config, disconnect_grace_s=5.0) as launcher:
        out.proc = launcher.launch(spec(REMOTE, marker, "burst", "1500000"), out)
        status = wait_exit(out.proc, 120)
        lines = list(out.lines)
    assert (status.code, status.transport_error) == (1, None), status
    assert len(lines) == 15001 and lines[-1] == "RuntimeError: the worker's last words", (len(lines), lines[-1:])
    wait_gone(marker, 20)


def test_missing_working_directory_is_reported(launcher, marker):
    proc, out = start(launcher, REMOTE, marker, "report", cwd="/nonexistent/" + marker)
    status = wait_exit(proc)
    assert (status.code, status.transport_error) == (127, None)
    assert any("does not exist" in line for line in out.lines)


def test_terminate_stops_the_whole_group(launcher, marker):
    proc, out = start(launcher, REMOTE, marker, "sleep")
    _ready(out)
    neighbour = marker.replace("cetest-", "cetest-neighbour-")
    other, other_out = start(launcher, REMOTE, neighbour, "sleep")  # on the same host, under the user's ControlMaster
    _ready(other_out)
    began = time.monotonic()
    proc.terminate(5.0)
    assert time.monotonic() - began < 5.0
    assert wait_exit(proc, 5).code == -signal.SIGTERM
    wait_gone(marker, 5)
    assert other.poll() is None and len(processes_with(neighbour)) >= 3, "stopping a worker stopped its neighbour"
    other.kill()
    wait_gone(neighbour, 5)
    proc.terminate(1.0)  # idempotent
    proc.kill()


def test_terminate_escalates_to_kill_after_grace(launcher, marker):
    proc, out = start(launcher, REMOTE, marker, "sleep", "--ignore-term")
    _ready(out)
    began = time.monotonic()
    proc.terminate(1.0)
    assert time.monotonic() - began < 4.0
    wait_gone(marker, 5)
    assert wait_exit(proc, 5).code == -signal.SIGKILL


def test_kill_is_immediate(launcher, marker):
    proc, out = start(launcher, REMOTE, marker, "sleep", "--ignore-term")
    _ready(out)
    began = time.monotonic()
    proc.kill()
    assert time.monotonic() - began < 2.0
    wait_gone(marker, 3)
    assert wait_exit(proc, 5).code == -signal.SIGKILL
    proc.kill()


def test_local_ssh_killed_leaves_no_remote_process(launcher, marker):
    proc, out = start(launcher, REMOTE, marker, "sleep", "--ignore-term")
    _ready(out)
    os.kill(proc.ssh_pid, signal.SIGKILL)
    wait_gone(marker, 10)  # TERM, then KILL after disconnect_grace_s=2
    status = wait_exit(proc, 5)
    assert status.transport_error and "killed by signal 9" in status.transport_error


def test_connection_dropped_by_server_leaves_no_process(launcher, marker):
    proc, out = start(launcher, REMOTE, marker, "sleep")
    worker, _ = _ready(out)
    wrapper = _parent(worker)
    session = _parent(wrapper)  # the per-connection "sshd: user@notty" process
    with open(f"/proc/{session}/cmdline", "rb") as f:
        assert f.read().startswith(b"sshd"), "expected the sshd session process"
    os.kill(session, signal.SIGKILL)
    wait_gone(marker, 10)
    status = wait_exit(proc, 10)
    assert status.transport_error and "connection lost" in status.transport_error
    assert f"{REMOTE}:" in status.transport_error and "not a worker failure" in status.transport_error


@pytest.mark.parametrize("closing", [False, True], ids=["driver-lives", "driver-closes"])
def test_a_connection_dropped_by_the_server_under_a_driver_grace_is_stopped_through_a_new_one(sshd, marker, closing):
    """Under ``--driver-grace`` the wrapper reads end of file as its driver gone and keeps the worker for the grace;
    a review killed the session's sshd process with the driver alive: a plain command ran 75 s past its job's end,
    an old worker beside its replacement. The launcher reaches the wrapper again and orders KILL, within its
    keepalive interval, or at once when it closes (the job ended on that failure)."""
    launcher = SSHLauncher(sshd.config, keepalive_interval_s=0.5, disconnect_grace_s=1.0)
    try:
        proc, out = start(launcher, REMOTE, marker, "sleep", env={"CLOUD_ELASTIC_DRIVER_GRACE_S": "60"})
        worker, _ = _ready(out)
        os.kill(_parent(_parent(worker)), signal.SIGKILL)  # the per-connection "sshd: user@notty" process
        status = wait_exit(proc, 10)
        assert status.transport_error and "connection lost" in status.transport_error
        if closing:
            launcher.close()
        wait_gone(marker, 30)  # not the grace's 60 s (a new connection under a loaded suite took over 15 s)
    finally:
        launcher.close()


@pytest.mark.timeout(120)  # a start, a connection lost (10 s), a close (30 s), the worker gone (20 s), under load
def test_an_orphan_reached_again_over_a_slow_connection_still_gets_its_kill(sshd, marker, tmp_path):
    """The KILL for a worker whose connection dropped waits for the new connection to reach its wrapper: written
    as soon as the local ssh ran, it waited in ssh's stdin while the connection set up, and the launcher's
    ``kill_wait_s`` (1 s) then cut the client before it arrived; the worker kept its 60 s grace (a clean-clone run
    of the suite, where a connection took over 15 s). The close waits for it as long as the connection may take.
    The first new connection outlasts ssh's ConnectTimeout, as one on a loaded machine may: it is tried again (a
    clean clone of the suite saw the worker outlive this test's wait once, with one try)."""
    slow = tmp_path / "slow"
    proxy = f"ProxyCommand={sys.executable} {Path(__file__).with_name('slow_proxy.py')} %h %p {slow}"
    config = dataclasses.replace(sshd.config, extra_options=(*sshd.config.extra_options, proxy))
    launcher = SSHLauncher(config, keepalive_interval_s=0.5, disconnect_grace_s=1.0)
    try:
        proc, out = start(launcher, REMOTE, marker, "sleep", env={"CLOUD_ELASTIC_DRIVER_GRACE_S": "60"})
        worker, _ = _ready(out)
        slow.write_text("8,3")  # the next connection outlasts ssh's ConnectTimeout (5 s); each one after takes 3 s
        os.kill(_parent(_parent(worker)), signal.SIGKILL)  # the per-connection "sshd: user@notty" process
        status = wait_exit(proc, 10)
        assert status.transport_error and "connection lost" in status.transport_error
        launcher.close()  # waits for the KILL under way, up to 30 s
        wait_gone(marker, 20)  # before the fixes: the worker ran on for the grace's 60 s
        assert slow.read_text() == "3", "the failing connection was never tried"
    finally:
        launcher.close()


def test_a_server_that_stops_responding_is_named(sshd, marker):
    options = (*sshd.config.extra_options, "ServerAliveInterval=1", "ServerAliveCountMax=2")
    launcher = SSHLauncher(dataclasses.replace(sshd.config, extra_options=options), disconnect_grace_s=1.0)
    try:
        proc, out = start(launcher, REMOTE, marker, "sleep")
        worker, _ = _ready(out)
        session = _parent(_parent(worker))  # the per-connection "sshd: user@notty" process
        os.kill(session, signal.SIGSTOP)  # the host hangs: the connection stays open and says nothing
        try:
            status = wait_exit(proc, 20)
        finally:
            os.kill(session, signal.SIGCONT)
        assert status.transport_error and "connection lost: the server stopped responding" in status.transport_error
        assert "not responding" in status.transport_error  # ssh's own words, quoted
        wait_gone(marker, 10)
    finally:
        launcher.close()


def test_silent_connection_is_caught_by_the_keepalive(sshd, marker):
    launcher = SSHLauncher(sshd.config, keepalive_interval_s=0.3, keepalive_timeout_s=2.0, disconnect_grace_s=1.0)
    try:
        proc, out = start(launcher, REMOTE, marker, "sleep")
        worker, child = _ready(out)
        time.sleep(1.5)  # keepalives flow: nothing happens
        assert {worker, child} <= {p.pid for p in processes_with(marker)}
        os.kill(proc.ssh_pid, signal.SIGSTOP)  # the connection stays open but goes silent
        try:
            wait_until(lambda: not ({worker, child} & {p.pid for p in processes_with(marker)}), 10,
                       "the remote watchdog to stop the silent worker")
        finally:
            os.kill(proc.ssh_pid, signal.SIGCONT)
        status = wait_exit(proc, 10)
        assert status.transport_error and "went silent" in status.transport_error
        wait_gone(marker, 5)
    finally:
        launcher.close()


def test_close_stops_workers_still_running(sshd, marker):
    launcher = SSHLauncher(sshd.config, disconnect_grace_s=1.0)
    proc, out = start(launcher, REMOTE, marker, "sleep")
    _ready(out)
    launcher.close()
    wait_gone(marker, 10)
    assert wait_exit(proc, 5).code == -signal.SIGTERM


def test_two_hosts_in_parallel(launcher, marker):
    started = [start(launcher, host, marker, "report") for host in ("127.0.0.2", "127.0.0.3")]
    reports = [json.loads(out.wait_for("{")) for _, out in started]
    assert [r["env"]["SSH_CONNECTION"].split()[2] for r in reports] == ["127.0.0.2", "127.0.0.3"]
    assert [wait_exit(p).code for p, _ in started] == [0, 0]


# --- SSH failures: told apart from worker failures -------------------------------


def _transport_error(launcher: SSHLauncher, host: str, marker: str) -> str:
    proc, out = start(launcher, host, marker, "report")
    status = wait_exit(proc, 30)
    assert status.code == 255
    assert status.transport_error, f"expected an SSH failure, got {status} with output {out.lines}"
    assert "SSH failure on" in status.transport_error and "not a worker failure" in status.transport_error
    assert host in status.transport_error
    assert "\n" not in status.transport_error
    assert not any(line.startswith("{") for line in out.lines), "the worker must not have run"
    return status.transport_error


def test_unreachable_host(launcher, marker):
    message = _transport_error(launcher, UNREACHABLE_HOST, marker)
    assert "host unreachable: connection refused" in message


def test_refused_key(sshd, marker):
    launcher = SSHLauncher(sshd.with_key(sshd.stranger_key))
    message = _transport_error(launcher, REMOTE, marker)
    assert "authentication refused" in message and "Permission denied" in message
    launcher.close()


def test_host_key_mismatch(sshd, marker, tmp_path):
    wrong = tmp_path / "known_hosts"
    stranger = open(sshd.stranger_key + ".pub").read().split()[:2]
    wrong.write_text(f"[{REMOTE}]:{sshd.port} {' '.join(stranger)}\n")
    launcher = SSHLauncher(sshd.with_known_hosts(str(wrong)))
    message = _transport_error(launcher, REMOTE, marker)
    assert "host key" in message
    launcher.close()


def test_host_that_refuses_every_key(launcher, marker):
    message = _transport_error(launcher, REFUSING_HOST, marker)
    assert "authentication refused" in message


def test_server_that_never_answers_times_out(sshd, marker):
    with socket.socket() as silent:  # accepts TCP (backlog) but never speaks SSH
        silent.bind(("127.0.0.5", 0))
        silent.listen(8)
        config = dataclasses.replace(sshd.config, port=silent.getsockname()[1], connect_timeout_s=1)
        launcher = SSHLauncher(config)
        began = time.monotonic()
        message = _transport_error(launcher, "127.0.0.5", marker)
        assert "timed out" in message
        assert time.monotonic() - began < 15
        launcher.close()


def test_output_callback_errors_do_not_block_the_worker(launcher, marker):
    lines: list[str] = []
    lock = threading.Lock()

    def flaky(line: str) -> None:
        with lock:
            lines.append(line)
        if len(lines) % 2:
            raise RuntimeError("sink broke")

    proc = launcher.launch(spec(REMOTE, marker, "lines", "300"), flaky)
    assert wait_exit(proc).code == 0
    # Every line reaches the sink. Not necessarily before the exit is told: each failed line logs a traceback, and
    # the exit waits for the output at most 2 s after the last line read (a loaded clean-clone run had 299 then).
    wait_until(lambda: len([line for line in lines if line.startswith("line ")]) == 300, 10, "all 300 lines")
    assert len([line for line in lines if line.startswith("line ")]) == 300


def test_worker_leader_dies_with_a_killed_wrapper(launcher, marker):
    proc, out = start(launcher, REMOTE, marker, "sleep", "--ignore-term")
    worker, child = _ready(out)
    os.kill(_parent(worker), signal.SIGKILL)  # the remote wrapper itself, e.g. by the OOM killer
    wait_until(lambda: worker not in {p.pid for p in processes_with(marker)}, 5, "the worker leader to die")
    # Its own children are then on their own (torch's DataLoader workers watch their parent);
    # clean up this one by hand.
    os.kill(child, signal.SIGKILL)
    wait_gone(marker, 5)
    status = wait_exit(proc, 5)
    assert status.transport_error and "without reporting the worker's status" in status.transport_error


# --- Stopping never blocks the caller (the driver's loop thread) -----------------


def test_kill_returns_before_the_worker_has_ended(sshd, marker):
    """Three workers whose ssh clients are stalled: kill() returns at once for each, the ends come later."""
    with SSHLauncher(sshd.config, disconnect_grace_s=1.0, kill_wait_s=600.0) as launcher:
        started = [start(launcher, host, marker, "sleep", "--ignore-term") for host in ("127.0.0.2", "127.0.0.3") * 2]
        workers = [_ready(out) for _, out in started]
        procs = [proc for proc, _ in started]
        for proc in procs:  # ssh stops reading: a KILL order cannot reach the remote side yet
            os.kill(proc.ssh_pid, signal.SIGSTOP)
        try:
            for proc in procs:
                proc.kill()
            # Each kill() came back without waiting for its worker: none has ended, every worker still runs.
            assert [proc.poll() for proc in procs] == [None] * len(procs)
            assert {pid for pair in workers for pid in pair} <= {p.pid for p in processes_with(marker)}
        finally:
            for proc in procs:
                os.kill(proc.ssh_pid, signal.SIGCONT)
        # The orders were waiting in ssh's stdin: the remote groups are killed (TERM is ignored, so KILL it was).
        assert [wait_exit(proc, 15).code for proc in procs] == [-signal.SIGKILL] * len(procs)
        wait_gone(marker, 10)
        for proc in procs:
            proc.kill()  # idempotent after the end


def test_kill_ends_a_stuck_ssh_client_after_the_wait(sshd, marker):
    """ssh never forwards the order: the launcher's own thread kills it; the dropped connection stops the worker."""
    with SSHLauncher(sshd.config, disconnect_grace_s=1.0, kill_wait_s=0.5) as launcher:
        proc, out = start(launcher, REMOTE, marker, "sleep", "--ignore-term")
        _ready(out)
        os.kill(proc.ssh_pid, signal.SIGSTOP)  # stays stopped: only SIGKILL can end it
        proc.kill()
        status = wait_exit(proc, 15)
        assert (status.code, status.transport_error) == (-signal.SIGKILL, None)  # we stopped it: not an SSH failure
        wait_gone(marker, 15)  # sshd saw the connection close; the watchdog TERMed, then KILLed the group
