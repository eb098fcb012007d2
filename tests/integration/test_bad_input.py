"""Issue 44, findings 5, 8 and 9, as a user meets them: the real ``cloud-elastic`` command in a child process.

A typo in a flag is exit code 2 and one line, promptly and in bounded memory (the child runs under an
``RLIMIT_AS`` of 1 GiB, so code that would grow without end fails with MemoryError instead of taking
the machine down); a discovery script that prints without end is killed; the job's secret does not reach
the training script's subprocesses; a driver busy with its own start-up is not a stalled one.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.harness import CLI, REPO

pytestmark = pytest.mark.timeout(240)

#: Room for the CLI (it imports no torch), not for a slot list of 10^8 entries or a 2 GB buffer.
_MEMORY_LIMIT = 1 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))


def _cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_limited, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def _one_line_error(result: subprocess.CompletedProcess, code: int = 2) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code and len(lines) == 1, (result.returncode, result.stderr[-3000:])
    assert lines[0].startswith("cloud-elastic"), lines
    return lines[0]


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("slots", ["100000000", "99999999999999999999"])
def test_a_slot_count_typo_is_exit_2_and_one_line(slots: str) -> None:
    """Finding 5: these grew the driver by 1.8 GB in 20 s, or until the OOM killer ended it."""
    line = _one_line_error(_cli("run", "-np", "1", "-H", f"127.0.0.1:{slots}", sys.executable, "-c", "pass"))
    assert "'127.0.0.1'" in line and "at most 1024" in line


def test_a_discovery_script_reporting_huge_slot_counts_is_refused(tmp_path) -> None:
    script = _script(tmp_path, "hosts.sh", "echo 127.0.0.1:100000000\n")
    line = _one_line_error(_cli("discover", "--host-discovery-script", str(script)), code=1)
    assert "'127.0.0.1' 100000000 slots; at most 1024" in line


def test_a_discovery_script_that_prints_without_end_is_killed(tmp_path) -> None:
    """Finding 5: ``exec yes 127.0.0.1:1`` was buffered whole before the 1 MiB check (2 GB in 1 s)."""
    script = _script(tmp_path, "hosts.sh", "exec yes 127.0.0.1:1\n")
    line = _one_line_error(_cli("discover", "--host-discovery-script", str(script)), code=1)
    assert "printed more than 1 MiB and was killed" in line


@pytest.mark.parametrize("flags", [["--heartbeat-timeout", "nan"], ["--elastic-timeout", "nan"],
                                   ["--blacklist-cooldown-range", "nan", "nan"], ["--driver-grace", "1e12"]])
def test_nan_and_absurd_durations_are_exit_2(flags: list[str]) -> None:
    """Finding 8: these were accepted; with a NaN heartbeat timeout a stopped worker was never detected."""
    line = _one_line_error(_cli("run", "-np", "1", "-H", "127.0.0.1:1", "--start-timeout", "20", *flags,
                                sys.executable, "-c", "pass"))
    assert flags[0] in line


def test_an_ipv6_host_is_refused_at_parse_time() -> None:
    """Finding 9: it parsed, then the driver said workers would reach it at 127.0.0.1."""
    line = _one_line_error(_cli("run", "-np", "1", "-H", "[2001:db8::1]:1", "--start-timeout", "5",
                                sys.executable, "-c", "pass"))
    assert "'2001:db8::1' is an IPv6 address, which is not supported" in line


def test_an_unknown_checkpoint_protocol_is_exit_2_and_one_line(tmp_path) -> None:
    """Finding 9: ``--checkpoint-dir nosuchproto://b/x`` gave a 79-line traceback and exit 1."""
    line = _one_line_error(_cli("run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", "nosuchproto://b/x",
                                sys.executable, "-c", "pass"))
    assert "'nosuchproto'" in line


_SECRET_PROBE = """
import os
import subprocess
import torch
import cloud_elastic.torch as hvd
from cloud_elastic.worker.settings import taken_secret


def child_sees():
    out = subprocess.run(["sh", "-c", "printenv CLOUD_ELASTIC_SECRET || echo none"], capture_output=True, text=True)
    return out.stdout.strip()


def shown_by_proc():  # what another process of the user reads of this worker (and of a shell wrapping it)
    secret = taken_secret().encode()
    seen = [open(f"/proc/{pid}/environ", "rb").read() for pid in (os.getpid(), os.getppid())]
    return "shown" if not secret or any(secret in environ for environ in seen) else "hidden"


print("REPORT imported", child_sees(), flush=True)
hvd.init()
print("REPORT initialised", child_sees(), shown_by_proc(), flush=True)
model = torch.nn.Linear(2, 1)
state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), step=0)


@hvd.elastic.run
def train(state):
    state.commit()


train(state)
"""


@pytest.mark.parametrize("shell", [False, True], ids=["forked", "from-scratch-under-a-shell"])
def test_the_training_scripts_subprocesses_never_inherit_the_secret(tmp_path, shell: bool) -> None:
    """Finding 9: the secret stayed in the workers' os.environ, so the script's subprocesses inherited it.
    Nor may ``/proc/PID/environ`` show it (the environment a process started with, readable by every process of
    the user), of the worker or of a shell that wraps it; the job still runs, so the worker did get it."""
    probe = tmp_path / "probe.py"
    probe.write_text(_SECRET_PROBE)
    # A shell is never forked by the fork server: it is started from scratch, and passes the secret on to Python.
    command = ["sh", "-c", f'"{sys.executable}" "{probe}"; exit $?'] if shell else [sys.executable, str(probe)]
    result = subprocess.run([*CLI, "run", "-np", "1", "-H", "127.0.0.1:1", *command],
                            cwd=REPO, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                            env={**os.environ, "CLOUD_ELASTIC_LOCAL_FORKSERVER": "1"})
    reports = [line.split("REPORT ", 1)[1] for line in result.stdout.splitlines() if "REPORT " in line]
    assert result.returncode == 0 and len(reports) == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert reports == ["imported none", "initialised none hidden"]


def test_start_up_work_is_not_reported_as_a_stalled_driver(tmp_path) -> None:
    """Finding 9: every job printed lines of "the driver did not run for 1.0s" before its first round.

    The first discovery here takes 1.5 s (a slow script, a cloud SDK's import): the driver is busy, not
    stalled. (A driver that is really stopped still says so: test_driver_hardening.py.)
    """
    marker = tmp_path / "called"
    script = _script(tmp_path, "hosts.sh", f"""\
        [ -e {marker} ] || {{ sleep 1.5; touch {marker}; }}
        echo 127.0.0.1:1
        """)
    probe = tmp_path / "probe.py"
    probe.write_text(_SECRET_PROBE)
    result = subprocess.run([*CLI, "run", "-np", "1", "--host-discovery-script", str(script), sys.executable,
                             str(probe)], cwd=REPO, capture_output=True, text=True, timeout=180,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "did not run for" not in result.stdout + result.stderr, result.stderr[-3000:]
