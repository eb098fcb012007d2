"""The exit reports a restarted driver fetches from its SSH workers' hosts: how they are left, completed, carried
and read, and the bounds on each (a remote rank that exited 0 while the driver was away used to fail the restarted
job as "left no exit code")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from cloud_elastic.driver.job.exit_status import ExitStatus
from cloud_elastic.driver.launch import ssh_remote, ssh_wire
from cloud_elastic.driver.launch.ssh_setup import exit_status
from cloud_elastic.driver.restart.record import AdoptedWorker, parse_exit_report
from cloud_elastic.driver.restart.remote_reports import _run_bounded, parse_answer
from cloud_elastic.driver.restart.window import WindowClosed
from cloud_elastic.driver.runtime.driver import Driver
from cloud_elastic.protocol_reports import ExitingReport
from cloud_elastic.records import EXIT_REPORT_ENV
from cloud_elastic.worker.link.driver_link import DriverLinkMixin

pytestmark = pytest.mark.timeout(30)

GOOD = {"v": 1, "round": 2, "rank": 1, "code": 0, "error": None}


@pytest.mark.parametrize("data, why", [
    (json.dumps(dict(GOOD, pad="x" * 5000)).encode(), "over 4096 bytes"),
    (b'{"v": 1, "round": 2, "rank": 1, "code": 0', "not JSON"),
    (b"[1, 2]", "malformed"),
    (json.dumps(dict(GOOD, v=2)).encode(), "malformed"),
    (json.dumps(dict(GOOD, rank=True)).encode(), "malformed"),
    (json.dumps(dict(GOOD, rank=-1)).encode(), "malformed"),
    (json.dumps(dict(GOOD, code="0")).encode(), "malformed"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "code"}).encode(), "malformed"),
])
def test_a_report_out_of_bounds_or_shape_is_refused_with_a_short_reason(data, why) -> None:
    with pytest.raises(ValueError, match=why):
        parse_exit_report(data)


def test_a_valid_report_says_its_round_rank_and_code_or_none() -> None:
    assert parse_exit_report(json.dumps(GOOD).encode()) == (2, 1, 0)
    assert parse_exit_report(json.dumps(dict(GOOD, code=None)).encode()) == (2, 1, None)


def test_a_report_line_carries_any_bytes_on_one_line() -> None:
    line = ssh_wire.report_line("ab12", b'{"a":\n"b\xff"}')
    assert "\n" not in line
    assert ssh_wire.parse_report_line(line) == ("ab12", '{"a":\n"b\ufffd"}'.encode())
    assert ssh_wire.parse_report_line("CLOUD_ELASTIC_REPORT ab12 {not json") is None
    assert ssh_wire.parse_report_line("CLOUD_ELASTIC_REPORT ab12 {}") is None
    assert ssh_wire.parse_report_line("worker output") is None


def test_an_answer_counts_only_the_workers_asked_about_and_the_round_asked(caplog) -> None:
    asked = {"aa": AdoptedWorker("h[0]#1", "h", 0, 1, {"kind": "ssh", "nonce": "aa"}),
             "bb": AdoptedWorker("h[1]#2", "h", 1, 2, {"kind": "ssh", "nonce": "bb"}),
             "cc": AdoptedWorker("h[2]#3", "h", 2, 3, {"kind": "ssh", "nonce": "cc"})}
    answer = "\n".join([
        ssh_wire.report_line("aa", json.dumps(GOOD).encode()),
        ssh_wire.report_line("dd", json.dumps(dict(GOOD, rank=0)).encode()),  # not asked about: forged
        ssh_wire.report_line("bb", json.dumps(dict(GOOD, rank=2, round=1)).encode()),  # another round
        ssh_wire.report_line("cc", b"garbage"),
        "noise",
    ])
    assert parse_answer(answer, "h", asked, 2) == {1: ("h[0]#1", 0)}
    assert [r.getMessage() for r in caplog.records] == [
        "cannot read the exit report of worker h[2]#3 on h (not JSON): its exit code stays unknown"]


def test_the_wrapper_completes_the_report_and_answers_within_bounds(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    os.makedirs(os.path.dirname(ssh_remote.report_path("aa")), mode=0o700)
    with open(ssh_remote.report_path("aa"), "w") as fh:
        json.dump(dict(GOOD, code=None), fh)
    ssh_remote.complete_report("aa", 3)
    ssh_remote.complete_report("zz", 0)  # left none: nothing
    with open(ssh_remote.report_path("bb"), "w") as fh:
        fh.write("x" * 100_000)
    ssh_remote.complete_report("bb", 0)  # too long to be one: left as it is
    out = subprocess.run([sys.executable, "-m", ssh_wire.MODULE, "--exit-reports", "aa", "bb", "zz", "../aa"],
                         capture_output=True, text=True, timeout=20, env=dict(os.environ, TMPDIR=str(tmp_path)))
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 2, out
    assert ssh_wire.parse_report_line(lines[0]) == ("aa", json.dumps(dict(GOOD, code=3)).encode())
    nonce, big = ssh_wire.parse_report_line(lines[1])
    assert nonce == "bb" and len(big) == ssh_wire.REPORT_LIMIT + 1


class _Link(DriverLinkMixin):
    _uncaught = None
    worker_id = "127.0.0.2[0]#1"
    settings = SimpleNamespace(job_id="j1")
    info = SimpleNamespace(round=2, rank=1)
    training_done = True


def test_a_worker_under_the_ssh_wrapper_leaves_its_report_where_the_wrapper_says(tmp_path, monkeypatch) -> None:
    assert EXIT_REPORT_ENV == ssh_wire.EXIT_REPORT_ENV
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no driver record on this host
    monkeypatch.setenv(EXIT_REPORT_ENV, str(tmp_path / "aa.exit.json"))
    _Link()._leave_exit_report(ExitingReport(None))
    assert parse_exit_report((tmp_path / "aa.exit.json").read_bytes()) == (2, 1, None)


def test_a_host_that_answers_too_much_or_too_late_is_refused_in_bounded_time() -> None:
    with pytest.raises(ValueError, match="over 1000 bytes"):
        _run_bounded(["yes"], 10, 1000)
    with pytest.raises(OSError, match="no answer within 0.3s"):
        _run_bounded(["sleep", "30"], 0.3, 1000)
    with pytest.raises(OSError, match="code 3"):
        _run_bounded(["sh", "-c", "exit 3"], 10, 1000)


def test_no_report_is_read_from_a_directory_others_could_write_and_the_driver_says_so(tmp_path, caplog) -> None:
    """The host's answer is all the driver sees of it (ssh's stderr is not read): it must say why it sent nothing,
    and the driver warns once, as docs/checkpoints.md promises, instead of failing the job without a word."""
    directory = tmp_path / f"cloud-elastic-{os.getuid()}"
    directory.mkdir(mode=0o755)
    (directory / "aa.exit.json").write_text(json.dumps(GOOD))
    os.chmod(directory, 0o777)
    out = subprocess.run([sys.executable, "-m", ssh_wire.MODULE, "--exit-reports", "aa"], capture_output=True,
                         text=True, timeout=20, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert out.returncode == 0, out
    asked = {"aa": AdoptedWorker("h[0]#1", "h", 0, 1, {"kind": "ssh", "nonce": "aa"})}
    assert parse_answer(out.stdout, "h", asked, 2) == {}, "a report anyone could have left was taken"
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"cannot fetch the exit reports of the previous driver's workers from h ({directory} is not a private "
        "directory of the user there: anyone could have left them): their exit codes stay unknown"]


def _attach_finds_none(tmp_path, report: str | None) -> tuple[int, str] | None:
    """The marker line of ``--attach aa`` on a host where the worker of launch ``aa`` has ended, leaving ``report``."""
    directory = tmp_path / f"cloud-elastic-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if report is not None:
        (directory / "aa.exit.json").write_text(report)
    out = subprocess.run([sys.executable, "-m", ssh_wire.MODULE, "--attach", "aa"], capture_output=True, text=True,
                         timeout=20, env=dict(os.environ, TMPDIR=str(tmp_path)), stdin=subprocess.DEVNULL)
    return next(filter(None, (ssh_wire.parse_marker(line, "aa") for line in out.stderr.splitlines())), None)


@pytest.mark.parametrize("report, marker, status", [
    (json.dumps(dict(GOOD, code=0)), (0, "gone"), ExitStatus(0)),
    (json.dumps(dict(GOOD, code=3)), (3, "gone"), ExitStatus(3)),
    (json.dumps(dict(GOOD, code=None)), (1, "gone-unknown"), ExitStatus(1, known=False)),
    ('{"v": 1, "round": 2, "rank": 1, "code": 0', (1, "gone-unknown"), ExitStatus(1, known=False)),
    (None, (1, "gone-unknown"), ExitStatus(1, known=False)),
])
def test_a_worker_that_ended_before_the_restarted_driver_attached_has_the_code_its_report_says(
        tmp_path, report, marker, status) -> None:
    """It used to be 'exited with code 1' whatever its report on the host said (0 after a good final save): the
    restarted job failed. No readable report: unknown (the job then goes by what the worker said), never 1 or 0."""
    assert _attach_finds_none(tmp_path, report) == marker
    assert exit_status(1, marker, False, [], str, 30.0) == status  # the SSH launcher's reading of the marker line


def test_the_restarted_driver_attaches_its_adopted_workers_before_it_fetches_the_reports_of_the_others() -> None:
    """A host slow to answer the fetch (within connect timeout + 10 s) made an adopted rank that ended meanwhile
    unreachable to attach ('rank 0 exited with code 1'): the workers it adopted are attached first."""
    attached: list[str] = []
    fetched_after: list[list[str]] = []
    adopted = AdoptedWorker("a[0]#1", "a", 0, 1, {"kind": "ssh", "nonce": "aa"})
    missing = AdoptedWorker("b[0]#2", "b", 0, 2, {"kind": "ssh", "nonce": "bb"})
    window = SimpleNamespace(
        wait=lambda stopped: WindowClosed((adopted,), (missing,), 0.5),
        fetch_exit_reports=lambda missing, *args: fetched_after.append(list(attached)),
        close=lambda: None)
    driver = SimpleNamespace(
        job_id="j", _record_for_status=lambda: None, _cond=threading.Condition(),
        _first_discovery=lambda once=False: None,  # the job ended meanwhile (its outcome below)
        _stop_reason=None, _endpoints=SimpleNamespace(advertised="h", control_port=1, store_port=2),
        _job=SimpleNamespace(discovery=SimpleNamespace(answered_before=False), outcome="ended"),
        _processes=SimpleNamespace(stop_missing=lambda w: None, adopt=lambda w: attached.append(w.worker_id),
                                   launcher_for=None, adopted_spec=None),
        config=SimpleNamespace(ssh=SimpleNamespace(connect_timeout_s=10.0)))
    Driver._start_adopting(driver, window, None)
    assert fetched_after == [["a[0]#1"]]
