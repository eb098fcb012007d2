"""A ``driver-alive.json`` from storage is not trusted with the numbers a restarted driver waits on.

grace_s 1e12 or Infinity crashed a restarted driver (OverflowError in its wait) and NaN disabled
the wait; such an entry is now refused in one line, and the driver goes on with what it knows.
A ``raised`` or ``cost`` out of bounds is refused alone (fixI2): the rest of the entry still holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloud_elastic.checkpoint import CheckpointError, CheckpointStore
from cloud_elastic.checkpoint.alive import ALIVE_RECORD, MAX_GRACE_S, DriverAlive, read_driver_alive, write_driver_alive
from cloud_elastic.cost import CostSoFar

pytestmark = pytest.mark.timeout(20)

NOW = 1_795_444_453.5


def _entry(tmp_path: Path, alive: str, grace: str) -> CheckpointStore:
    # Written as raw text: JSON from another writer may hold Infinity and NaN, which Python's json reads.
    (tmp_path / ALIVE_RECORD).write_text(
        '{"format": "cloud-elastic-checkpoint", "job_id": "j1", "host": "vm", "pid": 7, "stopped": false, '
        f'"alive": {alive}, "grace_s": {grace}}}')
    return CheckpointStore(str(tmp_path))


@pytest.mark.parametrize("grace", ["1e12", "Infinity", "-Infinity", "NaN", "-1", str(MAX_GRACE_S * 2)])
def test_a_grace_that_is_not_a_bounded_number_of_seconds_is_refused_in_one_line(tmp_path: Path, grace: str) -> None:
    store = _entry(tmp_path, str(NOW), grace)
    with pytest.raises(CheckpointError, match=rf"{ALIVE_RECORD} is unreadable: grace_s .* is not a number of "
                                              r"seconds in \[0, 604800\]") as refused:
        read_driver_alive(store, now=NOW)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("alive", ["1e300", "Infinity", "NaN", "-5", str(NOW + 2 * 86400)])
def test_a_sign_of_life_that_is_not_a_time_up_to_a_day_ahead_is_refused_in_one_line(tmp_path: Path,
                                                                                   alive: str) -> None:
    store = _entry(tmp_path, alive, "60")
    with pytest.raises(CheckpointError, match=rf"{ALIVE_RECORD} is unreadable: alive .* is not a Unix time"):
        read_driver_alive(store, now=NOW)


def test_bounded_values_still_read_back(tmp_path: Path) -> None:
    store = _entry(tmp_path, str(NOW + 30), str(MAX_GRACE_S))  # a clock a little ahead, the largest grace
    # An entry that names no instance (an older driver's) reads back as such.
    assert read_driver_alive(store, now=NOW) == DriverAlive("j1", NOW + 30, MAX_GRACE_S, "vm", 7, instance="")


@pytest.mark.parametrize("value", ['"' + "x" * 65 + '"', "7", "[]"])
def test_a_forged_instance_makes_the_entry_unreadable(tmp_path: Path, value: str) -> None:
    with pytest.raises(CheckpointError, match="instance is not a string of at most 64 characters"):
        read_driver_alive(_entry_with(tmp_path, "instance", value), now=NOW)


def test_a_driver_never_writes_a_number_json_cannot_hold(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    with pytest.raises(CheckpointError, match="not writing .*driver-alive.json"):
        write_driver_alive(store, DriverAlive("j1", NOW, float("inf"), "vm", 7))
    assert not (tmp_path / ALIVE_RECORD).exists()
    write_driver_alive(store, DriverAlive("j1", NOW, 60.0, "vm", 7))
    assert json.loads((tmp_path / ALIVE_RECORD).read_text())["grace_s"] == 60.0


def _entry_with(tmp_path: Path, name: str, value: str, more: str = "") -> CheckpointStore:
    """An entry whose field ``name`` (``raised``, ``cost``) is the JSON text ``value`` (and ``more`` fields)."""
    (tmp_path / ALIVE_RECORD).write_text(
        '{"format": "cloud-elastic-checkpoint", "job_id": "j1", "host": "vm", "pid": 7, "stopped": false, '
        f'"alive": {NOW}, "grace_s": 60, {more}"{name}": {value}}}')
    return CheckpointStore(str(tmp_path))


def test_the_groups_a_driver_raised_read_back_and_an_entry_without_them_raised_none(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    write_driver_alive(store, DriverAlive("j1", NOW, 60.0, "vm", 7, raised=(("gpu-od", 2),)))
    assert json.loads((tmp_path / ALIVE_RECORD).read_text())["raised"] == {"gpu-od": 2}
    assert read_driver_alive(store, now=NOW).raised == (("gpu-od", 2),)
    assert read_driver_alive(_entry_with(tmp_path, "raised", "{}"), now=NOW).raised == ()
    (tmp_path / ALIVE_RECORD).write_text(  # a record written before drivers kept it
        f'{{"format": "cloud-elastic-checkpoint", "job_id": "j1", "host": "vm", "pid": 7, "alive": {NOW}, '
        '"grace_s": 60}')
    assert read_driver_alive(store, now=NOW).raised == ()


_COST = '{"dollars": 2, "slot_hours": 1, "unpriced_slot_hours": 0, "by_source": {}}'


@pytest.mark.parametrize("raised, kept", [
    ('{"od": 1e9}', ()), ('{"od": -1}', ()), ('{"od": "2"}', ()), ('{"od": true}', ()), ('[["od", 2]]', ()),
    ('{' + ", ".join(f'"g{i}": 1' for i in range(65)) + '}', ()), ('"od"', ()),
    ('{"od": 2, "x": -1}', (("od", 2),)), ('{"od": 2, "' + "y" * 300 + '": 1}', (("od", 2),)),
    ('{"od": 2, ' + ", ".join(f'"bad{i}": 0' for i in range(60)) + '}', (("od", 2),))])
def test_raised_groups_out_of_bounds_are_refused_in_one_line_and_the_rest_of_the_entry_holds(
        tmp_path: Path, raised: str, kept: tuple) -> None:
    entry = read_driver_alive(_entry_with(tmp_path, "raised", raised, f'"cost": {_COST}, '), now=NOW)
    assert entry.raised == kept and entry.grace_s == 60 and entry.cost.dollars == 2  # the wait and the cost hold
    [(part, why)] = entry.refused
    assert part == "raised" and why.startswith(f"{tmp_path / ALIVE_RECORD}: raised ")
    assert "\n" not in why and len(why) < 600, why
    assert ("'od' the capacity" in why) == (raised.startswith('{"od": ') and not kept), why  # the group refused


def test_the_cost_so_far_reads_back_and_an_entry_without_it_has_none(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    cost = CostSoFar(12.5, 9.75, 0.25, (("gpu-od", 9.4), ("gpu-spot", 3.1)), idle_slot_hours=1.5)
    write_driver_alive(store, DriverAlive("j1", NOW, 60.0, "vm", 7, cost=cost))
    assert json.loads((tmp_path / ALIVE_RECORD).read_text())["cost"] == {
        "dollars": 12.5, "slot_hours": 9.75, "unpriced_slot_hours": 0.25, "idle_slot_hours": 1.5,
        "by_source": {"gpu-od": 9.4, "gpu-spot": 3.1}}
    assert read_driver_alive(store, now=NOW).cost == cost
    # An entry of a driver from before idle slot-hours were kept: none carried, the rest as it says.
    older = read_driver_alive(_entry_with(tmp_path, "cost", "{" + _FIGURES + ', "dollars": 2}'), now=NOW).cost
    assert older == CostSoFar(2.0, 1.0, 0.0, ()) and older.idle_slot_hours == 0.0
    assert read_driver_alive(_entry_with(tmp_path, "cost", "null"), now=NOW).cost is None  # a job with one source
    assert read_driver_alive(_entry_with(tmp_path, "raised", "{}"), now=NOW).cost is None  # written before drivers kept it


_FIGURES = '"slot_hours": 1, "unpriced_slot_hours": 0, "by_source": {}'


@pytest.mark.parametrize("cost", [
    '{"dollars": NaN, ' + _FIGURES + '}', '{"dollars": -1, ' + _FIGURES + '}', '{"dollars": 1e300, ' + _FIGURES + '}',
    '{"dollars": Infinity, ' + _FIGURES + '}', '{"dollars": "5", ' + _FIGURES + '}',
    '{"dollars": true, ' + _FIGURES + '}', '{"dollars": 1, "slot_hours": 1, "by_source": {}}',
    '{"dollars": 1, "slot_hours": 1, "unpriced_slot_hours": 0, "by_source": {"od": -0.5}}',
    '{"dollars": 1, "slot_hours": 1, "unpriced_slot_hours": 0, "by_source": {'
    + ", ".join(f'"s{i}": 1' for i in range(1000)) + '}}',
    '{"dollars": 1, "slot_hours": 1, "unpriced_slot_hours": 0, "by_source": {"' + "x" * 300 + '": 1}}',
    '[12.5, 9.75]', '{"dollars": 1, "slot_hours": 1, "unpriced_slot_hours": 0}',
    *('{"dollars": 1, ' + _FIGURES + f', "idle_slot_hours": {idle}}}'  # idle: a part of the slot-hours
      for idle in ("NaN", "-1", "1e300", "Infinity", '"0.5"', "true", "null", "2")),
    # Figures that contradict one another (review h28): more unpriced slot-hours than slot-hours; sources' dollars
    # summing past the total (a restarted driver said $1 in all beside $2e12 by source).
    '{"dollars": 1, "slot_hours": 1, "unpriced_slot_hours": 5e11, "by_source": {}}',
    '{"dollars": 1, "slot_hours": 1, "unpriced_slot_hours": 0, "by_source": {"spot-a": 9.9e11, "other": 1e12}}',
    '{"dollars": 1, "slot_hours": 1, "unpriced_slot_hours": 0, "by_source": {"spot-a": 0.75, "od": 0.2501}}'])
def test_a_cost_that_is_not_bounded_figures_of_a_few_sources_is_refused_in_one_line(tmp_path: Path, cost: str) -> None:
    entry = read_driver_alive(_entry_with(tmp_path, "cost", cost, '"raised": {"od": 2}, '), now=NOW)
    assert entry.cost is None and entry.raised == (("od", 2),)  # the groups raised hold: a successor lowers them
    [(part, why)] = entry.refused
    assert part == "cost" and why.startswith(f"{tmp_path / ALIVE_RECORD}: cost")
    assert "\n" not in why and len(why) < 400 + len(str(tmp_path))


def test_a_refusal_is_never_written_back(tmp_path: Path) -> None:
    store = _entry_with(tmp_path, "cost", "[1]", '"raised": 5, ')
    entry = read_driver_alive(store, now=NOW)
    assert [part for part, _ in entry.refused] == ["raised", "cost"]
    write_driver_alive(store, entry)
    assert "refused" not in json.loads((tmp_path / ALIVE_RECORD).read_text())
    assert read_driver_alive(store, now=NOW).refused == ()
