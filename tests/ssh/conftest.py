"""A real OpenSSH server on loopback for the SSH tests.

The session fixture :func:`sshd` starts ``/usr/sbin/sshd -D -e`` with a config,
host key, client key and ``authorized_keys`` generated in a temporary
directory, listening on 127.0.0.1-3 (and 127.0.0.4, which refuses every key) on one free port.
Those loopback aliases play the "remote" hosts. The fixture
:func:`recycled_address` runs a second sshd on 127.0.0.6 that a test restarts
with a new host key, as a cloud gives a replaced instance's private IP to a
new one. Nothing outside the temporary
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
from ssh_support import HOSTS, RECYCLED_ADDRESS, REFUSING_HOST

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


def free_port(*hosts: str) -> int:
    """A TCP port nobody uses right now on any of ``hosts`` (127.0.0.1 by default).

    Only a hint: another test's process (a Gloo pair listens on 127.0.0.2 or .3 at an ephemeral port) can take it
    before sshd binds it, so :func:`start_sshd` checks every address and :func:`start_sshd_on_free_port` retries.
    """
    hosts = hosts or ("127.0.0.1",)
    while True:
        with socket.socket() as sock:
            sock.bind((hosts[0], 0))
            port = sock.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port


def keygen(path: Path) -> None:
    """A new ed25519 key pair at ``path`` and ``path.pub``."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cloud-elastic-test", "-f", str(path)],
                   check=True, capture_output=True, timeout=30)


def _write_config(root: Path, port: int, host_key: Path, hosts: tuple[str, ...], name: str,
                  max_startups: str = "200") -> Path:
    listen = "\n".join(f"ListenAddress {host}:{port}" for host in hosts)
    (root / "authorized_keys_none").write_text("")
    config = root / f"{name}_config"
    config.write_text(f"""{listen}
HostKey {host_key}
PidFile {root}/{name}.pid
AuthorizedKeysFile {root}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin yes
StrictModes no
UsePAM no
UseDNS no
PrintMotd no
# As Debian's and Ubuntu's sshd: the driver's own locale variables must still not reach workers.
AcceptEnv LANG LC_*
MaxStartups {max_startups}
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


class PortTaken(Exception):
    """sshd could not listen on one of its addresses: another process took the port there first."""


def _wait_for_banner(proc: subprocess.Popen[bytes], hosts: tuple[str, ...], port: int, log: Path) -> None:
    """Until sshd greets on every one of ``hosts``: sshd that fails to bind one address still serves the others,
    and tests would then see "connection refused" from that "host" for the whole session (CI of stop 56)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    pending = list(hosts)
    while pending and time.monotonic() < deadline:
        if proc.poll() is not None:
            if f"Bind to port {port} on" in log.read_text():
                raise PortTaken(log.read_text()[-800:])
            _unavailable(f"sshd exited at start with {proc.returncode}: {log.read_text()[-800:]}")
        try:
            with socket.create_connection((pending[0], port), timeout=1) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    pending.pop(0)
                    continue
        except OSError:
            pass
        if f"Bind to port {port} on" in log.read_text():
            raise PortTaken(log.read_text()[-800:])
        time.sleep(0.05)
    if pending:
        _unavailable(f"sshd did not answer on {pending[0]}:{port} within {START_TIMEOUT_S:g}s: "
                     f"{log.read_text()[-800:]}")


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


def start_sshd(root: Path, port: int, host_key: Path, hosts: tuple[str, ...], name: str = "sshd",
               max_startups: str = "200") -> subprocess.Popen[bytes]:
    """Start ``sshd -D`` with ``host_key`` on ``hosts:port`` (keys and authorized_keys in ``root``); wait for it."""
    log = root / f"{name}.log"
    config = _write_config(root, port, host_key, hosts, name, max_startups)
    with open(log, "ab") as log_file:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_banner(proc, hosts, port, log)
    except BaseException:
        stop_sshd(proc)
        raise
    return proc


def start_sshd_on_free_port(root: Path, host_key: Path, hosts: tuple[str, ...], name: str = "sshd",
                            max_startups: str = "200", tries: int = 5) -> tuple[subprocess.Popen[bytes], int]:
    """:func:`start_sshd` on a port free on every one of ``hosts``, another port while one was taken meanwhile."""
    for _ in range(tries - 1):
        port = free_port(*hosts)
        try:
            return start_sshd(root, port, host_key, hosts, name=f"{name}-{port}", max_startups=max_startups), port
        except PortTaken:
            continue
    port = free_port(*hosts)
    try:
        return start_sshd(root, port, host_key, hosts, name=f"{name}-{port}", max_startups=max_startups), port
    except PortTaken as exc:
        _unavailable(f"sshd found its port taken on one of {hosts} {tries} times: {exc}")
        raise


def stop_sshd(proc: subprocess.Popen[bytes]) -> None:
    """Kill the listener; session children die with their connections."""
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """Start a private sshd for the session; kill it at the end."""
    reason = _prerequisites()
    if reason:
        _unavailable(reason)
    root = tmp_path_factory.mktemp("sshd")
    for name in ("host_ed25519", "id_ed25519", "stranger_ed25519"):
        keygen(root / name)
    (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())
    proc, port = start_sshd_on_free_port(root, root / "host_ed25519", (*HOSTS, REFUSING_HOST))
    host_key = (root / "host_ed25519.pub").read_text().split()[:2]
    known_hosts = root / "known_hosts"
    known_hosts.write_text(",".join(f"[{h}]:{port}" for h in (*HOSTS, REFUSING_HOST)) + " " + " ".join(host_key) + "\n")
    try:
        config = SSHConfig(port=port, identity_file=str(root / "id_ed25519"), user=getpass.getuser(),
                           extra_options=_client_options(str(known_hosts)), connect_timeout_s=5)
        yield SSHServer(port, root, str(root / "id_ed25519"), str(root / "stranger_ed25519"),
                        str(known_hosts), config)
    finally:
        stop_sshd(proc)


class RecycledAddress:
    """One address:port whose sshd can be restarted with another host key."""

    def __init__(self, root: Path, port: int, keys: Path) -> None:
        self.root, self.port, self._keys = root, port, keys
        self._name = f"recycled-{uuid.uuid4().hex[:8]}"
        self._proc: subprocess.Popen[bytes] | None = None

    def serve(self, key: str) -> str:
        """(Re)start the sshd with host key ``key`` (generated on first use); return the public key's base64."""
        self.stop()
        path = self._keys / key
        if not path.exists():
            keygen(path)
        self._proc = start_sshd(self.root, self.port, path, (RECYCLED_ADDRESS,), name=self._name)
        return path.with_suffix(".pub").read_text().split()[1]

    def stop(self) -> None:
        if self._proc is not None:
            stop_sshd(self._proc)
            self._proc = None


@pytest.fixture
def recycled_address(sshd, tmp_path) -> Iterator[RecycledAddress]:
    """An sshd of its own on RECYCLED_ADDRESS, restartable with another host key; stopped at the end."""
    recycled = RecycledAddress(sshd.root, free_port(RECYCLED_ADDRESS), tmp_path)
    yield recycled
    recycled.stop()


@pytest.fixture
def marker() -> str:
    """A unique string to find this test's processes by (cmdline or environ)."""
    return f"cetest-{uuid.uuid4().hex}"
