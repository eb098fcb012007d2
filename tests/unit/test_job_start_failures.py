"""Workers that fail before the first round: the job ends with one line naming the failure, it never hangs.

A slot whose worker exits on every launch (the code or a package missing on one host) is bounded by
--start-timeout from the driver's start (cloud_elastic.driver.job.capacity); a command that this machine
cannot execute (a typo, a script without its x bit) is the worker's own exit 127/126, not a host still
booting (cloud_elastic.driver.runtime.processes, cloud_elastic.driver.launch.local)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.workers import WorkerState as S
from cloud_elastic.driver.launch.api import ExitStatus
from cloud_elastic.driver.runtime.processes import WorkerProcesses
from cloud_elastic.errors import ConfigError
from tests.unit.test_job import T0, UNREACHABLE, Sim, assert_round, failed

pytestmark = pytest.mark.timeout(10)

NO_SCRIPT = ExitStatus(2)  # python: can't open file 'train.py' on that host only


def crash_every_launch(sim: Sim, slot: str, until: float) -> None:
    """``slot``'s worker exits 2 as soon as it is launched, every time, while time moves on."""
    while sim.outcome is None and sim.now < until:
        w = sim.job.workers[sim.id(slot)]
        if w.state is S.STARTING:
            sim.exit(slot, NO_SCRIPT)
        sim.advance(1)


@pytest.mark.parametrize(("start", "elastic", "cooldown"), [(25, 600, (10.0, 300.0)), (15, 20, (5.0, 10.0))])
def test_a_slot_failing_every_launch_before_the_first_round_ends_the_job_at_the_start_timeout(
        caplog, start: float, elastic: float, cooldown: tuple[float, float]) -> None:
    sim = Sim(2, start_timeout_s=start, elastic_timeout_s=elastic, cooldown=cooldown)
    sim.discover({"a": 1, "b": 1})
    sim.join("a[0]")  # the healthy worker waits at rendezvous for its peer
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.driver.job"):
        crash_every_launch(sim, "b[0]", until=T0 + 700)
    assert sim.slots_launched().count("b[0]") >= 2  # retried after its cooldown
    failed(sim, f"only 1 of --min-np 2 worker(s) could be started within {start:g}s (--start-timeout): "
                f"last: worker {sim.id('b[0]')} (not yet ranked) exited with code 2")
    assert sim.now <= T0 + start + 1
    # The wait is announced once, not again at every relaunch of the failing slot.
    assert caplog.text.count("waiting up to") == 1, caplog.text
    assert "1 worker(s) ready, below --min-np 2" in caplog.text


def test_with_min_np_met_a_slot_failing_every_launch_does_not_end_the_job() -> None:
    sim = Sim(3, min_np=2, start_timeout_s=25)
    sim.discover({"a": 1, "b": 1, "c": 1})
    sim.join("a[0]", "b[0]")
    crash_every_launch(sim, "c[0]", until=T0 + 60)
    assert sim.outcome is None and sim.job.round == 1  # a and b train; c is retried as a scale-up


def test_a_host_not_reachable_yet_says_when_it_is_tried_again(caplog) -> None:
    sim = Sim(1)
    sim.discover({"a": 1})
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.driver.job"):
        sim.exit("a[0]", UNREACHABLE)
    assert "host a not reachable yet: retried in 11s" in caplog.text, caplog.text


def test_the_second_worker_of_an_unreachable_host_says_the_time_left_not_0s(caplog) -> None:
    sim = Sim(2)
    sim.discover({"a": 2})
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.driver.job"):
        sim.exit("a[0]", UNREACHABLE)
        sim.advance(3)
        sim.exit("a[1]", UNREACHABLE)  # the same outage, reported by its host-mate
    lines = [r.getMessage() for r in caplog.records if "not reachable yet" in r.getMessage()]
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["11s", "8s"], lines


def launch_through_processes(sim: Sim, command: tuple[str, ...], cwd: str) -> None:
    """Carry out the job's launches as the driver does, with the real local launcher."""
    config = JobConfig(command=command, num_proc=2, min_np=2, max_np=2, cwd=cwd)
    endpoints = SimpleNamespace(advertised="127.0.0.1", control_port=1, store_port=2, secret="s" * 32)
    processes = WorkerProcesses(config, sim.job, threading.Condition(), endpoints, clock=lambda: sim.now,
                                sinks=lambda: None, out=lambda line: None)
    try:
        for action in list(sim.launched):
            processes.launch(action)
            sim._collect()  # the job ends, or asks for more launches, as at a step of the driver
    finally:
        processes.close()


@pytest.mark.parametrize(("command", "code", "why"), [
    (("pyton", "train.py"), 127, "could not start its command 'pyton': No such file or directory"),
    (("./noexec.sh",), 126, "could not start its command './noexec.sh': Permission denied (no execute permission: "
                            "chmod +x it, or name its interpreter, e.g. python script.py)"),
    (("./adir",), 126, "could not start its command './adir': Permission denied (it is a directory, not a program)"),
])
def test_a_local_command_that_cannot_be_executed_ends_the_job_at_once_naming_it(
        caplog, tmp_path, command: tuple[str, ...], code: int, why: str) -> None:
    (tmp_path / "noexec.sh").write_text("echo hi\n")  # no x bit
    (tmp_path / "adir").mkdir()  # a directory given as the command
    sim = Sim(2)
    sim.discover({"localhost": 2})
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.driver"):
        launch_through_processes(sim, command, str(tmp_path))
    failed(sim, f"all workers failed; last: worker {sim.id('localhost[1]')} (not yet ranked) {why} "
                f"(exit code {code})")
    assert [f["exit_code"] for kind, f in sim.events if kind == "worker_failed"] == [code, code]
    assert "not reachable" not in caplog.text  # this machine is reachable: never a host still booting


def test_min_np_above_np_names_the_two_flags_given() -> None:
    # The CLI defaults --max-np to -np: `-np 2 --min-np 3` must not be blamed on --max-np.
    with pytest.raises(ConfigError) as raised:
        JobConfig(command=("python", "t.py"), num_proc=2, min_np=3, max_np=2)
    assert str(raised.value) == "--min-np (3) must be <= -np (2)"


@pytest.mark.parametrize(("hosts", "says_none"), [({}, True), ({"a": 1}, False)])
def test_a_job_that_cannot_start_says_when_discovery_found_no_host_at_all(hosts: dict, says_none: bool) -> None:
    # A discovery script that prints nothing (a filter that matched no instance) is not "too few slots": say so.
    sim = Sim(2, start_timeout_s=5)
    sim.discover(hosts)
    sim.advance(7)
    assert sim.outcome is not None and "only" in sim.outcome.reason and "-np 2 needed to start" in sim.outcome.reason
    assert sim.outcome.reason.endswith("; host discovery found no hosts at all") is says_none, sim.outcome.reason
