"""The worker pods' process, deploy/kubernetes/base/start-sshd.sh, run here with a real OpenSSH
server on loopback: it is ready once sshd listens, only the driver's key logs in, sessions get the
container's environment, and SIGTERM stops new logins, passes the SIGTERM on to the workers already started
and waits for them.

The script runs as whoever runs the tests (root in CI: the pods run it as uid 1000), with its
paths pointed into a temporary directory through its settings.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .pods import SCRIPT, Pod, listening, need_sshd, wait_for


@pytest.fixture
def pod(tmp_path):
    need_sshd()
    bin_dir = tmp_path / "image-bin"
    bin_dir.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NCCL_SOCKET_IFNAME": "eth0",
           "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64", "DATA": "a b $x 'c'", "BROKEN": 'say "hi"'}
    started = Pod(tmp_path, env)
    started.bin_dir = bin_dir
    yield started
    started.stop()


def test_the_driver_key_logs_in_and_sessions_get_the_container_environment(pod):
    pod.start()
    rc, out, err = pod.run('printf "%s\\n" "$DATA" "$NCCL_SOCKET_IFNAME" "$LD_LIBRARY_PATH" "${BROKEN-unset}" "$PATH"')
    assert rc == 0, err
    data, ifname, ld_path, broken, path = out.splitlines()
    assert (data, ifname, ld_path) == ("a b $x 'c'", "eth0", "/usr/local/nvidia/lib64")
    assert str(pod.bin_dir) in path.split(":"), "the image's PATH did not reach the session"
    assert broken == "unset"
    assert "not passed to sessions (a quote, backslash or line break in the value): BROKEN" in pod.log.read_text()


def test_another_key_is_refused(pod):
    pod.start()
    rc, out, err = pod.run("true", key=pod.tmp / "stranger")
    assert rc == 255 and "Permission denied" in err, (rc, out, err)


def test_without_the_authorized_key_the_pod_fails_in_one_line(pod):
    (pod.tmp / "secret" / "authorized_keys").unlink()
    proc = subprocess.run(["/bin/sh", str(SCRIPT)], env=pod.env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "no authorized key at" in proc.stderr and "cloud-elastic-ssh" in proc.stderr


def test_sigterm_stops_logins_passes_the_sigterm_on_once_and_waits_for_the_workers_started_here(pod):
    """A deleted pod keeps its workers until they leave: the kubelet's SIGTERM closes sshd's port and
    the pod turns NotReady, each worker's wrapper gets the SIGTERM once (the worker then leaves at its
    next commit, even if the driver never saw the deletion), a restarted driver's ``--attach`` relay
    gets none (it would end), and the script exits once the last wrapper has ended, with status 0."""
    pod.start()
    release = pod.tmp / "release"
    script = pod.tmp / "wrapper.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "name = sys.argv[1]\n"
        f"signal.signal(signal.SIGTERM, lambda *_: open(os.path.join({str(pod.tmp)!r}, 'terms-' + name), 'a')"
        ".write('TERM\\n'))\n"
        f"open(os.path.join({str(pod.tmp)!r}, 'started-' + name), 'w').close()\n"
        f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.05)\n")
    # Stand for the remote wrapper the driver runs (python3 -m cloud_elastic.driver.launch.ssh_remote ...), and the relay
    # of a restarted driver (python3 -m cloud_elastic.driver.launch.ssh_remote --attach NONCE).
    worker = pod.ssh(f"exec python3 {script} worker cloud_elastic.driver.launch.ssh_remote n1 5 30 /")
    relay = pod.ssh(f"exec python3 {script} relay cloud_elastic.driver.launch.ssh_remote --attach n1")
    try:
        wait_for(lambda: (pod.tmp / "started-worker").exists() and (pod.tmp / "started-relay").exists(), 15,
                 "the worker and the relay run")
        pod.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: not listening(pod.port), 10, "sshd stops listening")
        assert not pod.ready.exists(), "still ready after SIGTERM"
        wait_for((pod.tmp / "terms-worker").exists, 10, "the SIGTERM reaches the worker's wrapper")
        time.sleep(1.5)  # more than one of the script's polls
        assert pod.proc.poll() is None, "the pod's process ended while a worker was still running"
        assert worker.poll() is None and relay.poll() is None, "a session was ended by the SIGTERM"
        assert (pod.tmp / "terms-worker").read_text() == "TERM\n", "the SIGTERM was passed on more than once"
        assert not (pod.tmp / "terms-relay").exists(), "an --attach relay got the SIGTERM"
        release.touch()
        assert worker.wait(15) == 0 and relay.wait(15) == 0
        assert pod.proc.wait(10) == 0
    finally:
        release.touch()
        worker.wait(15)
        relay.wait(15)
    assert "no worker left: exiting" in pod.log.read_text()


def test_a_port_another_process_holds_is_never_ready_and_the_pod_fails_with_sshds_error(pod):
    """Another process of the pod (a sidecar) listening on sshd's address and port: the socket that the
    script looks for is there, but it is not sshd's. The pod must not turn Ready for it (the driver would be
    refused there and blacklist the pod's slots); it exits with sshd's bind error (CI of stop 57: the script
    wrote its ready file in the moment before sshd's bind failed). The image's sshd starts a second late
    here, as on a loaded node, so that the moment is wide."""
    sshd = pod.bin_dir / "sshd"
    sshd.write_text(f"#!/bin/sh\nsleep 1\nexec {subprocess.check_output(['which', 'sshd'], text=True).strip()} \"$@\"\n")
    sshd.chmod(0o755)
    pod.env["CLOUD_ELASTIC_SSHD"] = str(sshd)
    with socket.socket() as holder:
        holder.bind((pod.address, 0))
        holder.listen()
        pod.use_port(holder.getsockname()[1])
        proc = subprocess.Popen(["/bin/sh", str(SCRIPT)], env=pod.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        pod.proc = proc
        out = proc.communicate(timeout=30)[0]
        assert proc.returncode != 0, out
        assert not (pod.tmp / "run" / "ready").exists(), f"Ready while another process held sshd's port:\n{out}"
        assert f"Bind to port {pod.port} on {pod.address} failed" in out, out


def _pod_user() -> pwd.struct_passwd:
    """The account the pods run as (uid 1000), or else another non-root one with a login shell: sshd runs and
    logs in only a user it finds by name."""
    try:
        return pwd.getpwuid(1000)
    except KeyError:
        pass
    shells = set(Path("/etc/shells").read_text().split()) if Path("/etc/shells").exists() else set()
    for entry in pwd.getpwall():
        if 1000 <= entry.pw_uid < 65534 and entry.pw_shell in shells:
            return entry
    pytest.skip("no non-root account with a login shell to run the script as")


@pytest.fixture
def pod_as_the_pods_user():
    """A pod whose script runs as a non-root user over a sshd-runtime directory as the kubelet makes an emptyDir
    with the pod's fsGroup: owned by root, the fsGroup's, mode 2777."""
    need_sshd()
    if os.geteuid() != 0:
        pytest.skip("needs root (as in CI), to own the emptyDir and to run the script as another user")
    user = _pod_user()
    tmp = Path(tempfile.mkdtemp(prefix="cloud-elastic-pod-"))  # pytest's tmp_path is closed to other users
    tmp.chmod(0o755)
    started = Pod(tmp, {**os.environ}, user=user)
    run_dir = tmp / "run"
    run_dir.mkdir()
    os.chown(run_dir, 0, user.pw_gid)
    run_dir.chmod(0o2777)
    yield started
    started.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_as_the_pods_user_over_the_kubelets_emptydir_sshd_starts_and_its_key_stays_private(pod_as_the_pods_user):
    """Review h3: the script's `chmod 700` of that directory, which its user does not own, failed, and under
    `set -e` every worker container exited 1 before sshd started (CrashLoopBackOff). Here sshd comes up, the
    driver's key logs in, the host key is in a directory only the pod's user can enter, and on SIGTERM the
    script skips a process of another user (whose environment it cannot read) without a word."""
    pod = pod_as_the_pods_user
    pod.start()
    rc, out, err = pod.run("id -u")
    assert (rc, out.strip()) == (0, str(pod.user.pw_uid)), err
    private = pod.tmp / "run" / "private"
    mode = private.lstat()
    assert stat.S_ISDIR(mode.st_mode) and mode.st_uid == pod.user.pw_uid and mode.st_mode & 0o777 == 0o700
    assert (private / "host_ed25519").stat().st_size > 0
    assert not (pod.tmp / "run" / "host_ed25519").exists(), "the host key is in the world-writable directory"
    # Another user's process that looks like a worker's wrapper: its /proc/N/environ is not the pod user's to read.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                 "cloud_elastic.driver.launch.ssh_remote"], env={"PATH": os.environ["PATH"]})
    try:
        pod.proc.send_signal(signal.SIGTERM)
        assert pod.proc.wait(15) == 0, pod.log.read_text()
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(10)
    log = pod.log.read_text()
    assert "no worker left: exiting" in log and "Permission denied" not in log, log
