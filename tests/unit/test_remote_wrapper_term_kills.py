"""``--term-kills`` (a Ray actor's wrapper): a SIGTERM to the wrapper KILLs the worker's group, never passes
the signal on (a worker that gets one reports its host as going, and the driver drains it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from cloud_elastic.driver.launch.ssh_remote import MODULE, WrapperArgs, parse_args, parse_marker, wrapper_argv

pytestmark = pytest.mark.timeout(60)

_WORKER = textwrap.dedent(r"""
    import os, signal, time
    signal.signal(signal.SIGTERM, lambda *_: os.write(1, b"worker SIGTERM\n"))
    os.write(1, b"worker ready\n")
    while True:
        time.sleep(1)
""")


def test_term_kills_travels_on_the_command_line_beside_env():
    args = WrapperArgs("n", 5.0, 0.0, "/", ("cmd", "--env"), env_on_stdin=True, term_kills=True)
    assert parse_args(wrapper_argv(args)) == args
    assert parse_args(wrapper_argv(WrapperArgs("n", 5.0, 0.0, "/", ("c",)))).term_kills is False


@pytest.mark.parametrize("end", ["sigterm", "eof"])
def test_a_term_kills_wrapper_kills_the_worker_without_passing_a_sigterm_on(tmp_path, end):
    """Both come when the Ray actor dies: Ray TERMs its group, the kernel its wrapper, and its pipe closes."""
    argv = wrapper_argv(WrapperArgs("n1", 5.0, 0.0, str(tmp_path), (sys.executable, "-c", _WORKER), term_kills=True))
    proc = subprocess.Popen([sys.executable, "-m", MODULE, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path), "CLOUD_ELASTIC_DRIVER_GRACE_S": "300"})
    try:
        proc.stdin.write("the-secret\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "worker ready\n", proc.stderr.read()
        if end == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            proc.stdin.close()
        proc.wait(timeout=30)
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        proc.kill()
    assert "worker SIGTERM" not in out
    markers = [m for m in (parse_marker(line, "n1") for line in err.splitlines()) if m is not None]
    assert (markers, proc.returncode) == ([(-signal.SIGKILL, "-")], 128 + signal.SIGKILL), err
