"""The remote wrapper's attach channel, without ssh: how a restarted driver takes over a remote worker.

The wrapper (``python -m cloud_elastic.driver.launch.ssh_remote``) runs a real worker
process; its stdin (the first driver's ssh connection) is closed to play the
driver's death, and ``ssh_remote --attach NONCE`` plays the restarted driver's
fresh ssh connection.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloud_elastic.driver.launch.ssh_remote import (
    GRACE_MARGIN_S,
    MODULE,
    control_path,
    marker_line,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

REPO = str(Path(__file__).resolve().parents[2])
GRACE_S = 1.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _wrapper(tmp_path: Path, nonce: str) -> tuple[subprocess.Popen, int]:
    pidfile = tmp_path / "worker.pid"
    worker = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    env = dict(os.environ, CLOUD_ELASTIC_DRIVER_GRACE_S=str(GRACE_S), PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", MODULE, nonce, "1.0", "0", str(tmp_path), sys.executable, "-c",
                             worker], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    proc.stdin.write(b"not-a-real-secret\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text() and os.path.exists(control_path(nonce))):
        assert time.monotonic() < deadline, "the wrapper did not start its worker"
        time.sleep(0.05)
    proc.stdin.close()  # the first driver is gone
    return proc, int(pidfile.read_text())


def _attach(nonce: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", MODULE, "--attach", nonce], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=REPO))


def test_an_attached_driver_keeps_the_worker_past_the_grace_and_its_loss_stops_it(tmp_path):
    nonce = secrets.token_hex(8)
    wrapper, worker = _wrapper(tmp_path, nonce)
    attach = _attach(nonce)
    try:
        ends = time.monotonic() + GRACE_S + GRACE_MARGIN_S + 2
        while time.monotonic() < ends:  # keepalives, as the restarted driver's launcher sends them
            attach.stdin.write(b"\n")
            attach.stdin.flush()
            time.sleep(1.0)
        assert _alive(worker) and wrapper.poll() is None, "the wrapper stopped an adopted worker at the old grace"
        attach.stdin.close()  # the restarted driver dies in turn: the grace starts again
        assert attach.wait(GRACE_S + GRACE_MARGIN_S + 20) == 0
        assert wrapper.wait(10) != 0 and not _alive(worker), "the worker outlived its second driver's grace"
        assert marker_line(nonce, -15, "-") in attach.stderr.read().decode(), "the worker's status was not relayed"
        assert not os.path.exists(control_path(nonce))
    finally:
        for proc in (attach, wrapper):
            if proc.poll() is None:
                proc.kill()
        if _alive(worker):
            os.kill(worker, 9)


def test_a_kill_order_through_the_attach_channel_stops_the_worker_and_reports_its_status(tmp_path):
    nonce = secrets.token_hex(8)
    wrapper, worker = _wrapper(tmp_path, nonce)
    attach = _attach(nonce)
    try:
        _, err = attach.communicate(b"\nKILL\n", timeout=30)
        assert marker_line(nonce, -9, "-") in err.decode()
        assert wrapper.wait(10) == 137 and not _alive(worker)
    finally:
        for proc in (attach, wrapper):
            if proc.poll() is None:
                proc.kill()


def test_attaching_to_a_worker_that_has_ended_says_so():
    nonce = secrets.token_hex(8)
    attach = _attach(nonce)
    _, err = attach.communicate(b"", timeout=30)
    assert attach.returncode == 1
    assert marker_line(nonce, 1, "gone") in err.decode() and "any more" in err.decode()


def test_an_attach_whose_wrapper_closes_first_still_passes_on_its_last_output_and_marker(tmp_path):
    """The worker ends and its wrapper sends its last output and marker line, then closes; the driver writes on
    the attach connection meanwhile (a keepalive). That write failing ended the attach process at once, cutting
    off what it was still passing on: a worker that had finished read as a wrapper that never started it (seen
    in CI: ``test_ssh_adopted_output``, an adopted worker with a megabyte of kept output)."""
    import socket
    import threading

    from cloud_elastic.driver.launch.ssh_output import ERR, OUT, frame

    nonce = secrets.token_hex(8)
    path = control_path(nonce)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    last = b"x" * (150 * 1024)  # more than the driver's end of the pipe holds until it reads (64 KiB)
    marker = marker_line(nonce, 0, "exit") + "\n"
    closed = threading.Event()

    def wrapper() -> None:  # a stand-in for the wrapper whose worker just ended
        conn, _ = server.accept()
        conn.sendall(frame(OUT, last) + frame(ERR, marker.encode()))
        conn.close()
        closed.set()

    threading.Thread(target=wrapper, daemon=True).start()
    try:
        proc = subprocess.Popen([sys.executable, "-m", MODULE, "--attach", nonce], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=REPO))
        assert closed.wait(20), "the attach process did not connect"
        time.sleep(0.2)
        proc.stdin.write(b"keepalive\n")  # the driver writes; the wrapper has gone
        proc.stdin.flush()
        time.sleep(0.5)  # before: the process had ended by now, the rest of its output unsent
        out, err = proc.communicate(timeout=30)
    finally:
        server.close()
        os.unlink(path)
    assert out == last, f"{len(out)} of {len(last)} bytes passed on"
    assert marker in err.decode(), err
    assert proc.returncode == 0, proc.returncode
