"""A fallback group whose MinSize holds the job's 0 (review s56 rv11 F1): the cloud took the 0 as far as the group
allows, so the group is no longer the job's raise and leaves the driver's sign of life; a successor driver then
leaves alone an operator's raise made after it (docs/multi-source.md)."""

from __future__ import annotations

import pytest

from tests.unit.test_fallback_table import World

pytestmark = pytest.mark.timeout(60)


def test_a_lowering_held_at_minsize_leaves_the_sign_of_life():
    w = World(3, False)
    w.groups["od"].min = w.groups["od"].desired = 1
    for word in "spot=1 tick=2 spot=3 tick=3 tick=30".split():
        w.do(word)
    assert w.cloud == ["od=2", "od=1"] and w.multi.capacity_of("od") == 0  # the job's 0, held at MinSize, taken
    assert w.sim.job.capacity.sourcing.raised(sent=True) == {}, "still carried: a successor would lower the group"


def test_a_successor_leaves_an_operators_raise_after_a_minsize_held_lowering():
    w = World(3, False)
    w.groups["od"].min = w.groups["od"].desired = 1
    for word in "spot=1 tick=2 spot=3 tick=3".split():
        w.do(word)
    carried = w.sim.job.capacity.sourcing.raised(sent=True)  # what driver-alive.json says; the driver is killed
    successor = World(3, False)
    successor.groups["od"].min, successor.groups["od"].desired = 1, 4  # the operator raised it after the job's 0
    successor.do("spot=3")
    successor.do(f"restart=od:{carried['od']}" if carried else "tick=0")
    successor.do("tick=3")
    successor.do("end")
    assert successor.groups["od"].desired == 4, f"the successor sent {successor.cloud}"
