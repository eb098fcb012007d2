"""The job-private known-hosts file: which keys are forgotten when an address changes hands."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat

import pytest

from cloud_elastic.driver.launch.known_hosts import JobKnownHosts, drop_host

pytestmark = pytest.mark.timeout(10)

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


def _hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_only_the_named_address_loses_its_keys():
    lines = [f"10.0.1.4 {KEY_A}", f"10.0.1.5 {KEY_B}", f"10.0.1.40 {KEY_B}", f"[10.0.1.4]:2222 {KEY_B}"]
    assert drop_host(lines, "10.0.1.4", None) == [f"10.0.1.5 {KEY_B}", f"10.0.1.40 {KEY_B}"]


def test_a_line_naming_several_hosts_keeps_the_others():
    assert drop_host([f"10.0.1.4,10.0.1.5 {KEY_A}"], "10.0.1.4", 22) == [f"10.0.1.5 {KEY_A}"]


def test_hashed_entries_are_matched_on_the_port_ssh_uses():
    lines = [f"{_hashed('[10.0.1.4]:2222')} {KEY_A}", f"{_hashed('10.0.1.5')} {KEY_B}"]
    assert drop_host(lines, "10.0.1.4", 2222) == [lines[1]]
    assert drop_host(lines, "10.0.1.5", None) == [lines[0]]
    assert drop_host(lines, "10.0.1.6", 2222) == lines


def test_comments_and_markers_are_kept():
    lines = ["# a comment", "", f"@cert-authority 10.0.1.4 {KEY_A}", f"10.0.1.4 {KEY_B}"]
    assert drop_host(lines, "10.0.1.4", None) == lines[:3]


def _write(known: JobKnownHosts, *lines: str) -> None:
    with open(known.path, "a") as f:
        f.writelines(line + "\n" for line in lines)


def _read(known: JobKnownHosts) -> list[str]:
    with open(known.path) as f:
        return f.read().splitlines()


def test_another_instance_at_an_address_forgets_its_key_the_same_one_does_not():
    known = JobKnownHosts()
    try:
        assert not known.admit("10.0.1.4", "i-1", None)  # first launch there: nothing to forget
        _write(known, f"10.0.1.4 {KEY_A}", f"10.0.1.5 {KEY_B}")
        assert not known.admit("10.0.1.4", "i-1", None)  # same instance again
        assert _read(known) == [f"10.0.1.4 {KEY_A}", f"10.0.1.5 {KEY_B}"]
        assert not known.admit("10.0.1.4", None, None)  # no identity: never forgets
        assert _read(known) == [f"10.0.1.4 {KEY_A}", f"10.0.1.5 {KEY_B}"]
        assert known.admit("10.0.1.4", "i-2", None)  # the address changed hands
        assert _read(known) == [f"10.0.1.5 {KEY_B}"]
        assert stat.S_IMODE(os.stat(known.path).st_mode) == 0o600
    finally:
        known.close()


def test_the_file_is_private_and_close_removes_it():
    known = JobKnownHosts()
    path = known.path
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    known.close()
    known.close()
    assert not os.path.exists(os.path.dirname(path))


def test_a_file_still_empty_after_the_first_connection_is_warned_about_once(caplog):
    known, recorded = JobKnownHosts(), JobKnownHosts()
    try:
        assert os.path.getsize(known.path) == 0  # created empty, before ssh runs
        _write(recorded, f"10.0.1.4 {KEY_A}")
        with caplog.at_level("WARNING", logger="cloud_elastic.driver.launch.known_hosts"):
            recorded.check_recorded("10.0.1.4:22")
            assert not caplog.records
            known.check_recorded("10.0.1.4:22")  # ssh could not write the file: any later key would be accepted
            known.check_recorded("10.0.1.5:22")
        assert len(caplog.records) == 1 and "recorded no host key" in caplog.records[0].getMessage()
    finally:
        known.close()
        recorded.close()
