"""The remote wrapper's pure parts: its arguments, the watchdog's decisions, the status marker."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cloud_elastic.driver.launch.ssh_remote import (
    MODULE, Order, Watchdog, WrapperArgs, exit_code, marker_line, parse_args, parse_marker, wrapper_argv,
)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("env_on_stdin", [False, True])
def test_arguments_round_trip(env_on_stdin):
    args = WrapperArgs("n0nce", 5.0, 30.0, "/srv/my job", ("python", "train.py", "--lr", "0.1"), env_on_stdin)
    assert parse_args(wrapper_argv(args)) == args
    assert (wrapper_argv(args)[0] == "--env") is env_on_stdin  # the launcher's; Spark's and Ray's send no variables


@pytest.mark.parametrize("argv", [[], ["n", "5", "30", "/"], ["n", "five", "30", "/", "x"], ["n", "5", "-1", "/", "x"],
                                  ["", "5", "30", "/", "x"]])
def test_arguments_that_are_not_ours_are_refused(argv):
    with pytest.raises(ValueError):
        parse_args(argv)


def test_keepalive_lines_keep_the_worker_alive_until_silence():
    dog = Watchdog(grace_s=5.0, keepalive_timeout_s=30.0, now=0.0)
    assert dog.idle(29.0) is None
    assert dog.received(b"\n", 29.0) is None
    assert dog.idle(58.0) is None  # 29 s after the last line
    assert dog.idle(59.5) == Order(5.0, "keepalive")


def test_keepalive_off_never_times_out():
    assert Watchdog(grace_s=5.0, keepalive_timeout_s=0.0, now=0.0).idle(1e9) is None


@pytest.mark.parametrize("chunks, order", [
    ([b"KILL\n"], Order(0.0)),
    ([b"TERM 2.5\n"], Order(2.5)),
    ([b"TERM\n"], Order(5.0)),
    ([b"TERM soon\n"], Order(5.0)),
    ([b"TERM -3\n"], Order(0.0)),
    ([b"\n\nKI", b"LL\n"], Order(0.0)),  # split across reads
    ([b"\n", b""], Order(5.0)),  # end of file: the driver or the connection is gone
])
def test_orders_on_stdin(chunks, order):
    dog = Watchdog(grace_s=5.0, keepalive_timeout_s=30.0, now=0.0)
    decisions = [dog.received(chunk, 1.0) for chunk in chunks]
    assert decisions[:-1] == [None] * (len(chunks) - 1)
    assert decisions[-1] == order


def test_a_partial_line_is_not_an_order():
    assert Watchdog(grace_s=5.0, keepalive_timeout_s=30.0, now=0.0).received(b"KILL", 1.0) is None


@pytest.mark.parametrize("status, code", [(0, 0), (3, 3), (254, 254), (255, 254), (-9, 137), (-15, 143)])
def test_exit_code_is_what_a_shell_would_report(status, code):
    assert exit_code(status) == code


def test_marker_round_trips_and_needs_the_nonce():
    line = marker_line("abc123", -9, "-")
    assert parse_marker(line, "abc123") == (-9, "-")
    assert parse_marker(line, "other") is None  # a worker cannot forge its status without the nonce
    assert parse_marker("CLOUD_ELASTIC_EXIT abc123 x -", "abc123") is None
    assert parse_marker("hello", "abc123") is None


def test_the_module_starts_without_heavy_imports_and_refuses_bad_arguments():
    # Run it for real: exit 2 with a one-line reason, and neither torch nor a cloud SDK loaded.
    result = subprocess.run([sys.executable, "-m", MODULE, "bad"], capture_output=True, text=True, timeout=20)
    assert result.returncode == 2
    assert "bad arguments" in result.stderr and "cloud-elastic version" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, {MODULE}; print(sorted(m.split('.')[0] for m in sys.modules))"],
        capture_output=True, text=True, timeout=20, check=True).stdout
    for heavy in ("torch", "numpy", "boto3", "google", "azure", "ibm_vpc"):
        assert f"'{heavy}'" not in loaded, f"{MODULE} imports {heavy}"
