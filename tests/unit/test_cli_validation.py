"""Invalid command lines fail before anything starts: exit 2, one line on stderr (the real CLI)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import write_script

pytestmark = pytest.mark.timeout(75)  # the module fixture starts every case at once; 2 shared cores
#: How long the cases have, all together, to be refused; and how long one that was not has to stop after SIGTERM.
REFUSE_WITHIN_S = 50.0
STOP_S = 5.0

_SCRIPT = Path(sys.executable).parent / "cloud-elastic"
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "cloud_elastic.cli"]
#: The training command of every case: it leaves a marker if anything ever runs it.
TRAIN = ["touch", "STARTED"]


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    #: What the one line must contain; a tuple when click's wording differs across versions around a name.
    message: str | tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


CASES = {
    "max-np-below-min-np": Case(("-np", "2", "--min-np", "2", "--max-np", "1", "-H", "localhost:2", *TRAIN),
                                "-np (2) must be <= --max-np (1)"),
    # --min-np defaults to -np: the message names the flags given
    "max-np-below-np": Case(("-np", "4", "--max-np", "1", "-H", "localhost:4", *TRAIN), "-np (4) must be <= --max-np (1)"),
    "whole-hosts-np-odd-alone": Case(("-np", "3", "-H", "a:2,b:2", "--slots-per-host", "2", "--whole-hosts", *TRAIN),
                                     "with --whole-hosts, -np, --min-np and --max-np count whole hosts' workers: -np 3 "
                                     "not a multiple of --slots-per-host 2"),
    "whole-hosts-without-slots": Case(("-np", "4", "-H", "a:2,b:2", "--whole-hosts", *TRAIN),
                                      "--whole-hosts needs --slots-per-host N"),
    "whole-hosts-part-of-a-host": Case(("-np", "3", "-H", "a:2,b:2", "--slots-per-host", "2", "--whole-hosts", *TRAIN),
                                       "-np 3 not a multiple of --slots-per-host 2"),
    "static-list-too-small": Case(("-np", "3", "-H", "a:1,b:1", *TRAIN),
                                  "-np 3 can never start: the host list offers 2 slot(s) in all"),
    "static-list-too-small-mapped": Case(("-np", "2", "-H", "10.0.0.5:1", "--address-map", "10.0.0.0/24=127.0.0.0/24", *TRAIN),
                                         "-np 2 can never start: the host list offers 1 slot(s) in all"),
    "whole-hosts-none-whole": Case(("-np", "6", "-H", "a:2,b:1,c:3", "--slots-per-host", "3", "--whole-hosts", *TRAIN),
                                   "-np 6 can never start: the host list offers 3 slot(s) on hosts with all "
                                   "--slots-per-host 3 slots"),
    "np-below-min-np": Case(("-np", "1", "--min-np", "2", "--max-np", "4", "-H", "localhost:4", *TRAIN),
                            "-np (1) must lie between --min-np (2) and --max-np (4)"),
    "np-above-max-np": Case(("-np", "5", "--min-np", "1", "--max-np", "4", "-H", "localhost:4", *TRAIN),
                            "-np (5) must lie between --min-np (1) and --max-np (4)"),
    "no-command": Case(("-np", "2", "-H", "localhost:2"), "no training command given"),
    "no-host-source": Case(("-np", "2", *TRAIN), "no hosts: give -H/--hosts"),
    "two-host-sources": Case(("-np", "2", "-H", "localhost:2", "--host-discovery-script", "{dir}/good.sh", *TRAIN),
                             "choose one host source: -H/--hosts, --host-discovery-script were given"),
    # It was "could not read <file>/job.json: [Errno 20] Not a directory", exit 1, as if storage had failed.
    "checkpoint-dir-a-file": Case(("-np", "2", "-H", "localhost:2", "--checkpoint-dir", "{dir}/good.sh", *TRAIN),
                                  "good.sh: it is a file, not a directory"),
    "checkpoint-dir-under-a-file": Case(("-np", "2", "-H", "localhost:2", "--checkpoint-dir", "{dir}/good.sh/ck",
                                         *TRAIN), "/good.sh is a file, not a directory"),
    "script-not-executable": Case(("-np", "2", "--host-discovery-script", "{dir}/plain.sh", *TRAIN),
                                  "is not executable"),
    "script-missing": Case(("-np", "2", "--host-discovery-script", "{dir}/missing.sh", *TRAIN),
                           "does not exist or is not a file"),
    "unknown-flag-first": Case(("--no-such-flag", "x", "-np", "2", "-H", "h:2", *TRAIN), ("no such option", "--no-such-flag")),
    "unknown-flag-last": Case(("-np", "2", "-H", "h:2", "--no-such-flag", *TRAIN), ("no such option", "--no-such-flag")),
    "missing-np": Case(("-H", "h:2", *TRAIN), "missing option '-np' / '--num-proc'"),
    "np-not-a-number": Case(("-np", "two", "-H", "h:2", *TRAIN), "'two' is not a valid integer"),
    "cooldown-one-value": Case(("-np", "1", "-H", "h", "--blacklist-cooldown-range", "5"),
                               "option '--blacklist-cooldown-range' requires 2 arguments"),
    "bad-notice-watcher": Case(("-np", "1", "-H", "h", "--notice-watcher", "ibm", *TRAIN),
                               "'ibm' is not one of 'auto', 'aws', 'gcp', 'azure', 'none'"),
    "spares-negative": Case(("-np", "1", "-H", "h", "--spares", "-1", *TRAIN), "--spares must be 0-1024, got -1"),
    "checkpoint-keep-0": Case(("-np", "1", "-H", "h", "--checkpoint-keep", "0", *TRAIN), "--checkpoint-keep must be >= 1"),
    # The job ran with no durable checkpoint while the user believed it protected (review s63 rvU finding 4).
    "checkpoint-flags-no-dir": Case(("-np", "1", "-H", "h", "--checkpoint-interval", "5", "--checkpoint-keep", "3",
                                     *TRAIN), "--checkpoint-interval and --checkpoint-keep given without --checkpoint-dir"),
    "checkpoint-keep-no-dir": Case(("-np", "1", "-H", "h", "--checkpoint-keep", "3", *TRAIN),
                                   "error: --checkpoint-keep given without --checkpoint-dir"),
    # An unset $CKPT: the checkpoints and the driver's record went to the current directory (review h23).
    "checkpoint-dir-empty": Case(("-np", "1", "-H", "h", "--checkpoint-dir", "", *TRAIN),
                                 "error: --checkpoint-dir is empty: give a directory or a URL"),
    # A typo'd loopback address failed every round for --elastic-timeout (review s63 rvU finding 3).
    "ipv4-typo": Case(("-np", "2", "-H", "127.0.0.2:1,127.0.0.300:1", *TRAIN),
                      "--hosts: entry 2: host '127.0.0.300' is not an IPv4 address"),
    "metrics-port-range": Case(("-np", "1", "-H", "h", "--metrics-port", "70000", *TRAIN), "--metrics-port must be 0-65535"),
    # Past the check, the driver's metrics server would die on a raw socket.gaierror traceback.
    "metrics-addr-empty": Case(("-np", "1", "-H", "localhost", "--metrics-port", "0", "--metrics-addr", "", *TRAIN),
                               "--metrics-addr must be an address or host name, got ''"),
    "metrics-addr-padded": Case(("-np", "1", "-H", "localhost", "--metrics-port", "0", "--metrics-addr", " 127.0.0.1",
                                 *TRAIN), "--metrics-addr must be an address or host name, got ' 127.0.0.1'"),
    "bad-aws-metadata-endpoint": Case(("-np", "1", "-H", "localhost", "--notice-watcher", "aws", *TRAIN),
                                      "AWS_EC2_METADATA_SERVICE_ENDPOINT must be an http:// URL with no path",
                                      (("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254/latest/"),)),
    "bad-gcp-metadata-host": Case(("-np", "1", "-H", "localhost", "--notice-watcher", "gcp", *TRAIN),
                                  "GCE_METADATA_HOST is host[:port] without a scheme or path",
                                  (("GCE_METADATA_HOST", "http://metadata.google.internal"),)),
    "bad-aws-metadata-endpoint-forwarded": Case(
        ("-np", "1", "-H", "localhost", "--notice-watcher", "aws",
         "-x", "AWS_EC2_METADATA_SERVICE_ENDPOINT=http://169.254.169.254/latest/", *TRAIN),
        "AWS_EC2_METADATA_SERVICE_ENDPOINT must be an http:// URL with no path"),
    "bad-timeout-env": Case(("-np", "1", "-H", "localhost", *TRAIN),
                            "HOROVOD_ELASTIC_TIMEOUT must be a number of seconds", (("HOROVOD_ELASTIC_TIMEOUT", "soon"),)),
}


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str
    workdir: Path


def _stop(procs: list[subprocess.Popen]) -> None:
    """End the ``cloud-elastic run`` processes of ``procs`` still running: SIGTERM first (a driver that started a
    job stops its workers), then SIGKILL to the process group of each after :data:`STOP_S`. One that already
    ended is left alone: its process id may be another's now."""
    alive = [proc for proc in procs if proc.poll() is None]
    for proc in alive:
        proc.terminate()
    deadline = time.monotonic() + STOP_S
    for proc in alive:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what it started in its group, and itself if still running
        except ProcessLookupError:
            pass
        proc.wait(STOP_S)


def _output(proc: subprocess.Popen, timeout_s: float) -> tuple[str, str] | None:
    """``proc``'s stdout and stderr once it ends within ``timeout_s``; None while it runs on."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        if proc.poll() is None:
            return None
    try:  # it ended: what it wrote is there to read (a timeout of 0 may not have left a moment to read it)
        return proc.communicate(timeout=1)
    except subprocess.TimeoutExpired:
        return "", "(a process it started holds its output open)"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Run every case at once (each CLI start costs a quarter second) and collect the results. A case still
    running after :data:`REFUSE_WITHIN_S` was not refused (it started a job): that is its own result, so only
    its tests fail, naming it; every process started here is ended, whatever happens."""
    env = {k: v for k, v in os.environ.items() if "ELASTIC" not in k}
    running: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        for name, case in CASES.items():
            workdir = tmp_path_factory.mktemp(name)
            write_script(workdir, "touch {tmp}/DISCOVERED; echo localhost:2", name="good.sh")
            write_script(workdir, "echo localhost:2", name="plain.sh", mode=0o644)
            args = [a.replace("{dir}", str(workdir)) for a in case.args]
            running[name] = (subprocess.Popen(
                [*CLI, "run", *args], cwd=workdir, env={**env, **dict(case.env)}, start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            ), workdir)
        deadline = time.monotonic() + REFUSE_WITHIN_S
        done, late = {}, []
        for name, (proc, workdir) in running.items():
            output = _output(proc, max(0.0, deadline - time.monotonic()))
            if output is None:
                late.append(name)
            else:
                done[name] = Result(proc.returncode, *output, workdir)
        _stop([running[name][0] for name in late])
        for name in late:
            proc, workdir = running[name]
            out, err = _output(proc, 0.0) or ("", "")
            done[name] = Result(proc.returncode, out, f"{name}: not refused, still running after "
                                                      f"{REFUSE_WITHIN_S:g} s (ended by the test)\n{err}", workdir)
        return done
    finally:
        _stop([proc for proc, _ in running.values()])


@pytest.mark.parametrize("name", CASES)
def test_invalid_command_line_exits_2_with_one_line(results: dict[str, Result], name: str) -> None:
    result = results[name]
    lines = result.stderr.splitlines()
    assert result.code == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("cloud-elastic: error: ")
    message = CASES[name].message
    for part in (message,) if isinstance(message, str) else message:
        assert part in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("name", CASES)
def test_nothing_was_started(results: dict[str, Result], name: str) -> None:
    workdir = results[name].workdir
    assert not (workdir / "STARTED").exists()
    assert not (workdir / "DISCOVERED").exists()


def test_a_good_forwarded_endpoint_over_a_bad_one_of_the_drivers_own_starts_the_job(monkeypatch) -> None:
    """The workers get the -x value, so the driver's own bad value is no reason to refuse the job."""
    import signal
    import types

    from cloud_elastic import cli
    from cloud_elastic.driver.runtime import driver as driver_module

    started = []

    class FakeDriver:
        job_id = "fake0001"

        def __init__(self, config, discovery, **kwargs) -> None:
            started.append(config)

        def interrupt(self, reason: str, code: int) -> None:
            pass

        def run(self):
            return types.SimpleNamespace(success=True, exit_code=0, reason="done")

    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the test process keeps its own handlers
    monkeypatch.setattr(cli, "_setup_logging", lambda verbose: None)
    monkeypatch.setattr(driver_module, "Driver", FakeDriver)
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://169.254.169.254/latest/")
    code = cli.main(["run", "-np", "1", "-H", "localhost", "--notice-watcher", "aws",
                     "-x", "AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:9", *TRAIN])
    assert code == 0 and len(started) == 1
