"""A discovery script the job cannot wait for: Ctrl-C during a slow first call, and a script the system
cannot run at all (CRLF line endings, no ``#!`` line)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cloud_elastic.driver.runtime.discovery import DiscoveryFailure, DiscoveryPoller
from cloud_elastic.errors import DiscoveryError, FatalDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery
from cloud_elastic.providers.script import DiscoveryScript

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


def _script(path: Path, text: bytes) -> Path:
    path.write_bytes(text)
    path.chmod(0o755)
    return path


def _run(tmp_path: Path, script: Path, *flags: str) -> subprocess.Popen:
    """``cloud-elastic run`` with ``script`` as its discovery, in a process group of its own (as a shell runs it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "cloud_elastic.cli", "run", "-np", "1", "--host-discovery-script", str(script), *flags,
         sys.executable, "-c", "pass"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "XDG_RUNTIME_DIR": str(tmp_path)})


def _gone(pid: int) -> bool:
    """No process ``pid`` runs (a zombie whose parent, the driver, has ended runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


# ------------------------------------------------------------------------ Ctrl-C during the first call
def test_ctrl_c_during_a_slow_first_discovery_call_ends_the_job_and_its_script(tmp_path: Path) -> None:
    started = tmp_path / "started"
    slow = _script(tmp_path / "slow.sh", f"#!/bin/sh\necho $$ > {started}.tmp && mv {started}.tmp {started}\n"
                                         "sleep 120\necho 127.0.0.2:1\n".encode())
    proc = _run(tmp_path, slow, "--discovery-timeout", "120", "--start-timeout", "120")
    try:
        for _ in range(400):  # the driver has started the script (its first discovery call)
            if started.exists() or proc.poll() is not None:
                break
            threading.Event().wait(0.05)
        assert started.exists(), proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the driver's group, not the script's
        _, err = proc.communicate(timeout=20)  # well before the script's 120 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].endswith("interrupted: interrupted by SIGINT"), err
    assert _gone(int(started.read_text()))  # the script's group was killed, not left to run on


class _Blocking(HostDiscovery):
    """A provider whose find() waits until cancelled (``cancellable``) or released by the test."""

    name = "blocking"

    def __init__(self, cancellable: bool) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        if cancellable:
            self.cancel_find = self.released.set

    @classmethod
    def from_options(cls, options, *, slots_per_host=None):  # pragma: no cover (not built from options)
        raise NotImplementedError

    def find(self) -> DiscoveredHosts:
        self.entered.set()
        self.released.wait(60)
        raise DiscoveryError("cancelled")


@pytest.mark.parametrize("cancellable", [True, False])
def test_a_first_call_in_progress_is_abandoned_once_the_job_stops(cancellable: bool) -> None:
    provider = _Blocking(cancellable)
    poller = DiscoveryPoller(provider, lambda result: None, interval_s=1.0)
    try:
        result = poller.poll_once(stopping=provider.entered.is_set)  # stops as soon as the call is under way
        assert isinstance(result, DiscoveryFailure) and result.message == "the job is stopping"
        assert provider.released.is_set() == cancellable  # cancelled where the provider can be
    finally:
        provider.released.set()


def test_a_cancelled_script_provider_kills_the_running_script_and_runs_none_again(tmp_path: Path) -> None:
    started = tmp_path / "started"
    provider = DiscoveryScript(str(_script(tmp_path / "slow.sh", f"#!/bin/sh\necho $$ > {started}.tmp && "
                                                                 f"mv {started}.tmp {started}\nexec sleep 120\n".encode())),
                               timeout_s=120)
    outcome: list[BaseException] = []

    def find() -> None:
        try:
            provider.find()
        except BaseException as exc:  # noqa: BLE001 (what the test looks at)
            outcome.append(exc)

    caller = threading.Thread(target=find)
    caller.start()
    for _ in range(400):
        if started.exists():
            break
        threading.Event().wait(0.05)
    provider.cancel_find()
    caller.join(30)
    assert not caller.is_alive() and "was killed: the job is stopping" in str(outcome[0])
    assert _gone(int(started.read_text()))
    with pytest.raises(DiscoveryError, match="was not run: the job is stopping"):
        provider.find()


# ----------------------------------------------------------------------- a script that cannot run at all
@pytest.mark.parametrize("text, says", [
    (b"#!/bin/sh\r\necho 127.0.0.2:1\r\n", r"its interpreter '/bin/sh\r' was not found (CRLF line endings? "),
    (b"#! /no/such/python -u\necho 127.0.0.2:1\n", "its interpreter '/no/such/python' was not found"),
    (b"echo 127.0.0.2:1\n", "it needs a '#!' line naming its interpreter"),
])
def test_a_script_the_system_cannot_run_is_a_fatal_one_line_error(tmp_path: Path, text: bytes, says: str) -> None:
    script = _script(tmp_path / "hosts.sh", text)
    with pytest.raises(FatalDiscoveryError) as info:
        DiscoveryScript(str(script)).find()
    assert says in str(info.value) and "\n" not in str(info.value)
    assert "CRLF" not in str(info.value) or b"\r" in text


def test_a_job_whose_discovery_script_has_crlf_line_endings_fails_at_once_saying_so(tmp_path: Path) -> None:
    proc = _run(tmp_path, _script(tmp_path / "hosts.sh", b"#!/bin/sh\r\necho 127.0.0.2:1\r\n"),
                "--start-timeout", "300")
    try:
        _, err = proc.communicate(timeout=20)  # not retried until --start-timeout
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1, err
    assert err.strip().splitlines()[-1].endswith(
        r"failed: host discovery failed: discovery script " + str(tmp_path / "hosts.sh")
        + r" could not start: its interpreter '/bin/sh\r' was not found (CRLF line endings? convert the script "
        "with dos2unix)"), err
