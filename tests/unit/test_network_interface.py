"""A mistyped ``--network-interface`` (cloud_elastic.worker.interface): said in one line naming the interface,
where it is missing and what that machine has, and read back by the driver as the worker's reason (review s60
rvS finding 2: before, every round failed in Gloo until --elastic-timeout)."""

from __future__ import annotations

import socket

import pytest

from cloud_elastic.driver.job.exit_status import ExitStatus, LastErrors
from cloud_elastic.protocol_reports import said_own_reason
from cloud_elastic.worker.interface import exit_if_missing, missing_interface

pytestmark = pytest.mark.timeout(10)

#: An interface every Linux machine has.
HAS = socket.if_nameindex()[0][1]


def test_an_interface_the_machine_has_passes_and_a_missing_one_is_named_with_those_it_has() -> None:
    assert missing_interface(HAS, "this machine") is None
    line = missing_interface("eht0", "host 10.0.0.5")
    assert line is not None and "\n" not in line
    assert line.startswith("--network-interface 'eht0': host 10.0.0.5 has no network interface of that name")
    assert "(it has: " in line and HAS in line


@pytest.mark.parametrize("name", ["x" * 200, "eth0\x00", ""])
def test_names_no_machine_can_have_are_missing_not_an_exception(name: str) -> None:
    line = missing_interface(name, "this machine")
    assert line is not None and "\n" not in line and len(line) < 400


def test_a_worker_without_the_interface_exits_1_with_one_line_the_driver_takes_as_its_reason(capsys) -> None:
    exit_if_missing(None, "h[0]#1", "h")  # no --network-interface: nothing checked
    exit_if_missing(HAS, "h[0]#1", "h")
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as info:
        exit_if_missing("eht0", "10.0.0.5[1]#4", "10.0.0.5")
    assert info.value.code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("cloud-elastic: worker 10.0.0.5[1]#4: --network-interface 'eht0': host 10.0.0.5 has")
    reason = said_own_reason(line)
    assert reason is not None and reason.startswith("--network-interface 'eht0': host 10.0.0.5 has no network")
    errors = LastErrors(clock=lambda: 0.0)
    errors.offer("10.0.0.5[1]#4", line)
    assert errors.attach("10.0.0.5[1]#4", ExitStatus(1)) == (ExitStatus(1), reason)


def test_a_script_line_that_mentions_the_flag_is_not_taken_for_the_workers_reason() -> None:
    assert said_own_reason("epoch 3: --network-interface 'eht0': ...") is None
    assert said_own_reason("cloud-elastic: worker a[0]#1: cannot reach the driver at 1.2.3.4:5 for 9s (x): check") \
        == "cannot reach the driver at 1.2.3.4:5 for 9s (x): check"


def test_a_gloo_worker_whose_host_name_does_not_resolve_exits_1_with_one_line_the_driver_takes(capsys) -> None:
    # Gloo binds to what the host's name resolves to: a name only the driver knows (its ~/.ssh/config) failed every
    # round "Cannot resolve ..." for --elastic-timeout, and the end line blamed the firewall (review s63 rvU 3).
    exit_if_missing(None, "h[0]#1", "localhost", gloo=True)
    exit_if_missing(None, "h[0]#1", "no-such-host.invalid", gloo=False)  # NCCL binds no host name
    exit_if_missing(HAS, "h[0]#1", "no-such-host.invalid", gloo=True)  # Gloo binds the interface's address
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as info:
        exit_if_missing(None, "gpu1[0]#3", "no-such-host.invalid", gloo=True)
    assert info.value.code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("cloud-elastic: worker gpu1[0]#3: host name 'no-such-host.invalid' does not resolve on "
                           "that host (")
    reason = said_own_reason(line)
    assert reason is not None and reason.startswith("host name 'no-such-host.invalid' does not resolve")
    assert reason.endswith("name the host by its IP address, or give --network-interface")
    errors = LastErrors(clock=lambda: 0.0)
    errors.offer("gpu1[0]#3", line)
    assert errors.attach("gpu1[0]#3", ExitStatus(1)) == (ExitStatus(1), reason)
    assert said_own_reason("epoch 3: host name 'x' does not resolve on that host") is None
