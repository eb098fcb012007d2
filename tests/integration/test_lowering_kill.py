"""A driver killed -9 while the job's own fallback group is being set back to 0 leaves the group to its successor.

rv4 lowering_kill: the job raised od to 1 (taken: paid), spot came back and the job asked od for 0, but the
lowering call was answered Throttling at every discovery; the driver was then killed -9. Its sign of life said it
had raised nothing (the group left it as soon as the job asked the 0, written at once or at the next refresh), so
the driver restarted for the job never lowered od: it stayed at 1, paid, after the job. A group stays in the sign of
life until the cloud has taken its 0 (``Room.holds``).

The child plays driver 1 in the driver's rhythm around the real job core, provider and ``AliveRefresher`` (the
driver's tick on a thread, discovery and its capacity calls on another); the test kills it -9 once its sign of life
was written after the refused lowering, and plays driver 2 from what that sign of life carried.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _driver_1(ckpt: str) -> None:
    """Driver 1 (the child): prints LOWERING once a sign of life was written after the lowering was refused."""
    from cloud_elastic.checkpoint import CheckpointStore
    from cloud_elastic.checkpoint.alive import AliveRefresher, read_driver_alive
    from cloud_elastic.driver.runtime import raised
    from cloud_elastic.errors import CapacityError
    from tests.unit.test_fallback_table import World

    world = World(2, False)
    sim, store = world.sim, CheckpointStore(ckpt)
    world.groups["spot"].hosts = 1
    refresher = AliveRefresher(store, "job", 60.0, interval_s=0.2).start()
    raised.write_ahead(world.multi, refresher)
    lock = threading.Lock()

    def tick() -> None:  # the driver's loop: every 50 ms
        while True:
            with lock:
                raised.share(sim.job, world.multi)
                raised.remember(sim.job, refresher, {})
            time.sleep(0.05)

    threading.Thread(target=tick, daemon=True).start()
    refused_at = None
    while True:  # the discovery thread: its answer to the job, then the job's capacity calls
        with lock:
            raised.discovered(sim.job, world.multi, world.multi.find(), sim.now)
            sim.advance(1)
            actions, sim.capacity[:] = list(sim.capacity), []
        for action in actions:
            world.multi.set_capacity(action.hosts, source=action.source)
        if world.groups["od"].desired == 1 and world.groups["spot"].hosts == 1:
            world.groups["spot"].hosts = 2  # spot is back: od no longer needed; its lowering is throttled
            world.groups["od"].errors = [CapacityError("SetDesiredCapacity: Throttling (after 3 attempts)")] * 10**6
        if refused_at is None and "od=0" in world.cloud:
            refused_at = time.time()
        entry = read_driver_alive(store)
        if refused_at is not None and entry is not None and entry.alive > refused_at + 0.5:
            print(f"LOWERING od={world.groups['od'].desired} calls={world.cloud}", flush=True)
        time.sleep(0.1)


def test_a_driver_killed_while_its_groups_lowering_is_throttled_leaves_the_group_to_its_successor(tmp_path):
    from cloud_elastic.checkpoint import CheckpointStore
    from cloud_elastic.checkpoint.alive import read_driver_alive
    from cloud_elastic.driver.runtime import raised
    from tests.unit.test_fallback_table import World

    ckpt = str(tmp_path / "ckpt")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, __file__, ckpt], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             text=True)
    try:
        timer = threading.Timer(40.0, child.kill)  # bounds the readline below
        timer.start()
        line = child.stdout.readline()
        timer.cancel()
        assert line.startswith("LOWERING od=1 calls=['od=1', 'od=0'"), line
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(10)
    carried = dict(read_driver_alive(CheckpointStore(ckpt)).raised)
    assert carried == {"od": 1}, "the sign of life still carries the group whose 0 the cloud never took"
    # Driver 2: the cloud as driver 1 left it (od at 1, its lowering never landed), spot back with 2 hosts.
    world = World(2, False)
    world.groups["spot"].hosts, world.groups["od"].desired = 2, 1
    raised.inherit(world.sim.job, carried)
    world.do("tick=3")
    world.do("end")
    assert world.cloud == ["od=0"] and world.groups["od"].desired == 0, "the job's group is set back to 0"


if __name__ == "__main__":
    _driver_1(sys.argv[1])
