"""A user's discovery script, run for real (cloud_elastic.providers.script)."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

import pytest

from cloud_elastic.errors import ConfigError, RetryableDiscoveryError
from cloud_elastic.providers.script import DiscoveryScript

pytestmark = pytest.mark.timeout(10)


def provider(path: Path, timeout_s: str = "5", slots_per_host: int | None = None) -> DiscoveryScript:
    return DiscoveryScript.from_options({"path": str(path), "timeout_s": timeout_s}, slots_per_host=slots_per_host)


def find_fails(path: Path, match: str, **kwargs) -> str:
    with pytest.raises(RetryableDiscoveryError, match=match) as info:
        provider(path, **kwargs).find()
    assert "\n" not in str(info.value)
    return str(info.value)


def test_hosts_in_printed_order_with_comments_and_blank_lines(make_script) -> None:
    script = make_script(
        """
        echo "# generated"
        echo "10.0.0.9:2"
        echo ""
        echo "10.0.0.1   # no slots given"
        echo "127.0.0.3:3"
        """
    )
    snapshot = provider(script, slots_per_host=4).find()
    assert list(snapshot.ready.items()) == [("10.0.0.9", 2), ("10.0.0.1", 4), ("127.0.0.3", 3)]


def test_default_is_one_slot(make_script) -> None:
    assert dict(provider(make_script("echo a; echo b")).find().ready) == {"a": 1, "b": 1}


def test_relative_path_is_made_absolute(make_script, monkeypatch: pytest.MonkeyPatch) -> None:
    script = make_script("echo a")
    monkeypatch.chdir(script.parent)
    found = DiscoveryScript.from_options({"path": script.name})
    monkeypatch.chdir("/")
    assert found.path == str(script) and dict(found.find().ready) == {"a": 1}


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('echo a:2; echo "Traceback (most recent call last):"', r"discover.sh: line 2 is not host\[:slots\]"),
        ("echo a:0", "line 1 gives host 'a' 0 slots"),
        ("echo a:-1", "line 1 gives host 'a' -1 slots"),
        ("echo a; echo b; echo a:2", r"host 'a' is listed twice \(line 1 and 3\)"),
    ],
    ids=["garbage", "zero-slots", "negative-slots", "duplicate"],
)
def test_bad_output_is_a_retryable_one_line_error(make_script, body: str, match: str) -> None:
    find_fails(make_script(body), match)


def test_non_zero_exit_reports_code_and_last_stderr_line(make_script) -> None:
    script = make_script("echo a:2; echo starting >&2; echo 'quota exceeded' >&2; exit 3")
    find_fails(script, r"exited with code 3: quota exceeded$")


def test_control_characters_on_a_failing_scripts_stderr_reach_the_log_escaped(make_script) -> None:
    # Raw, they cleared the driver's terminal, retitled it and painted a line of their own there.
    script = make_script(r"printf '\033]0;title\007\033[2J\033[1;31mFAKE: job succeeded\n' >&2; exit 3")
    message = find_fails(script, "exited with code 3: ")
    assert message.endswith(r"exited with code 3: \x1b]0;title\x07\x1b[2J\x1b[1;31mFAKE: job succeeded"), message
    assert message.isprintable()


def test_a_non_zero_exit_with_a_silent_stderr_says_so(make_script) -> None:
    find_fails(make_script("echo a:2; exit 4"), r"exited with code 4 \(nothing on its stderr\)$")

def test_hanging_script_and_its_children_are_killed_after_timeout(make_script, tmp_path: Path) -> None:
    script = make_script(
        """
        sleep 30 &
        echo $! > {tmp}/child.pid
        wait
        """
    )
    started = time.monotonic()
    find_fails(script, r"did not finish within 0.5s and was killed", timeout_s="0.5")
    assert time.monotonic() - started < 5
    assert _exits_within(int((tmp_path / "child.pid").read_text()), 3.0)


def test_a_script_that_exited_leaving_a_child_on_its_output_is_answered_and_the_child_killed(make_script,
                                                                                              tmp_path: Path) -> None:
    script = make_script(
        """
        sleep 30 &
        echo $! > {tmp}/child.pid
        echo 10.0.0.1:2
        """
    )
    assert dict(provider(script, timeout_s="5").find().ready) == {"10.0.0.1": 2}
    assert _exits_within(int((tmp_path / "child.pid").read_text()), 3.0)


def _exits_within(pid: int, timeout_s: float) -> bool:
    """Whether process ``pid`` (not our child) is gone within ``timeout_s``; waits on a pidfd, not a sleep."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)
        return bool(readable)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("setup", "match"),
    [
        (lambda make, tmp: make("echo a", mode=0o644), "is not executable"),
        (lambda make, tmp: tmp / "missing.sh", "does not exist or is not a file"),
        (lambda make, tmp: tmp, "does not exist or is not a file"),
    ],
    ids=["not-executable", "missing", "directory"],
)
def test_unusable_path_is_refused_before_running(make_script, tmp_path: Path, setup, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DiscoveryScript.from_options({"path": str(setup(make_script, tmp_path))})


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"timeout_s": "soon"}, "'timeout_s' must be a number"),
        ({"timeout_s": "0"}, "'timeout_s' must be > 0"),
        ({"timeout_s": "-1"}, "'timeout_s' must be > 0"),
        ({"timeout_s": "1e12"}, r"'timeout_s' must be at most 3\.1536e\+07 seconds \(a year\), got 1e\+12"),
        ({"interval": "1"}, "has no option 'interval'"),
    ],
)
def test_bad_options_are_refused(make_script, options: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DiscoveryScript.from_options({"path": str(make_script("echo a")), **options})


def test_path_option_is_required() -> None:
    with pytest.raises(ConfigError, match="needs option 'path'"):
        DiscoveryScript.from_options({})


def test_options_are_validated_without_running_the_script(make_script, tmp_path: Path) -> None:
    script = make_script("touch {tmp}/ran; echo a")
    found = provider(script)
    assert not (tmp_path / "ran").exists()
    found.find()
    assert (tmp_path / "ran").exists()


def test_a_script_given_a_timeout_above_the_discovery_timeout_is_waited_for_up_to_its_own(make_script) -> None:
    """``-o timeout_s=60`` with ``--discovery-timeout`` left at 30: a script answering at 35 s is the user's
    choice; the driver gave it up at 30 s, and each call was a failure before its late answer."""
    from cloud_elastic.driver.runtime.discovery import DiscoveryPoller

    script = provider(make_script("sleep 0.6; echo a"), timeout_s="3")
    poller = DiscoveryPoller(script, lambda _result: None, interval_s=1.0, call_timeout_s=0.2)
    try:
        assert dict(poller.poll_once().ready) == {"a": 1}
    finally:
        poller.close()


def test_a_driver_out_of_descriptors_to_read_the_script_gets_one_line_and_leaves_no_script(make_script, tmp_path: Path,
                                                                                            monkeypatch) -> None:
    # The script started (its pipes made), then the selector that reads them found no descriptor left: a clean
    # clone's run of a driver at its descriptor limit logged "raised an unexpected error" and a traceback.
    import errno
    import selectors

    pid_file = tmp_path / "pid"
    script = make_script(f"echo $$ > {pid_file}\nsleep 30\necho 127.0.0.1")

    def exhausted():
        time.sleep(0.3)  # the script has written its pid
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(selectors, "DefaultSelector", exhausted)
    started = time.monotonic()
    message = find_fails(script, r"could not be read: \[Errno 24\] Too many open files")
    assert "unexpected" not in message and time.monotonic() - started < 5
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed with its process group, and reaped
