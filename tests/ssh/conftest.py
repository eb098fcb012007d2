"""A real OpenSSH server on loopback for the SSH tests.

The session fixture :func:`sshd` starts ``/usr/sbin/sshd -D -e`` with a config,
host key, client key and ``authorized_keys`` generated in a temporary
directory, listening on 127.0.0.1-3 (and 127.0.0.4, which refuses every key) on one free port.
Those loopback aliases play the "remote" hosts. Nothing outside the temporary
directory is touched, except that ``/run/sshd`` (sshd's privilege-separation
directory) is created when missing. ``scripts/setup-sshd.sh`` installs sshd;
where it still cannot start, the tests skip and say why.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import pytest

from cloud_elastic.config import SSHConfig
from ssh_support import HOSTS, REFUSING_HOST

SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SSHServer:
    """A running test sshd and the files to reach it."""

    port: int
    root: Path
    client_key: str
    stranger_key: str
    known_hosts: str
    config: SSHConfig

    def with_key(self, key: str) -> SSHConfig:
        """The same config with another identity file."""
        return replace(self.config, identity_file=key)

    def with_known_hosts(self, path: str) -> SSHConfig:
        """The same config checking host keys against ``path``."""
        return replace(self.config, extra_options=_client_options(path))


def _client_options(known_hosts: str) -> tuple[str, ...]:
    return (
        f"UserKnownHostsFile={known_hosts}",
        "GlobalKnownHostsFile=/dev/null",
        "StrictHostKeyChecking=yes",
    )


def free_port() -> int:
    """A TCP port nobody listens on right now, on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cloud-elastic-test", "-f", str(path)],
                   check=True, capture_output=True, timeout=30)


def _write_config(root: Path, port: int) -> Path:
    listen = "\n".join(f"ListenAddress {host}:{port}" for host in (*HOSTS, REFUSING_HOST))
    (root / "authorized_keys_none").write_text("")
    config = root / "sshd_config"
    config.write_text(f"""{listen}
HostKey {root}/host_ed25519
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin yes
StrictModes no
UsePAM no
UseDNS no
PrintMotd no
AcceptEnv none
MaxStartups 200
MaxSessions 50
LogLevel VERBOSE

Match LocalAddress {REFUSING_HOST}
    AuthorizedKeysFile {root}/authorized_keys_none
""")
    return config


def _unavailable(reason: str) -> None:
    """No sshd here: say why and skip, except in CI, which must be able to start one (./dev test installs it)."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must be able to start an sshd: {reason}", pytrace=False)
    pytest.skip(reason)


def _wait_for_banner(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _unavailable(f"sshd exited at start with {proc.returncode}: {log.read_text()[-800:]}")
        try:
            with socket.create_connection(("127.0.0.2", port), timeout=1) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    _unavailable(f"sshd did not answer on port {port} within {START_TIMEOUT_S:g}s: {log.read_text()[-800:]}")


def _prerequisites() -> str | None:
    if not os.path.isfile(SSHD):
        return f"{SSHD} is not installed (run scripts/setup-sshd.sh, or ./dev test which runs it)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"the {tool} client is not installed (apt-get install openssh-client)"
    if not os.path.isdir("/run/sshd"):
        try:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        except OSError as exc:
            return f"sshd needs its privilege separation directory /run/sshd and it cannot be created: {exc}"
    return None


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """Start a private sshd for the session; kill it at the end."""
    reason = _prerequisites()
    if reason:
        _unavailable(reason)
    root = tmp_path_factory.mktemp("sshd")
    for name in ("host_ed25519", "id_ed25519", "stranger_ed25519"):
        _keygen(root / name)
    (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())
    port = free_port()
    host_key = (root / "host_ed25519.pub").read_text().split()[:2]
    known_hosts = root / "known_hosts"
    known_hosts.write_text(",".join(f"[{h}]:{port}" for h in (*HOSTS, REFUSING_HOST)) + " " + " ".join(host_key) + "\n")
    log = root / "sshd.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(_write_config(root, port))],
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_banner(proc, port, log)
        config = SSHConfig(port=port, identity_file=str(root / "id_ed25519"), user=getpass.getuser(),
                           extra_options=_client_options(str(known_hosts)), connect_timeout_s=5)
        yield SSHServer(port, root, str(root / "id_ed25519"), str(root / "stranger_ed25519"),
                        str(known_hosts), config)
    finally:
        proc.kill()  # the listener; session children die with their connections
        proc.wait(timeout=10)


@pytest.fixture
def marker() -> str:
    """A unique string to find this test's processes by (cmdline or environ)."""
    return f"cetest-{uuid.uuid4().hex}"
