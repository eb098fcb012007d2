"""The remote wrapper with a driver grace: a lost driver lets the worker train on, orders still act at once."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.launch.ssh_remote import REASON_KEEPALIVE, Order, Watchdog, _driver_grace_s

pytestmark = pytest.mark.timeout(10)


def test_end_of_file_waits_for_the_driver_grace() -> None:
    dog = Watchdog(5.0, 30.0, now=0.0, driver_grace_s=75.0)
    assert dog.received(b"", 1.0) == Order(5.0, after_s=75.0)


def test_keepalive_silence_waits_for_the_driver_grace() -> None:
    dog = Watchdog(5.0, 30.0, now=0.0, driver_grace_s=75.0)
    assert dog.idle(29.0) is None
    assert dog.idle(31.0) == Order(5.0, REASON_KEEPALIVE, after_s=75.0)


def test_explicit_orders_act_at_once_despite_the_grace() -> None:
    dog = Watchdog(5.0, 30.0, now=0.0, driver_grace_s=75.0)
    assert dog.received(b"KILL\n", 1.0) == Order(0.0)
    assert Watchdog(5.0, 30.0, 0.0, 75.0).received(b"TERM 2\n", 1.0) == Order(2.0)


def test_without_a_grace_a_lost_driver_stops_the_worker_at_once() -> None:
    assert Watchdog(5.0, 30.0, now=0.0).received(b"", 1.0) == Order(5.0)


@pytest.mark.parametrize("raw, grace", [(None, 0.0), ("", 0.0), ("60", 60.0), ("-3", 0.0), ("soon", 0.0)])
def test_the_grace_comes_from_the_environment(raw, grace) -> None:
    assert _driver_grace_s(raw) == grace
