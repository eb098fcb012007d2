"""``status`` shows a draining host's real slot count, not 0.

After ``cloud-elastic drain JOB 127.0.0.3`` status showed ``127.0.0.3  0  draining`` in text and JSON, although the
host had 1 slot and still listed its worker on slot [0]: a draining host leaves ``hosts.ready``, and its slot count
with it (discovery gives a draining host none).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.status_reply import status_reply
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.control_plane import ControlPlane
from cloud_elastic.providers.api import Drain
from cloud_elastic.status import StatusReply, render_status
from tests.unit.test_job import Sim, started

pytestmark = pytest.mark.timeout(30)


def _plane(sim: Sim) -> ControlPlane:
    cond = JobCondition()
    cond.watch(sim.job)
    return ControlPlane(sim.job, cond, JobConfig(command=("x",), num_proc=3, min_np=1, max_np=3),
                        sinks=SimpleNamespace(sink=SimpleNamespace(emit=lambda *a, **k: None), metrics=None),
                        clock=lambda: sim.now, stop=lambda *a: None, record_events=lambda: None)


def _status(plane: ControlPlane) -> StatusReply:
    return StatusReply.from_json(json.loads(json.dumps(plane.handle("status", {"worker": "cli:status"}))))


def _row(reply: StatusReply, host: str):
    return next(h for h in reply.hosts if h.host == host)


def test_a_host_drained_by_hand_keeps_its_slot_count_in_status() -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 2}, min_np=1)  # c: two slots, one worker
    plane = _plane(sim)
    reply = plane.handle("drain", {"worker": "cli:drain", "host": "c", "slot": None})
    assert reply["ok"] is True, reply
    shown = _status(plane)
    row = _row(shown, "c")
    assert (row.slots, row.state) == (2, "draining"), row
    assert [w.slot for w in row.workers] == [0]  # its worker leaves at its next commit, still listed
    line = next(line for line in render_status(shown, now=sim.now).splitlines() if line.startswith("c "))
    assert line.split()[1:3] == ["2", "draining"], line


def test_a_host_discovery_reports_draining_keeps_the_count_it_had_when_ready() -> None:
    # No message reached the driver while c was ready: the control plane, which kept the count from message to
    # message before, showed the slots c's worker held (1), not c's 2.
    sim = started(3, {"a": 1, "b": 1, "c": 2}, min_np=1)
    plane = _plane(sim)
    sim.discover({"a": 1, "b": 1}, draining={"c": Drain(None, "Terminating")})
    assert (_row(_status(plane), "c").slots, _row(_status(plane), "c").state) == (2, "draining")
    config = JobConfig(command=("x",), num_proc=3, min_np=1, max_np=3)
    reply = status_reply(sim.job, config, provider="static", now=sim.now, wall_now=sim.now, uptime_s=1.0)
    assert _row(reply, "c").slots == 2  # the pure reply alone knows it too: the hosts keep it


def test_a_host_never_seen_ready_shows_no_slots_and_a_forgotten_host_keeps_no_count() -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 2}, min_np=1)
    plane = _plane(sim)
    leaving = Drain(None, "Terminating")
    sim.discover({"a": 1, "b": 1}, draining={"c": leaving, "d": leaving})  # d: listed draining from the first
    assert _row(_status(plane), "d").slots == 0
    assert sim.job.hosts.slots_of("d") is None and sim.job.hosts.slots_of("c") == 2
    sim.discover({"a": 1, "b": 1})  # c and d leave discovery: forgotten, their counts with them
    assert sim.job.hosts.slots_of("c") is None and all(h.host not in ("c", "d") for h in _status(plane).hosts)


def test_another_instance_at_a_draining_address_does_not_inherit_the_old_ones_slot_count() -> None:
    from cloud_elastic.driver.job.hosts import Blacklist, HostManager
    from cloud_elastic.providers.api import DiscoveredHosts

    hosts = HostManager(Blacklist((1.0, 2.0)))
    leaving = Drain(None, "Terminating")
    hosts.update(DiscoveredHosts(ready={"c": 4}, instances={"c": "i-1"}))
    hosts.update(DiscoveredHosts(ready={}, draining={"c": leaving}, instances={"c": "i-1"}))
    assert hosts.slots_of("c") == 4
    hosts.update(DiscoveredHosts(ready={}, draining={"c": leaving}, instances={"c": "i-2"}))  # a recycled address
    assert hosts.slots_of("c") is None
