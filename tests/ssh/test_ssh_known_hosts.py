"""Recycled private IPs: a new instance at a known address is accepted, a changed key on the same instance is not.

A second sshd plays one "cloud" address (127.0.0.6 on a port of its own).
Restarting it with another host key is what a replaced instance that got the
old instance's private IP looks like to the driver.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from cloud_elastic.driver.launch.ssh import SSHLauncher
from ssh_support import RECYCLED_ADDRESS as ADDRESS, start, wait_exit

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(60)]


@pytest.fixture
def launcher(sshd, recycled_address, tmp_path, monkeypatch) -> Iterator[SSHLauncher]:
    # A % in TMPDIR, where the private file goes: ssh expands %d (the home directory) in UserKnownHostsFile.
    (tmp_path / "jobs_100%done").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "jobs_100%done"))
    # The default host-key policy; only the system-wide file is kept out, so the test sees this launcher's file alone.
    config = dataclasses.replace(sshd.config, port=recycled_address.port,
                                 extra_options=("GlobalKnownHostsFile=/dev/null",))
    with SSHLauncher(config) as launcher:
        yield launcher


def _runs(launcher: SSHLauncher, marker: str, instance: str | None) -> None:
    proc, out = start(launcher, ADDRESS, marker, "report", instance=instance)
    status = wait_exit(proc)
    assert (status.code, status.transport_error) == (0, None), out.lines
    assert json.loads(out.wait_for("{"))["env"]["SSH_CONNECTION"].split()[2] == ADDRESS
    assert not [line for line in out.lines if "Permanently added" in line], "ssh's chatter reached the job output"


def test_a_new_instance_at_a_recycled_address_is_accepted(launcher, recycled_address, marker):
    old_key = recycled_address.serve("instance-a")
    _runs(launcher, marker, "i-aaaa")
    path = launcher.known_hosts_file
    assert path is not None and old_key in Path(path).read_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert not os.path.exists(os.path.expanduser("~/.ssh/known_hosts")) or \
        old_key not in Path(os.path.expanduser("~/.ssh/known_hosts")).read_text(), "the user's known_hosts was used"

    new_key = recycled_address.serve("instance-b")  # the group replaced the instance; the new one got the same IP
    _runs(launcher, marker, "i-bbbb")
    text = Path(path).read_text()
    assert new_key in text and old_key not in text

    launcher.close()
    assert not os.path.exists(os.path.dirname(path)), "the private known-hosts directory outlived the launcher"


@pytest.mark.parametrize("instance", ["i-aaaa", None], ids=["same-instance", "no-instance-id"])
def test_a_changed_key_without_a_new_instance_is_refused(launcher, recycled_address, marker, instance):
    recycled_address.serve("instance-a")
    _runs(launcher, marker, instance)
    recycled_address.serve("impostor")
    proc, out = start(launcher, ADDRESS, marker, "report", instance=instance)
    status = wait_exit(proc)
    assert status.code == 255
    assert status.transport_error and "not a worker failure" in status.transport_error
    assert "host key mismatch" in status.transport_error, status.transport_error
    assert not any(line.startswith("{") for line in out.lines), "the worker ran on a host with a changed key"


def test_a_host_key_the_system_wide_file_pins_gives_no_warning_and_a_changed_key_is_still_refused(
        sshd, recycled_address, marker, tmp_path, caplog):
    """Review of 409fc5b: the "ssh recorded no host key" WARNING fired for a host whose key the system-wide
    known-hosts file (GlobalKnownHostsFile here, /etc/ssh/ssh_known_hosts in a real setup) already pins: ssh adds
    nothing to the job's file then, and a changed key is refused all the same."""
    import logging

    b64 = recycled_address.serve("instance-a")
    key_type = (tmp_path / "instance-a.pub").read_text().split()[0]
    pinned = tmp_path / "ssh_known_hosts"
    pinned.write_text(f"[{ADDRESS}]:{recycled_address.port} {key_type} {b64}\n")
    config = dataclasses.replace(sshd.config, port=recycled_address.port,
                                 extra_options=(f"GlobalKnownHostsFile={pinned}",))
    with SSHLauncher(config) as launcher, caplog.at_level(logging.WARNING):
        proc, _ = start(launcher, ADDRESS, marker, "report")
        assert wait_exit(proc).code == 0
        recycled_address.serve("impostor")
        proc, _ = start(launcher, ADDRESS, marker, "report")
        status = wait_exit(proc)
    assert status.code == 255 and "host key mismatch" in status.transport_error
    assert "recorded no host key" not in caplog.text


def test_a_known_hosts_file_ssh_cannot_write_is_one_warning(launcher, recycled_address, marker, caplog):
    """Review of f53281f: the warning waited for "Permanently added", which ssh prints only when it did write the
    file; when it cannot, it says "Failed to add the host", and a changed key would then pass unnoticed."""
    import logging
    import shutil

    recycled_address.serve("instance-a")
    path = launcher._known_hosts.path
    os.remove(path)
    os.mkdir(path)  # where ssh would append the key: unwritable even for root
    try:
        with caplog.at_level(logging.WARNING):
            proc, _ = start(launcher, ADDRESS, marker, "report")
            assert wait_exit(proc).code == 0
    finally:
        shutil.rmtree(path)
    assert "recorded no host key" in caplog.text, caplog.text
