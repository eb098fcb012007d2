"""A ``--driver-address`` the workers cannot reach (or a firewall between them and the driver) is named once, not
hidden under a flood: a newcomer's run printed 633 retry warnings in 65 s, two tracebacks, and ended with "all
workers failed; last: worker ... (not yet ranked) exited with code 1", never naming the address.

* The worker (``worker/link/driver_link.py``) warns at its first failed try, then at most every 10 s, saying how
  long it has tried; at its deadline it exits 1 with one line naming the address, without a traceback.
* The driver (``driver/runtime/processes.py``) reads that line on the worker's output, and its end line carries it
  as that worker's reason.

Time is a fake clock (the module's ``time``), so the 65 s take none.
"""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.launch.api import ExitStatus
from cloud_elastic.driver.runtime.processes import WorkerProcesses
from cloud_elastic.worker.link import driver_link
from cloud_elastic.worker.link.driver_link import DriverLinkMixin
from tests.unit.test_job import Sim, failed

pytestmark = pytest.mark.timeout(30)

ADDRESS = "10.9.9.9:37351"
REFUSED = "[Errno 111] Connection refused"
LINE = (f"cannot reach the driver at {ADDRESS} for 65s ({REFUSED}): check --driver-address and that the workers "
        "can reach the driver (firewall)")


class _Clock:
    """``time`` for driver_link: ``sleep`` moves the clock on, and so does each failed try (``cost``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Refused:
    """A driver client whose every call fails as a connection to a closed port does; ``answers``: calls that
    succeed first."""

    def __init__(self, clock: _Clock, answers: int = 0) -> None:
        self.clock, self.answers, self.tries = clock, answers, 0

    def call(self, kind, payload=None, *, timeout_s=30.0):
        self.clock.now += 0.01
        if self.answers:
            self.answers -= 1
            return {"ok": True}
        self.tries += 1
        raise ConnectionRefusedError(111, "Connection refused")


class _Link(DriverLinkMixin):
    def __init__(self, client: _Refused) -> None:
        self.worker_id = "127.0.0.2[0]#1"
        self.settings = SimpleNamespace(driver_address=ADDRESS)
        self.heartbeat_timeout_s, self.driver_grace_s = 10.0, 60.0  # the defaults: 65 s of tries
        self.driver_lost = False
        self._client = client


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(driver_link, "time", clock)
    return clock


def test_a_driver_never_reached_is_named_in_one_line_after_few_warnings(clock, caplog, capsys) -> None:
    link = _Link(_Refused(clock))
    with caplog.at_level(logging.WARNING, logger=driver_link.__name__), pytest.raises(SystemExit) as exited:
        link._call("register")
    assert exited.value.code == 1
    assert capsys.readouterr().err.splitlines() == [f"cloud-elastic: worker 127.0.0.2[0]#1: {LINE}"]
    assert link.driver_lost, "its exit hooks try the driver no more"
    warnings = [r.getMessage() for r in caplog.records]
    assert link._client.tries > 300  # it kept trying every 0.2 s...
    assert 2 <= len(warnings) <= 8, warnings  # ...but warned at the first, then at most every 10 s
    assert warnings[0] == f"worker 127.0.0.2[0]#1: register to the driver at {ADDRESS} failed ({REFUSED}); " \
                          "retrying for up to 65s"
    assert warnings[1] == f"worker 127.0.0.2[0]#1: register to the driver at {ADDRESS} still fails after 10s " \
                          f"({REFUSED}); retrying for up to 65s"


def test_a_driver_that_answered_once_is_not_taken_for_a_wrong_address(clock, capsys) -> None:
    link = _Link(_Refused(clock, answers=1))
    link._call("register")
    with pytest.raises(ConnectionRefusedError):  # the heartbeat thread's driver grace rules such a worker
        link._call("rendezvous")
    assert capsys.readouterr().err == "" and not link.driver_lost


class _Process:
    """A worker process that has printed what it was given and exits with ``code`` once set."""

    def __init__(self, on_output) -> None:
        self.say, self.code = on_output, None

    def poll(self) -> ExitStatus | None:
        return None if self.code is None else ExitStatus(self.code)

    def terminate(self, grace_s: float = 5.0) -> None:
        pass

    def kill(self) -> None:
        pass


class _Launcher:
    def __init__(self) -> None:
        self.procs: dict[str, _Process] = {}

    def launch(self, spec, on_output) -> _Process:
        self.procs[spec.worker_id] = _Process(on_output)
        return self.procs[spec.worker_id]

    def close(self) -> None:
        pass


def launched(sim: Sim, control_port: int = 37351, out=lambda line: None) -> tuple[WorkerProcesses, _Launcher]:
    """The driver's WorkerProcesses over ``sim``'s job, each launch it asked for made with a :class:`_Launcher`."""
    num_proc, launcher = len(sim.launched), _Launcher()
    endpoints = SimpleNamespace(advertised="10.9.9.9", control_port=control_port, store_port=2, secret="s" * 32)
    processes = WorkerProcesses(JobConfig(command=("python", "good.py"), num_proc=num_proc, min_np=num_proc,
                                          max_np=num_proc), sim.job, threading.Condition(), endpoints,
                                clock=lambda: sim.now, sinks=lambda: None, out=out, launcher=launcher)
    for action in list(sim.launched):
        processes.launch(action)
    return processes, launcher


def test_the_jobs_end_line_names_the_address_the_workers_could_not_reach() -> None:
    sim = Sim(2)
    sim.discover({"a": 1, "b": 1})
    printed: list[str] = []
    processes, launcher = launched(sim, out=printed.append)
    for worker_id, proc in launcher.procs.items():
        proc.say(f"cloud-elastic: worker {worker_id}: {LINE}")  # as the worker prints it, last
        proc.code = 1
    processes.reap()
    sim._collect()
    failed(sim, f"all workers failed; last: worker {sim.id('b[0]')} (not yet ranked) exited with code 1: {LINE}")
    assert sum(LINE in line for line in printed) == 2  # each worker's own line is shown too


def test_a_script_printing_about_the_driver_is_not_taken_for_the_workers_line() -> None:
    from cloud_elastic.protocol_reports import said_unreachable

    assert said_unreachable(f"cloud-elastic: worker a[0]#1: {LINE}") == LINE
    assert said_unreachable(f"epoch 3: {LINE}") is None
    assert said_unreachable("cloud-elastic: worker a[0]#1 lost contact with the driver") is None


def test_a_heartbeat_to_a_driver_that_stopped_answering_is_cut_at_the_end_of_the_grace(clock) -> None:
    """Review h32: a driver whose node was lost (traffic dropped, nothing refused) held each heartbeat for the
    whole call timeout (heartbeat timeout + 10 s), so the worker exited up to 15 s past its --driver-grace, training
    beside a restarted driver's new workers. A call is now cut at the grace's end, never below a heartbeat's hold +
    1 s; a restarted driver waits that much more."""
    from cloud_elastic.config import past_grace_s
    link = _Link(_Refused(clock))
    link.heartbeat_timeout_s, link.driver_grace_s = 5.0, 60.0
    last_ok = clock.now
    assert link._poll_timeout_s(last_ok) == 15.0  # far from the grace's end: as before
    clock.now = last_ok + 50.0
    assert link._poll_timeout_s(last_ok) == 10.0  # ends with the grace
    clock.now = last_ok + 59.0
    assert link._poll_timeout_s(last_ok) == past_grace_s(5.0) == 2.25  # a held poll (<= 1.25 s) still answers
    link.driver_grace_s = 0.0  # --driver-grace 0: a live driver's held poll is not cut short
    assert link._poll_timeout_s(clock.now) == 2.25


def test_a_restarted_driver_waits_past_the_grace_for_the_last_heartbeat_too(tmp_path) -> None:
    """The successor's wait for the old workers covers their last, cut call (past_grace_s) and their last checkpoint."""
    import time as real_time

    from cloud_elastic.checkpoint.alive import REFRESH_S
    from cloud_elastic.config import past_grace_s
    from cloud_elastic.driver.restart import predecessor
    config = JobConfig(command=("python", "t.py"), num_proc=1, min_np=1, max_np=1, driver_grace_s=40.0,
                       heartbeat_timeout_s=30.0)
    alive = SimpleNamespace(alive=real_time.time() - 1.0, grace_s=40.0, pid=7, host="node-a")
    plan = predecessor._with_wait(predecessor.StartPlan(job_id="j1"), config, None, alive, SimpleNamespace(
        backend=SimpleNamespace(url=lambda name: f"s3://b/{name}")))
    assert plan.wait_until == pytest.approx(alive.alive + REFRESH_S + 40.0 + past_grace_s(30.0)
                                            + predecessor._LAST_CHECKPOINT_S)
