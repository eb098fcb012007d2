"""The host groups ``--manage-capacity`` raised, at the ends of a driver's life (``driver/runtime/raised.py``),
with a real Driver and checkpoint store, and a discovery provider of this test's own.

The job's core decides when a group goes back to 0 (tests/unit/test_job_sourcing.py); these check the runtime:
a driver that waits out a crashed predecessor's workers lowers none of the groups that predecessor raised (its
workers may still train there, or a live driver elsewhere still runs the job), and keeps saying they are
raised; a job that raised nothing does not wait for a slow discovery call to end before it exits. The cost so
far rides the same sign of life: the driver that takes the job over reports its predecessor's with its own.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from cloud_elastic.checkpoint.alive import ALIVE_RECORD, DriverAlive, read_driver_alive, write_driver_alive
from cloud_elastic.config import JobConfig
from cloud_elastic.cost import CostSoFar
from cloud_elastic.driver.restart.predecessor import open_store, plan_start
from cloud_elastic.driver.runtime.driver import Driver
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery
from cloud_elastic.providers.sources import SourceSpec

pytestmark = pytest.mark.timeout(60)

#: What a crashed driver's meter last said: 1.25 of its slot-hours were free slots of a fallback host it raised.
_COST = CostSoFar(12.5, 9.75, 0.0, (("od", 9.4), ("spot", 3.1)), idle_slot_hours=1.25)


class Groups(HostDiscovery):
    """Two sources, a spot one and an on-demand fallback, with no host yet; capacity changes are recorded."""

    name = "groups"
    specs = (SourceSpec("spot", "groups"), SourceSpec("od", "groups", fallback=True))

    @classmethod
    def from_options(cls, *args, **kwargs) -> "Groups":
        return cls()

    def __init__(self, slow_s: float = 0.0) -> None:
        self.calls: list[tuple[str | None, int]] = []
        self.finds = 0
        self.slow_s = slow_s

    def find(self) -> DiscoveredHosts:
        self.finds += 1
        if self.finds > 1:
            time.sleep(self.slow_s)
        return DiscoveredHosts(ready={}, draining={})

    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        self.calls.append((source, hosts))


def test_a_driver_stopped_while_it_waits_out_its_predecessor_lowers_none_of_its_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1,
                       checkpoint_dir=str(tmp_path / "ckpt"), manage_capacity=True, driver_grace_s=60.0)
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    # The driver on another machine was alive a second ago, with the on-demand group raised.
    write_driver_alive(store, DriverAlive("j1", time.time() - 1, 60.0, "other-vm", 4242, raised=(("od", 2),),
                                          cost=_COST))
    groups = Groups()
    driver = Driver(config, groups, job_id="j2")
    threading.Timer(2.0, lambda: driver.stop("interrupted", 130)).start()  # Ctrl-C while it waits
    assert driver.run().exit_code == 130
    assert groups.calls == []  # the old workers may still train on it
    # It wrote nothing over the entry while it waited (the driver elsewhere may be alive): the entry still
    # carries the raised group and the cost so far, which the next driver takes over.
    entry = read_driver_alive(store)
    assert entry.pid == 4242 and entry.raised == (("od", 2),) and entry.cost == _COST


class StopsAtFind(Groups):
    """Groups whose first discovery call stops the driver, as a Ctrl-C then would (no timer to race); with
    ``taken_over``, its first call once the driver took the job over (it holds no raised group nor cost of its
    predecessor's apart any more)."""

    def __init__(self, taken_over: bool) -> None:
        super().__init__()
        self.taken_over, self.driver = taken_over, None

    def find(self) -> DiscoveredHosts:
        if not self.taken_over or not self.driver._carried and self.driver._carried_cost is None:
            self.driver.stop("interrupted", 130)
        return super().find()


def _after_a_crash(tmp_path, monkeypatch, taken_over: bool, forged: dict | None = None, raised_as=None, **options):
    """A driver started for job j1 an hour after its driver crashed (its workers' grace long over) having spent
    ``_COST`` (with ``forged`` over its figures) with the on-demand group raised (``raised_as``: its ``raised``
    as stored instead); the new driver is stopped as :class:`StopsAtFind` says, and returns the store and the
    capacity calls it made."""
    config, store = _crashed(tmp_path, monkeypatch, **options)
    path = tmp_path / "ckpt" / ALIVE_RECORD
    entry = json.loads(path.read_text())
    entry["cost"].update(forged or {})
    entry["raised"] = entry["raised"] if raised_as is None else raised_as
    path.write_text(json.dumps(entry))
    return store, _restarted(config, taken_over).calls


def _crashed(tmp_path, monkeypatch, **options):
    """(config, store) of job j1, whose driver on another machine crashed an hour ago having spent ``_COST`` with
    the on-demand group raised."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1,
                       checkpoint_dir=str(tmp_path / "ckpt"), manage_capacity=True, driver_grace_s=60.0,
                       discovery_interval_s=0.1, **options)
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    write_driver_alive(store, DriverAlive("j1", time.time() - 3600, 60.0, "other-vm", 4242, raised=(("od", 2),),
                                          cost=_COST))
    return config, store


def _restarted(config: JobConfig, taken_over: bool) -> StopsAtFind:
    """The driver started again for the job, stopped as :class:`StopsAtFind` says (exit code 130)."""
    groups = StopsAtFind(taken_over)
    groups.driver = Driver(config, groups, job_id="j2")
    assert groups.driver.run().exit_code == 130
    return groups


def test_a_driver_that_takes_the_job_over_reports_its_predecessors_cost_with_its_own(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    events = tmp_path / "events.jsonl"
    store, _ = _after_a_crash(tmp_path, monkeypatch, taken_over=True, events_file=str(events))
    assert "job j1: cost so far carried from the previous driver: $12.50 for 9.750 slot-hour(s) (1.250 of them on " \
           "hosts of a fallback group the job raised that ran no worker there), up to its last sign of life at " \
           in caplog.text
    assert "job j1: cost $12.50 for 9.750 slot-hour(s)" in caplog.text  # the end line: no worker ran since
    assert "; 1.250 of the slot-hour(s) were on hosts of a fallback group the job raised" in caplog.text
    written = [json.loads(line) for line in events.read_text().splitlines()]
    costs = [(e["dollars"], e["slot_hours"], e["idle_slot_hours"]) for e in written if e["event"] == "cost"]
    assert costs[-1] == (12.5, 9.75, 1.25)  # one at the takeover, at least
    assert [(e["cost"], e["idle_slot_hours"]) for e in written if e["event"] == "job_finished"] == [(12.5, 1.25)]
    last = read_driver_alive(store)  # its own sign of life, for a driver after it (had it crashed)
    assert last.is_this_process() and last.cost == _COST


@pytest.mark.parametrize("forged", [{"idle_slot_hours": 1e300}, {"idle_slot_hours": float("nan")},
                                    {"idle_slot_hours": -1.0}, {"idle_slot_hours": 10.0},  # > the 9.75 slot-hours
                                    {"dollars": -1}, {"by_source": [1]}])
def test_a_forged_figure_in_the_predecessors_cost_is_refused_in_one_line_and_its_raised_group_still_lowered(
        tmp_path, monkeypatch, caplog, forged):
    """fixI2: the cost out of bounds made the whole sign of life unreadable, and the group it said was raised
    (paid for) was left raised: no driver would set it back to 0."""
    caplog.set_level(logging.INFO)
    _, calls = _after_a_crash(tmp_path, monkeypatch, taken_over=True, forged=forged)
    refused = [r.getMessage() for r in caplog.records if "cost so far is refused" in r.getMessage()]
    assert len(refused) == 1 and "\n" not in refused[0] and len(refused[0]) < 500, refused
    assert str(tmp_path / "ckpt" / ALIVE_RECORD) in refused[0] and "counted again from $0" in refused[0]
    assert "cost so far carried" not in caplog.text  # nothing of the refused cost is taken for the job's
    assert "job j1: cost $0.00 for 0.000 slot-hour(s)" in caplog.text
    # Taken over, and set back to 0 at the end (the driver may have raised it itself first: it has no host).
    assert "the previous driver raised host source 'od' to 2" in caplog.text and calls[-1] == ("od", 0)


@pytest.mark.parametrize("raised_as", [[["od", 2]], {"od": 2, "spot": -3}, {"od": 1e9}])
def test_raised_groups_out_of_bounds_are_named_in_one_line_for_the_operator_and_the_cost_still_carried(
        tmp_path, monkeypatch, caplog, raised_as):
    """fixI2, the reverse: a ``raised`` out of bounds lost a good cost. The groups refused stay as they are (which
    ones the job raised is not known for sure): one WARNING names the file, for an operator to lower them."""
    caplog.set_level(logging.INFO)
    store, calls = _after_a_crash(tmp_path, monkeypatch, taken_over=True, raised_as=raised_as)
    refused = [r for r in caplog.records if "which host groups the previous driver raised is refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.WARNING, caplog.text
    line = refused[0].getMessage()
    assert str(tmp_path / "ckpt" / ALIVE_RECORD) in line and "set it to 0 yourself" in line and "\n" not in line
    assert ("'spot' the capacity -3" in line) == ("spot" in raised_as)
    assert "cost so far carried from the previous driver: $12.50" in caplog.text
    # Only a group the entry gave well is taken over (then set back to 0 at the end); none is set for the operator.
    kept = isinstance(raised_as, dict) and raised_as.get("od") == 2
    assert ("the previous driver raised host source 'od' to 2" in caplog.text) == kept
    assert all(source == "od" for source, _ in calls) and (calls[-1:] == [("od", 0)] if kept else True)
    assert read_driver_alive(store).cost == _COST  # its own sign of life goes on from the carried cost


@pytest.mark.parametrize("text", ['{"format": "cloud-elastic-checkpoint", "job_id": "j1", "raised": {"od": 2', "[]",
                                  '{"format": "cloud-elastic-checkpoint", "job_id": "j1", "host": "other-vm", "pid": 7, '
                                  '"alive": 1, "grace_s": NaN, "raised": {"od": 2}}'])
def test_a_sign_of_life_that_cannot_be_read_at_all_asks_the_operator_to_lower_any_group_it_raised(
        tmp_path, monkeypatch, caplog, text):
    """fixI2: the driver cannot know which groups its predecessor raised; it says so in one line naming the file,
    sets none back, and runs."""
    config, _ = _crashed(tmp_path, monkeypatch)
    (tmp_path / "ckpt" / ALIVE_RECORD).write_text(text)
    _restarted(config, taken_over=True)
    [line] = [r.getMessage() for r in caplog.records if "is unreadable" in r.getMessage()]
    assert line.startswith(f"job j1: {tmp_path / 'ckpt' / ALIVE_RECORD} is unreadable: ") and "\n" not in line
    assert "the host groups the previous driver raised (--manage-capacity), if any, are not known" in line
    assert "set it to 0 yourself once nothing needs it" in line
    assert "the previous driver raised host source" not in caplog.text


def test_a_driver_killed_while_it_waited_leaves_its_predecessors_raised_group_and_cost_to_the_next(
        tmp_path, monkeypatch, caplog):
    """fixI2: driver B, restarted on another machine after A crashed with a group raised, claimed the job and was
    killed in its wait, before its first sign of life: its claim, newer than A's entry, was taken for the last
    sign of life, and it says no group: driver C never set A's group back to 0 (paid for after the job)."""
    from cloud_elastic.checkpoint.claims import claim

    caplog.set_level(logging.INFO)
    config, store = _crashed(tmp_path, monkeypatch)  # driver A's sign of life
    assert claim(store, 1, DriverAlive("j1", time.time() - 3000, 60.0, "vm-b", 777)) is None  # driver B's
    groups = _restarted(config, taken_over=True)
    assert "the previous driver raised host source 'od' to 2" in caplog.text and groups.calls[-1] == ("od", 0)
    assert "cost so far carried from the previous driver: $12.50" in caplog.text


def test_a_driver_stopped_before_it_takes_the_job_over_carries_its_predecessors_cost_forward(tmp_path, monkeypatch):
    store, _ = _after_a_crash(tmp_path, monkeypatch, taken_over=False)  # Ctrl-C during its first discovery call
    last = read_driver_alive(store)
    assert last.is_this_process()
    assert (last.cost, last.raised) == (_COST, (("od", 2),))  # its own sign of life says both, as they were


def test_a_job_that_raised_nothing_does_not_wait_for_a_slow_discovery_call_to_exit(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1, start_timeout_s=300)
    groups = Groups(slow_s=45.0)  # a discovery call under way as the job ends (no --manage-capacity: none raised)
    driver = Driver(config, groups, job_id="j3")
    threading.Timer(2.0, lambda: driver.stop("interrupted", 130)).start()
    started = time.monotonic()
    assert driver.run().exit_code == 130
    assert time.monotonic() - started < 30  # not held by the 45 s call: nothing is raised to set back
    assert groups.calls == []



class _Cloud:
    """The provider's capacity write path: refuses ``refusals`` calls, then sets the capacity."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.capacity, self.calls = refusals, 1, 0

    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        self.calls += 1
        if self.calls <= self.refusals:
            raise RuntimeError("throttled")
        self.capacity = hosts

    def capacity_of(self, source: str) -> int:
        return self.capacity


class _BusyPoller:
    def join(self, timeout_s: float) -> bool:
        return False  # its provider call did not end in time


def _raised_job():
    from tests.unit.test_job_sourcing import Sourced

    sim = Sourced(2, manage_capacity=True)
    sim.groups(a=1, b=1)
    sim.join("a0[0]", "b0[0]")
    sim.groups(a=1)  # below --min-np: the fallback group is raised
    sim.advance(1)
    assert sim.job.capacity.sourcing.raised() == {"od": 1}
    return sim


def test_at_the_end_a_raised_group_is_tried_three_times_then_named_as_staying_raised(caplog):
    from cloud_elastic.driver.runtime import raised

    sim = _raised_job()
    lock = threading.Condition()
    refusing = _Cloud(refusals=3)
    raised.lower(sim.job, refusing, lock, None, pause_s=0)
    assert refusing.calls == 3 and sim.job.capacity.sourcing.raised() == {"od": 1}
    assert "host source 'od' stays at the desired capacity 1 this job gave it: set it to 0 yourself" in caplog.text
    cloud = _Cloud(refusals=2)
    raised.lower(sim.job, cloud, lock, None, pause_s=0)
    sim._collect()
    assert (cloud.calls, cloud.capacity, sim.job.capacity.sourcing.raised()) == (3, 0, {})
    assert ("capacity", {"source": "od", "hosts": 0, "reason": "the job is over"}) in sim.events


def test_at_the_end_a_discovery_call_that_does_not_end_leaves_the_group_named_as_raised(caplog):
    from cloud_elastic.driver.runtime import raised

    sim = _raised_job()
    cloud = _Cloud(refusals=0)
    raised.lower(sim.job, cloud, threading.Condition(), _BusyPoller(), join_s=0)
    assert cloud.calls == 0 and sim.job.capacity.sourcing.raised() == {"od": 1}
    assert "host source 'od' stays at the desired capacity 1 this job gave it: the discovery call under way did " \
           "not end within 0s; set it to 0 yourself" in caplog.text


def test_at_the_end_a_raise_still_under_way_on_the_discovery_thread_is_waited_for_not_made_beside(caplog):
    """The discovery thread may be inside the fallback provider's own set_capacity (a throttled call the SDK
    retries) while its find() is idle: a set_capacity(0) beside it would be overtaken by the late raise, and the
    group left raised while the log said 0."""
    from cloud_elastic.driver.runtime import raised
    from cloud_elastic.providers.multi import MultiSourceDiscovery
    from tests.unit.test_providers_multi import Scripted, spec

    class SlowGroup(Scripted):
        def __init__(self) -> None:
            super().__init__(DiscoveredHosts())
            self.go, self.entered = threading.Event(), threading.Event()
            self.running = self.most = 0

        def set_capacity(self, hosts, *, source=None):
            self.running += 1
            self.most = max(self.most, self.running)
            self.entered.set()
            if hosts:
                self.go.wait(5)
            super().set_capacity(hosts)
            self.running -= 1

    for released, join_s in ((False, 0.2), (True, 5.0)):
        od = SlowGroup()
        multi = MultiSourceDiscovery([(spec("spot"), Scripted(DiscoveredHosts(ready={"h": 1}))),
                                      (spec("od", fallback=True), od)])
        multi.find()
        sim = _raised_job()
        raising = threading.Thread(target=multi.set_capacity, args=(1,), kwargs={"source": "od"}, daemon=True)
        raising.start()
        assert od.entered.wait(5)
        if released:
            threading.Timer(0.2, od.go.set).start()
        caplog.clear()
        raised.lower(sim.job, multi, threading.Condition(), _BusyPoller(), join_s=join_s, pause_s=0)
        od.go.set()
        raising.join(5)
        assert od.most == 1
        if released:
            assert (od.capacity_calls, sim.job.capacity.sourcing.raised()) == ([1, 0], {})
        else:
            assert (od.capacity_calls, sim.job.capacity.sourcing.raised()) == ([1], {"od": 1})
            assert "host source 'od' stays at the desired capacity 1 this job gave it: the discovery call under " \
                   "way did not end" in caplog.text


class _Sources(_Cloud):
    """Several sources: the fallback's own call may end while another source's (and so the merged one) hangs."""

    def __init__(self, ended: bool, capacity: int | None) -> None:
        super().__init__(refusals=0)
        self.ended, self.capacity = ended, capacity

    def wait_for(self, source: str, timeout_s: float) -> bool:
        return self.ended


def test_at_the_end_a_hanging_source_holds_up_no_other_sources_group_and_a_raise_never_made_is_not_called_made(
        caplog):
    from cloud_elastic.driver.runtime import raised

    sim = _raised_job()
    cloud = _Sources(ended=True, capacity=1)
    raised.lower(sim.job, cloud, threading.Condition(), _BusyPoller(), join_s=0)
    assert (cloud.calls, cloud.capacity, sim.job.capacity.sourcing.raised()) == (1, 0, {})
    sim = _raised_job()
    held = _Sources(ended=False, capacity=None)  # the raise was held back, and the fallback's own call hangs
    with caplog.at_level(logging.INFO):
        raised.lower(sim.job, held, threading.Condition(), _BusyPoller(), join_s=0)
    assert held.calls == 0 and "stays at" not in caplog.text
    assert "host source 'od': the raise to 1 this driver asked was never made" in caplog.text


def test_while_a_restarted_driver_waits_out_its_predecessor_its_metrics_already_show_the_carried_cost(
        tmp_path, monkeypatch):
    """A scrape during the wait (up to --driver-grace) that saw the cost counter at 0, then at the carried total
    once the job is taken over, would read to Prometheus as a reset: increase() would count $12.50 twice."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1,
                       checkpoint_dir=str(tmp_path / "ckpt"), manage_capacity=True, driver_grace_s=60.0,
                       metrics_port=0)
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    write_driver_alive(store, DriverAlive("j1", time.time() - 1, 60.0, "other-vm", 4242, raised=(("od", 2),),
                                          cost=_COST))
    driver = Driver(config, Groups(), job_id="j2")
    scraped = []

    def waiting(plan) -> None:  # what a scrape sees while the driver waits, and then a Ctrl-C
        scraped.append(driver._sinks.metrics.registry.get_sample_value("cloud_elastic_cost_dollars_total"))
        driver.stop("interrupted", 130)

    monkeypatch.setattr(driver, "_wait_for_predecessor", waiting)
    assert driver.run().exit_code == 130
    assert scraped == [12.5]


def _entry_raised(store, want: dict, within_s: float = 10.0) -> dict:
    """What the sign of life on disk says was raised, once it says ``want`` or ``within_s`` has passed."""
    deadline = time.monotonic() + within_s
    while True:
        entry = read_driver_alive(store, now=time.time())
        got = dict(entry.raised) if entry is not None else None
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def test_a_group_raised_is_in_the_sign_of_life_at_once_not_at_the_next_refresh(tmp_path):
    """Review rv3 of f17d157: set_raised only stored the value, written at the next 5 s refresh: a driver killed
    in between left the group raised (paid) with no successor knowing of it."""
    from cloud_elastic.checkpoint import CheckpointStore
    from cloud_elastic.checkpoint.alive import AliveRefresher

    store = CheckpointStore(str(tmp_path / "ckpt"))
    refresher = AliveRefresher(store, "job", 60.0, interval_s=60.0).start()  # no refresh due during the test
    try:
        assert _entry_raised(store, {}) == {}
        refresher.set_raised({"od": 1})
        assert _entry_raised(store, {"od": 1}) == {"od": 1}
        refresher.set_raised({"od": 2, "od2": 1})
        assert _entry_raised(store, {"od": 2, "od2": 1}) == {"od": 2, "od2": 1}
    finally:
        refresher.close(stopped=False)


def test_a_raise_call_is_in_the_sign_of_life_before_it_is_sent(tmp_path):
    """A call made counts as the job's whatever its answer (GroupCapacity.started): a driver killed during it
    must leave the group to its successor, so the sign of life says it before the call goes (raised.write_ahead,
    as the driver wires it), though no tick of the job has seen the call yet."""
    from cloud_elastic.checkpoint import CheckpointStore
    from cloud_elastic.checkpoint.alive import AliveRefresher
    from cloud_elastic.driver.runtime import raised
    from cloud_elastic.providers.multi import MultiSourceDiscovery
    from tests.unit.test_fallback_table import Group

    store = CheckpointStore(str(tmp_path / "ckpt"))
    on_disk: list[dict | None] = []

    class Od(Group):
        def set_capacity(self, hosts, *, source=None):
            entry = read_driver_alive(store, now=time.time())  # what a kill -9 during the call leaves
            on_disk.append(entry and dict(entry.raised))
            super().set_capacity(hosts, source=source)

    multi = MultiSourceDiscovery([(SourceSpec("spot", "group"), Group("spot", "a", [])),
                                  (SourceSpec("od", "group", fallback=True), Od("od", "o", []))])
    refresher = AliveRefresher(store, "job", 60.0, interval_s=60.0).start()
    raised.write_ahead(multi, refresher)
    try:
        assert _entry_raised(store, {}) == {}
        multi.set_capacity(1, source="od")
        assert on_disk == [{"od": 1}]
        multi.set_capacity(0, source="od")  # a 0 waits for no write
        assert on_disk == [{"od": 1}, {"od": 1}]
    finally:
        refresher.close(stopped=False)
        multi.close()


def test_a_slow_sign_of_life_store_holds_a_raise_up_once_and_a_retried_raise_not_again(tmp_path):
    """Review rv6 of a26a5cf (f3_slow_store.py): with the checkpoint store hung, each retry of a refused raise waited
    5 s again for its write-ahead on the discovery thread, so every find() took 5 s (two such raises and a slow source:
    'no answer within 7.0s'). A raise waits once, at most WRITE_AHEAD_S (1 s), not again while its value is unwritten."""
    from cloud_elastic.checkpoint import CheckpointStore
    from cloud_elastic.checkpoint.alive import AliveRefresher
    from cloud_elastic.driver.runtime import raised
    from cloud_elastic.errors import CapacityError
    from cloud_elastic.providers.multi import MultiSourceDiscovery
    from tests.unit.test_fallback_table import Group

    store = CheckpointStore(str(tmp_path / "ckpt"))
    refresher = AliveRefresher(store, "job", 60.0, interval_s=60.0).start()
    assert _entry_raised(store, {}) == {}
    hung, real = threading.Event(), store.backend.write
    store.backend.write = lambda path, produce: (hung.wait(30), real(path, produce))  # a hung NFS mount, S3 PUT
    waits: list[float | None] = []
    wait_for = refresher._done.wait_for
    refresher._done.wait_for = lambda predicate, timeout=None: (waits.append(timeout), wait_for(predicate, timeout))[1]
    cloud: list[str] = []
    od = Group("od", "o", cloud)
    od.errors = [CapacityError("Throttling")] * 2
    multi = MultiSourceDiscovery([(SourceSpec("spot", "group"), Group("spot", "a", cloud)),
                                  (SourceSpec("od", "group", fallback=True), od)])
    raised.write_ahead(multi, refresher)
    try:
        multi.set_capacity(1, source="od")  # refused, retried at each find()
        multi.find()
        multi.find()
        assert cloud == ["od=1", "od=1", "od=1"]
        assert len(waits) == 1 and waits[0] <= 1.0  # one wait, at most 1 s, for the first call only
        multi.set_capacity(2, source="od")  # a new, larger raise waits again (once)
        assert len(waits) == 2 and waits[1] <= 1.0
    finally:
        hung.set()
        refresher.close(stopped=False)
        multi.close()
