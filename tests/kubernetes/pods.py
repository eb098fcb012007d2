"""A worker pod's process, deploy/kubernetes/base/start-sshd.sh, run on this machine as a pod would
run it: its own port and listen address, its authorized key in a "Secret" directory, its own
environment (the container's)."""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .manifests import DEPLOY, required

SCRIPT = DEPLOY / "base" / "start-sshd.sh"
SSHD = "/usr/sbin/sshd"


def need_sshd() -> None:
    """Skip without an OpenSSH server (fail under CI); as root, make sshd's privilege separation
    directory if it is missing, as tests/ssh does."""
    if not os.access(SSHD, os.X_OK):
        reason = f"no {SSHD} (scripts/setup-sshd.sh installs it)"
        if required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def free_port(*addresses: str) -> int:
    """A TCP port nobody uses right now on any of ``addresses`` (127.0.0.1 by default).

    Only a hint: another test's process (a Gloo pair listens on 127.0.0.x at an ephemeral port) can take it before
    sshd binds it, so :meth:`Pod.start` says so (:class:`PortTaken`) and :func:`start_on_one_port` retries."""
    addresses = addresses or ("127.0.0.1",)
    while True:
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        try:
            for address in addresses[1:]:
                with socket.socket() as s:
                    s.bind((address, port))
        except OSError:
            continue
        return port


class PortTaken(Exception):
    """A pod's sshd could not listen: another process took its port on its address first."""


def listening(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {what}")
        time.sleep(0.05)


class Pod:
    """start-sshd.sh as a pod would run it, with the given container environment; ``start()`` waits
    until it is ready, ``stop()`` kills whatever is left."""

    def __init__(self, tmp: Path, env: dict[str, str], *, key: Path | None = None, port: int | None = None,
                 address: str = "127.0.0.1", user: pwd.struct_passwd | None = None):
        """``key``: the driver's private key (made here when None; its ``.pub`` beside it is the
        authorized key). ``address``: where sshd listens (the pod IP). ``user``: run the script as this
        account (setpriv, its group as the pod's fsGroup), a copy of it from ``tmp`` as the ConfigMap mounts it;
        ``tmp`` must then be open to that user. Else as whoever runs the tests."""
        self.tmp, self.address, self.user = tmp, address, user
        self.script = SCRIPT
        if user is not None:
            self.script = Path(shutil.copy(SCRIPT, tmp / SCRIPT.name))
            self.script.chmod(0o644)
        self._own_port = port is None  # start() may move to another port while one it picked was taken
        self.key = key or tmp / "id_ed25519"
        tmp.mkdir(parents=True, exist_ok=True)
        for made in ([] if key else [self.key]) + [tmp / "stranger"]:
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(made)], check=True)
        (tmp / "secret").mkdir()
        (tmp / "secret" / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        self.log = tmp / "sshd.log"
        self.env = {**env, "CLOUD_ELASTIC_SSHD_LISTEN": address,
                    "CLOUD_ELASTIC_AUTHORIZED_KEYS": str(tmp / "secret" / "authorized_keys"),
                    "CLOUD_ELASTIC_SSHD_DIR": str(tmp / "run")}
        self.use_port(port or free_port(address))
        self.proc: subprocess.Popen | None = None

    def use_port(self, port: int) -> None:
        """Listen on ``port`` from the next :meth:`start` on."""
        self.port = port
        self.env["CLOUD_ELASTIC_SSHD_PORT"] = str(port)

    def start(self, tries: int = 5) -> "Pod":
        """Start the script and wait until it is ready. Raises :class:`PortTaken` when sshd found the port taken
        (another port, ``tries`` times in all, when the port was picked here)."""
        for _ in range(tries - 1 if self._own_port else 0):
            try:
                return self._start()
            except PortTaken:
                self.use_port(free_port(self.address))
        return self._start()

    def _start(self) -> "Pod":
        self.ready = self.tmp / "run" / "ready"
        self.ready.unlink(missing_ok=True)  # a killed earlier start's: the script removes it only once it runs
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([*self.as_user(), "/bin/sh", str(self.script)], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: self.ready.exists() or self.proc.poll() is not None, 15, "the pod is ready")
        if self.proc.poll() is not None and f"Bind to port {self.port} on {self.address} failed" in self.log.read_text():
            raise PortTaken(self.log.read_text()[-800:])
        assert self.proc.poll() is None, f"start-sshd.sh exited {self.proc.returncode}: {self.log.read_text()}"
        assert listening(self.port, self.address), "ready before sshd listens"
        return self

    def as_user(self) -> list[str]:
        """The command prefix that runs what follows as :attr:`user` (nothing without one)."""
        if self.user is None:
            return []
        uid, gid = self.user.pw_uid, self.user.pw_gid
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={gid}", "--"]

    def ssh(self, command: str, key: Path | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(
            ["ssh", "-F", "/dev/null", "-T", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             "-o", "ConnectTimeout=5", "-i", str(key or self.key), "-p", str(self.port),
             f"{self.user.pw_name if self.user else getpass.getuser()}@{self.address}", command],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, **kwargs)

    def run(self, command: str, key: Path | None = None) -> tuple[int, str, str]:
        proc = self.ssh(command, key)
        out, err = proc.communicate(timeout=30)
        return proc.returncode, out, err

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def start_on_one_port(pods: list[Pod], tries: int = 5) -> int:
    """Start ``pods`` all on one port, free on each one's address (as in a cluster, where every pod listens on
    the same port); another port, ``tries`` times in all, while one found it taken. Returns the port."""
    for _ in range(tries - 1):
        try:
            return _start_all(pods)
        except PortTaken:
            for pod in pods:
                pod.stop()
    return _start_all(pods)


def _start_all(pods: list[Pod]) -> int:
    port = free_port(*(pod.address for pod in pods))
    for pod in pods:
        pod.use_port(port)
        pod.start(tries=1)
    return port
