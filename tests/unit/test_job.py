"""Scripted membership timelines for the driver state machine (cloud_elastic.driver.job.elastic_job).

:class:`Sim` plays the driver runtime around one :class:`ElasticJob` on a fake
clock: it carries out nothing, but records the queued actions and lets tests
move workers through register / rendezvous / heartbeat / exit.
"""

from __future__ import annotations

import logging
import random

import pytest

from cloud_elastic.driver.job.hosts import Blacklist, HostManager, Slot
from cloud_elastic.driver.job.elastic_job import (
    Assignment, ElasticJob, ExitOrder, Finish, Launch, Phase, Policy, Release, Stop, WorkerState,
)
from cloud_elastic.driver.launch.api import ExitStatus
from cloud_elastic.events import validate
from cloud_elastic.driver.job.ranks import RankInfo
from cloud_elastic.providers.api import DiscoveredHosts, Drain

pytestmark = pytest.mark.timeout(10)

T0 = 1000.0
CRASH = ExitStatus(1)
KILLED = ExitStatus(-9)
CLEAN = ExitStatus(0)
UNREACHABLE = ExitStatus(255, transport_error="host unreachable: connection refused")
#: Random(0) gives the first failure of a slot 10.84 s with the default range; this clears it.
PAST_FIRST_COOLDOWN_S = 11.5

Reply = Assignment | ExitOrder | None


class Sim:
    """The driver runtime, played by hand around one :class:`ElasticJob`.

    Time moves only through :meth:`advance`, which first lets every live,
    registered worker heartbeat (except those in ``silent``), as the real
    heartbeat threads would. Workers are named by slot (``"a[0]"``): the
    latest worker launched on that slot.
    """

    def __init__(
        self,
        np: int = 2,
        *,
        min_np: int | None = None,
        max_np: int | None = None,
        cooldown: tuple[float, float] = (10.0, 300.0),
        missing_grace: float = 0.0,
        **policy: float,
    ) -> None:
        min_np = np if min_np is None else min_np
        max_np = np if max_np is None else max_np
        self.job = ElasticJob(
            Policy(np, min_np, max_np, **policy),
            HostManager(Blacklist(cooldown, random.Random(0)), missing_grace_s=missing_grace),
            job_id="t",
        )
        self.now = T0
        self.launched: list[Launch] = []
        self.stops: list[Stop] = []
        self.finished: list[Finish] = []
        self.released: list[Release] = []
        self.events: list[tuple[str, dict]] = []
        self.silent: set[str] = set()
        self.commits: dict[str, int] = {}  # worker id -> commits it reports with its heartbeats
        self.job.start(self.now)

    # ------------------------------------------------------------ plumbing
    def _collect(self) -> None:
        for kind, fields in self.job.take_events():
            validate(kind, fields)  # every event the job emits fits the documented schema
            self.events.append((kind, fields))
        for action in self.job.take_actions():
            kinds = {Launch: self.launched, Stop: self.stops, Finish: self.finished, Release: self.released}
            kinds[type(action)].append(action)

    def id(self, slot: str) -> str:
        """Worker id of the latest worker launched on ``slot`` (``"a[0]"``)."""
        ids = [a.worker_id for a in self.launched if str(a.slot) == slot]
        assert ids, f"nothing was launched on {slot}"
        return ids[-1]

    def slots_launched(self) -> list[str]:
        return [str(a.slot) for a in self.launched]

    @property
    def outcome(self) -> Finish | None:
        assert len(self.finished) <= 1
        return self.finished[0] if self.finished else None

    # ---------------------------------------------------------------- events
    def advance(self, seconds: float) -> None:
        """Move time on in ticks of at most 0.5 s, as the driver's loop does (a longer gap is a driver stall)."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + 0.5)
            for wid, w in self.job.workers.items():
                if w.alive and w.registered and wid not in self.silent:
                    self.job.heartbeat(wid, self.now, self.commits.get(wid))
            self.job.tick(self.now)
            self._collect()

    def stall(self, seconds: float) -> None:
        """The driver itself does not run for ``seconds`` (SIGSTOP, a swapped VM): no tick, no heartbeat."""
        self.now += seconds

    def discover(self, ready: dict[str, int], draining: dict[str, Drain] | None = None) -> None:
        self.job.discovered(DiscoveredHosts(ready=ready, draining=draining or {}), self.now)
        self._collect()

    def join(self, *slots: str, reason: str = "start") -> dict[str, Reply]:
        """These workers connect if new and come to rendezvous from their last round; return replies."""
        for slot in slots:
            wid = self.id(slot)
            w = self.job.workers[wid]
            if not w.registered:
                assert self.job.registered(wid, self.now)
            self.job.rendezvous(wid, w.round, reason, self.now, self.commits.get(wid),
                                addresses=(self.address(w.slot.host),))
        self._collect()
        return {slot: self.reply(slot) for slot in slots}

    def address(self, host: str) -> str:
        """The IP address of ``host``, which its workers give at rendezvous as a real worker does (one of 10.77/16)."""
        known = self.__dict__.setdefault("_addresses", {})
        return known.setdefault(host, f"10.77.{len(known) // 250}.{len(known) % 250 + 1}")

    def commit(self, *slots: str, count: int | None = None) -> None:
        """These workers have committed (``count`` times in all; default one more), as their heartbeats will say."""
        for slot in slots:
            wid = self.id(slot)
            self.commits[wid] = count if count is not None else self.commits.get(wid, 0) + 1
            self.job.heartbeat(wid, self.now, self.commits[wid])

    def reply(self, slot: str) -> Reply:
        return self.job.assignment(self.id(slot))

    def exit(self, slot: str, status: ExitStatus = CRASH) -> None:
        self.job.exited(self.id(slot), status, self.now)
        self._collect()

    def complete(self, slot: str) -> None:
        """The worker reports that its training function returned."""
        self.job.completed(self.id(slot), self.now)
        self._collect()

    def discovery_failed(self, message: str, *, fatal: bool = False) -> None:
        self.job.discovery_failed(message, fatal=fatal, now=self.now)
        self._collect()

    def poll(self, slot: str):
        return self.job.heartbeat(self.id(slot), self.now)

    def start(self, ready: dict[str, int]) -> dict[str, Reply]:
        """Discover ``ready`` and bring every launched worker to the first round."""
        self.discover(ready)
        return self.join(*self.slots_launched())

    # --------------------------------------------------------------- queries
    def layout(self) -> list[str]:
        """Slots of the current round's members, in rank order."""
        members = [
            w for w in self.job.workers.values()
            if w.alive and w.round == self.job.round and w.rank is not None
        ]
        return [str(w.slot) for w in sorted(members, key=lambda w: w.rank)]

    def blocked(self, slot: str) -> bool:
        host, index = slot.rstrip("]").split("[")
        return self.job.hosts.blacklist.blocked(Slot(host, int(index)), self.now)

    def active(self) -> int:
        staying = (WorkerState.STARTING, WorkerState.CONNECTED, WorkerState.WAITING, WorkerState.RUNNING)
        return sum(1 for w in self.job.workers.values() if w.state in staying)


def assert_round(replies: dict[str, Reply], round_: int, *, needs_sync: bool) -> None:
    """Every reply is an assignment to ``round_`` with the same ``needs_sync``."""
    for slot, reply in replies.items():
        assert isinstance(reply, Assignment), f"{slot} got {reply!r}"
        assert (reply.round, reply.needs_sync) == (round_, needs_sync), slot


def failed(sim: Sim, *parts: str) -> None:
    outcome = sim.outcome
    assert outcome is not None and not outcome.success and outcome.exit_code == 1, outcome
    for part in parts:
        assert part in outcome.reason


def started(np: int = 2, ready: dict[str, int] | None = None, **kwargs) -> Sim:
    """A job whose first round has formed on ``ready`` (default ``{"a": np}``)."""
    sim = Sim(np, **kwargs)
    assert_round(sim.start(ready or {"a": np}), 1, needs_sync=True)
    return sim


# ----------------------------------------------------------------- start-up
def test_start_waits_for_np_slots_then_launches_up_to_max_np() -> None:
    sim = Sim(2, max_np=3)
    sim.discover({"a": 1})
    assert sim.launched == []
    sim.discover({"a": 1, "b": 3})
    assert sim.slots_launched() == ["a[0]", "b[0]", "b[1]"]


def test_start_timeout_fails_naming_slots_and_np() -> None:
    sim = Sim(2, start_timeout_s=30)
    sim.discover({"a": 1})
    sim.advance(29)
    assert sim.outcome is None
    sim.advance(2)
    failed(sim, "only 1 slot(s) available after 30s", "-np 2")
    assert sim.launched == []


def test_first_round_forms_once_np_are_ready_and_a_late_worker_joins_as_scale_up() -> None:
    """-np 2 --max-np 3: the first round does not wait for the third launched worker (it used to, up to
    --start-timeout, when that worker never arrived)."""
    sim = Sim(2, max_np=3)
    sim.discover({"b": 1, "a": 2})
    assert sim.join("a[1]") == {"a[1]": None}
    assert sim.job.phase is Phase.STARTING
    assert_round(sim.join("b[0]"), 1, needs_sync=True)
    assert sim.layout() == ["b[0]", "a[1]"]  # b was seen first
    assert sim.job.phase is Phase.RUNNING
    assert sim.join("a[0]") == {"a[0]": None}  # arrives late: a graceful update admits it
    assert sim.poll("b[0]").update_gen == 1
    assert_round(sim.join("b[0]", "a[1]", reason="update") | {"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["b[0]", "a[1]", "a[0]"]


def test_first_round_with_fewer_than_np_when_the_rest_failed_to_start() -> None:
    sim = Sim(3, min_np=2)
    sim.discover({"a": 3})
    sim.exit("a[2]")
    assert_round(sim.join("a[0]", "a[1]"), 1, needs_sync=True)


def test_ranks_on_a_multi_host_layout_and_after_a_failure() -> None:
    sim = started(4, {"a": 2, "b": 2}, min_np=1)
    assert sim.reply("b[1]").ranks == RankInfo(3, 4, 1, 2, 1, 2)
    sim.exit("a[0]", KILLED)
    assert_round(sim.join("b[1]", "a[1]", "b[0]", reason="failure"), 2, needs_sync=True)
    assert sim.layout() == ["a[1]", "b[0]", "b[1]"]  # survivors keep their relative order
    assert sim.reply("a[1]").ranks == RankInfo(0, 3, 1, 2, 0, 2)
    assert sim.reply("b[1]").ranks == RankInfo(2, 3, 1, 2, 1, 2)
    sim.advance(PAST_FIRST_COOLDOWN_S)
    assert sim.slots_launched()[-1] == "a[0]"
    sim.join("a[0]")
    sim.join("a[1]", "b[0]", "b[1]", reason="update")
    assert sim.layout() == ["a[1]", "b[0]", "b[1]", "a[0]"]  # the newcomer follows
    assert sim.reply("a[0]").ranks == RankInfo(3, 4, 0, 2, 0, 2)


def test_newcomers_follow_survivors_older_hosts_first() -> None:
    sim = started(1, {"a": 1}, max_np=4)
    sim.discover({"a": 1, "c": 1})
    sim.discover({"a": 2, "c": 1})  # a grows after c appeared: a[1] launches last
    assert sim.slots_launched() == ["a[0]", "c[0]", "a[1]"]
    sim.join("c[0]", "a[1]")
    assert_round(sim.join("a[0]", reason="update"), 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]", "c[0]"]
    sim.exit("a[0]")  # survivors keep their rank order, not their launch order
    assert_round(sim.join("c[0]", "a[1]", reason="failure"), 3, needs_sync=True)
    assert sim.layout() == ["a[1]", "c[0]"]


def test_host_that_left_and_returned_ranks_after_hosts_seen_meanwhile() -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    sim.exit("c[0]")  # c cools down; b leaves and returns meanwhile
    sim.join("a[0]", "b[0]", reason="failure")
    sim.discover({"a": 1, "c": 1})
    assert isinstance(sim.join("b[0]", reason="update")["b[0]"], ExitOrder)
    sim.exit("b[0]", CLEAN)
    sim.discover({"a": 1, "c": 1, "b": 1})
    sim.advance(PAST_FIRST_COOLDOWN_S)
    assert sim.slots_launched()[-2:] == ["b[0]", "c[0]"]  # b's newcomer started first
    sim.join("b[0]", "c[0]")
    sim.join("a[0]", reason="update")
    assert sim.layout() == ["a[0]", "c[0]", "b[0]"]


# ---------------------------------------------------------------- failures
@pytest.mark.parametrize("status", [CRASH, KILLED], ids=["exit-1", "sigkill"])
def test_member_failure_aborts_round_and_survivors_resync_in_order(status: ExitStatus) -> None:
    sim = started(3, {"a": 2, "b": 1}, min_np=2)
    assert sim.poll("b[0]").abort_round == 0
    sim.exit("a[0]", status)  # rank 0, the oldest, dies
    assert sim.poll("b[0]").abort_round == 1
    assert sim.blocked("a[0]") and not sim.blocked("a[1]")
    assert len(sim.launched) == 3  # the failed slot is cooling down; nothing else is free
    assert sim.join("b[0]", reason="failure") == {"b[0]": None}  # waits for the other survivor
    replies = sim.join("a[1]", reason="failure")
    assert_round({**replies, "b[0]": sim.reply("b[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[1]", "b[0]"]
    assert sim.job.resets == 1


def test_member_reporting_a_failed_collective_aborts_the_round_for_its_peers() -> None:
    # Nobody died: one worker's collective failed (a broken link, a group that would not
    # form). Its peers may be blocked on it, and only an abort releases them.
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=2)
    assert sim.poll("b[0]").abort_round == 0
    assert sim.join("a[0]", reason="failure") == {"a[0]": None}
    assert sim.poll("b[0]").abort_round == 1
    replies = sim.join("b[0]", "c[0]", reason="failure")
    assert_round({**replies, "a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "b[0]", "c[0]"]


def test_member_leaving_for_an_update_does_not_abort_the_round() -> None:
    sim = started(2, {"a": 2}, max_np=3)
    sim.discover({"a": 2, "b": 1})
    sim.join("b[0]")
    sim.join("a[0]", reason="update")
    assert sim.poll("a[1]").abort_round == 0


def test_newcomer_on_added_host_requests_update_and_joins_with_sync() -> None:
    sim = started(2, {"a": 2}, max_np=3)
    sim.discover({"a": 2, "b": 1})
    assert sim.slots_launched()[-1] == "b[0]"
    assert sim.poll("a[0]").update_gen == 0  # a newcomer still starting is not waited for
    assert sim.join("b[0]") == {"b[0]": None}
    poll = sim.poll("a[0]")
    assert (poll.update_gen, poll.abort_round) == (1, 0)
    replies = sim.join("a[0]", "a[1]", reason="update")
    assert_round({**replies, "b[0]": sim.reply("b[0]")}, 2, needs_sync=True)
    assert sim.reply("b[0]").update_gen == 1
    assert sim.layout() == ["a[0]", "a[1]", "b[0]"]
    assert sim.poll("a[0]").update_gen == 1  # no second request once the newcomer is in


def test_newcomer_on_a_freed_slot_after_its_cooldown() -> None:
    sim = started(2, {"a": 2}, min_np=1)
    sim.exit("a[1]")
    assert_round(sim.join("a[0]", reason="failure"), 2, needs_sync=True)
    sim.advance(PAST_FIRST_COOLDOWN_S)
    assert sim.slots_launched() == ["a[0]", "a[1]", "a[1]"]
    sim.join("a[1]")
    assert sim.poll("a[0]").update_gen == 1
    assert_round(sim.join("a[0]", reason="update"), 3, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]"]


@pytest.mark.parametrize(
    ("draining", "why"),
    [(None, "host b left the group"), ({"b": Drain(reason="spot interruption")}, "spot interruption")],
    ids=["removed", "draining"],
)
def test_leaving_host_exits_at_rendezvous_and_survivors_skip_sync(draining, why: str) -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    sim.discover({"a": 1, "c": 1}, draining)
    assert sim.stops == []  # graceful: b leaves at its next commit
    poll = sim.poll("a[0]")
    assert (poll.update_gen, poll.abort_round) == (1, 0)
    assert_round(sim.join("a[0]", "c[0]", reason="update"), 2, needs_sync=False)
    assert sim.layout() == ["a[0]", "c[0]"]
    order = sim.join("b[0]", reason="update")["b[0]"]
    assert isinstance(order, ExitOrder) and why in order.reason
    sim.exit("b[0]", CLEAN)
    assert sim.outcome is None
    assert sim.job.hosts.blacklist.failures(Slot("b", 0)) == 0
    assert sim.poll("a[0]").abort_round == 0


def test_starting_worker_on_a_removed_host_is_stopped() -> None:
    sim = started(1, {"a": 1}, max_np=2)
    sim.discover({"a": 1, "b": 1})
    sim.discover({"a": 1})
    assert [(s.worker_id, s.immediate) for s in sim.stops] == [(sim.id("b[0]"), False)]
    sim.exit("b[0]", ExitStatus(-15))
    assert sim.poll("a[0]").update_gen == 0 and sim.outcome is None


def test_heartbeat_loss_gives_the_worker_up_and_aborts_the_round() -> None:
    sim = started(2, {"a": 2}, min_np=1, heartbeat_timeout_s=5)
    sim.silent.add(sim.id("a[1]"))
    sim.advance(4.9)
    assert sim.stops == []
    sim.advance(0.2)
    assert [(s.worker_id, s.immediate) for s in sim.stops] == [(sim.id("a[1]"), True)]
    assert "heartbeats" in sim.stops[0].reason
    assert sim.poll("a[0]").abort_round == 1
    assert sim.poll("a[1]") is None
    assert sim.blocked("a[1]")
    sim.exit("a[1]", KILLED)  # the kill lands later; it is not a second failure
    assert sim.job.hosts.blacklist.failures(Slot("a", 1)) == 1
    assert_round(sim.join("a[0]", reason="failure"), 2, needs_sync=True)


def test_a_heartbeat_that_arrived_earlier_than_the_last_one_looked_at_does_not_move_last_seen_back() -> None:
    """A held poll is looked at with its arrival time, which may precede another call already counted."""
    sim = started(2, {"a": 2}, min_np=1, heartbeat_timeout_s=5)
    sim.silent.add(sim.id("a[1]"))
    sim.advance(3.0)
    sim.job.heartbeat(sim.id("a[1]"), sim.now)
    sim.job.heartbeat(sim.id("a[1]"), sim.now - 2.0)  # a held poll's late look at its early arrival
    sim.advance(4.9)
    assert sim.stops == []  # silent 4.9 s since the newest arrival: not yet
    sim.advance(0.2)
    assert [s.worker_id for s in sim.stops] == [sim.id("a[1]")]


def test_all_workers_failing_fails_the_job() -> None:
    sim = started(2, {"a": 2}, min_np=1)
    sim.exit("a[0]")
    assert sim.outcome is None
    sim.exit("a[1]", KILLED)
    failed(sim, "all workers failed", "killed by signal 9")


def test_exit_zero_before_completion_is_a_failure() -> None:
    sim = started(2, {"a": 2}, min_np=1)
    sim.exit("a[1]", CLEAN)
    assert sim.blocked("a[1]")
    assert sim.poll("a[0]").abort_round == 1
    sim.exit("a[0]", CLEAN)
    failed(sim, "all workers failed", "exited with code 0 before its training function returned")


def test_transport_error_blacklists_every_slot_of_that_host_only() -> None:
    sim = started(4, {"a": 2, "b": 2}, min_np=1)
    sim.exit("b[0]", UNREACHABLE)
    assert sim.blocked("b[0]") and sim.blocked("b[1]")
    assert not sim.blocked("a[0]") and not sim.blocked("a[1]")
    assert sim.poll("a[0]").abort_round == 1


def test_reset_limit_exceeded_fails_naming_the_limit() -> None:
    sim = started(3, {"a": 3}, min_np=1, reset_limit=1)
    sim.exit("a[0]")
    assert_round(sim.join("a[1]", "a[2]", reason="failure"), 2, needs_sync=True)
    sim.exit("a[1]")
    sim.join("a[2]", reason="failure")
    failed(sim, "reset limit exceeded", "--reset-limit 1")
    assert sim.job.resets == 1  # the one round formed after the first; the refused one never formed


def test_below_min_np_past_elastic_timeout_fails_with_last_failure() -> None:
    sim = started(2, {"a": 2}, cooldown=(300, 300), elastic_timeout_s=60)
    sim.exit("a[1]")
    assert sim.join("a[0]", reason="failure") == {"a[0]": None}
    sim.advance(59)
    assert sim.outcome is None
    sim.advance(2)
    failed(sim, "fewer than --min-np 2", "elastic timeout", "exited with code 1")


def test_capacity_back_before_elastic_timeout_keeps_the_job() -> None:
    sim = started(2, {"a": 2}, max_np=3, cooldown=(300, 300), elastic_timeout_s=60)
    sim.exit("a[1]")
    sim.join("a[0]", reason="failure")
    sim.advance(30)
    sim.discover({"a": 2, "b": 1})
    sim.join("b[0]")
    assert sim.layout() == ["a[0]", "b[0]"]
    sim.advance(100)
    assert sim.outcome is None


def test_never_more_than_max_np_workers() -> None:
    sim = started(2, {"a": 2}, min_np=1, max_np=3, cooldown=(0, 0))
    sim.discover({"a": 2, "b": 2, "c": 2})
    assert sim.slots_launched() == ["a[0]", "a[1]", "b[0]"]
    sim.join("b[0]")
    sim.join("a[0]", "a[1]", reason="update")
    assert len(sim.layout()) == 3
    sim.exit("a[1]")  # a replacement starts at once on a free slot (0 0 keeps a[1] off for good), still within max_np
    assert sim.active() == 3 and len(sim.launched) == 4


# -------------------------------------------------------------- completion
def test_completion_finishes_when_everyone_exited() -> None:
    sim = started(3, {"a": 3})
    sim.complete("a[0]")
    assert sim.job.phase is Phase.FINISHING
    order = sim.join("a[1]", reason="update")["a[1]"]
    assert isinstance(order, ExitOrder) and "finishing" in order.reason
    sim.discover({"a": 3, "b": 1})
    assert len(sim.launched) == 3  # no scale-up while finishing
    sim.exit("a[0]", CLEAN)
    sim.exit("a[1]", CLEAN)
    sim.complete("a[2]")
    assert sim.outcome is None
    sim.exit("a[2]", CLEAN)
    assert sim.outcome == Finish(True, "training completed on 2 worker(s) after 0 reset(s)", 0)


def test_worker_still_running_past_the_finish_timeout_is_stopped_and_fails_the_job() -> None:
    sim = started(2, {"a": 2}, finish_timeout_s=30)
    sim.complete("a[0]")
    sim.exit("a[0]", CLEAN)
    sim.advance(29)
    assert sim.outcome is None
    sim.advance(2)
    assert [s.worker_id for s in sim.stops] == [sim.id("a[1]")]
    assert sim.outcome is not None and not sim.outcome.success and sim.outcome.exit_code == 1
    assert "a[1]#2 (rank 1) was still running 30s after training completed (--finish-timeout 30)" in sim.outcome.reason


def test_a_worker_still_starting_when_training_completes_is_stopped_at_once() -> None:
    """A newcomer that never registered has no part in the result: the job does not wait 30 s for it."""
    sim = started(2, {"a": 2}, max_np=3, finish_timeout_s=30)
    sim.discover({"a": 2, "b": 1})
    straggler = sim.id("b[0]")
    sim.complete("a[0]")
    sim.complete("a[1]")
    assert [s.worker_id for s in sim.stops] == [straggler]
    sim.exit("a[0]", CLEAN)
    sim.exit("a[1]", CLEAN)
    sim.exit("b[0]", KILLED)
    assert sim.outcome == Finish(True, "training completed on 2 worker(s) after 0 reset(s)", 0)
    assert not any(kind == "worker_failed" for kind, _ in sim.events)


# --------------------------------------------------------------- discovery
def test_first_discovery_failures_are_retried_until_start_timeout() -> None:
    sim = Sim(2, start_timeout_s=30)
    sim.discovery_failed("throttled")
    sim.advance(20)
    sim.discovery_failed("throttled")
    assert sim.outcome is None
    sim.discover({"a": 2})
    assert sim.slots_launched() == ["a[0]", "a[1]"]


def test_first_discovery_failing_past_start_timeout_fails() -> None:
    sim = Sim(2, start_timeout_s=30)
    sim.discovery_failed("throttled")
    sim.advance(31)
    sim.discovery_failed("throttled")
    failed(sim, "host discovery kept failing for 30s (--start-timeout): throttled")


def test_first_discovery_fatal_failure_fails_at_once() -> None:
    sim = Sim(2)
    sim.discovery_failed("no such group", fatal=True)
    failed(sim, "host discovery failed: no such group")


def _train_while_discovery_fails(sim: Sim, seconds: int, slots: tuple[str, ...], error: str = "throttled", *,
                                 fatal: bool = False) -> None:
    """Every 30 s of ``seconds``: the workers on ``slots`` commit and progress (their heartbeats say so) and
    discovery fails."""
    for _ in range(seconds // 30):
        sim.advance(30)
        sim.commit(*slots)
        for slot in slots:  # progress too (the round is not stuck: --progress-timeout)
            sim.job.heartbeat(sim.id(slot), sim.now, progress=sim.commits[sim.id(slot)])
        sim.discovery_failed(error, fatal=fatal)


def test_later_discovery_failures_never_end_a_job_that_trains_at_min_np() -> None:
    """Review s64 rvK: discovery failing past --elastic-timeout (an API throttled for 10 min, a permission taken away,
    a control-plane upgrade) ended a healthy job. It is the job's word on which hosts exist, not on whether its
    workers live: the job keeps its hosts and trains on, however long discovery fails."""
    sim = started(2, {"a": 1, "b": 1}, elastic_timeout_s=60)
    _train_while_discovery_fails(sim, 600, ("a[0]", "b[0]"))  # 10 minutes, ten times --elastic-timeout
    assert sim.outcome is None and sim.stops == [] and sim.poll("a[0]").abort_round == 0
    sim.discover({"a": 1, "b": 1})
    assert sim.outcome is None and sim.job.discovery_failing_since is None


def test_below_min_np_while_discovery_fails_the_job_ends_after_elastic_timeout_saying_so() -> None:
    """Discovery failing cannot bring a host to take a lost worker's place: below --min-np the job waits
    --elastic-timeout, as for any wait for hosts, and its end line says that discovery has been failing."""
    sim = started(2, {"a": 1, "b": 1}, elastic_timeout_s=60, cooldown=(300, 300))
    sim.discovery_failed("throttled")
    sim.advance(90)
    sim.discovery_failed("throttled")
    sim.exit("b[0]", KILLED)  # its slot cools down for 300 s: no round of --min-np 2 can form meanwhile
    sim.advance(59)
    sim.discovery_failed("throttled")
    assert sim.outcome is None
    sim.advance(2)
    failed(sim, "fewer than --min-np 2 worker(s) for 60s (elastic timeout); last failure: ",
           "; host discovery has failed for 150s, so no new host can be seen: throttled")


def test_a_fatal_discovery_error_after_discovery_worked_keeps_the_hosts_and_the_job_trains_on(caplog) -> None:
    """An AWS session token expiring mid-job (ExpiredToken; the next call refreshes it) ended a healthy job at once;
    one that never passes (a permission taken away) ended it after --elastic-timeout: now neither does."""
    sim = started(2, {"a": 2}, elastic_timeout_s=60)
    caplog.set_level(logging.WARNING, logger="cloud_elastic")
    sim.discovery_failed("An error occurred (ExpiredToken)", fatal=True)
    sim.advance(5)
    sim.discovery_failed("An error occurred (ExpiredToken)", fatal=True)
    assert sim.outcome is None and sim.stops == [] and sim.poll("a[0]").abort_round == 0
    warned = [r.getMessage() for r in caplog.records if "ExpiredToken" in r.getMessage()]
    assert len(warned) == 1 and "the job keeps its current hosts" in warned[0], warned
    sim.discover({"a": 2})  # the next call worked
    _train_while_discovery_fails(sim, 600, ("a[0]", "a[1]"), "AccessDenied", fatal=True)
    assert sim.outcome is None and sim.stops == [] and sim.poll("a[0]").abort_round == 0


# -------------------------------------------------------- bugs found here
def test_bug_single_host_outage_counts_once_per_slot() -> None:
    """BUG job.py:349: each worker on an unreachable host re-blacklists every slot of it.

    Three workers reporting one outage give every slot three failures, so the
    host is blocked 40 s (the third back-off step) instead of the first 10 s.
    """
    sim = started(4, {"a": 1, "b": 3}, min_np=1)  # past the first round: not a host still booting
    for slot in ("b[0]", "b[1]", "b[2]"):
        sim.exit(slot, UNREACHABLE)
    assert [sim.job.hosts.blacklist.failures(Slot("b", i)) for i in range(3)] == [1, 1, 1]
    sim.advance(PAST_FIRST_COOLDOWN_S)
    assert sorted(sim.slots_launched()[4:]) == ["b[0]", "b[1]", "b[2]"]


def test_bug_leaving_member_dying_mid_round_aborts_the_round() -> None:
    """BUG job.py:299: a draining host's worker killed before its commit is not a failure.

    The survivors may be blocked in a collective with it; only ``abort_round``
    makes them abandon it (worker/context.py ``wait``), so they hang until the
    collective timeout.
    """
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    sim.discover({"a": 1, "c": 1}, {"b": Drain(reason="spot interruption")})
    sim.exit("b[0]", KILLED)  # the cloud took b before its worker reached a commit
    assert sim.poll("a[0]").abort_round == 1


def test_bug_leaving_member_losing_heartbeat_aborts_the_round() -> None:
    """BUG job.py:389: the same gap when the leaving worker goes silent instead of exiting."""
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1, heartbeat_timeout_s=5)
    sim.discover({"a": 1, "c": 1}, {"b": Drain(reason="spot interruption")})
    sim.silent.add(sim.id("b[0]"))
    sim.advance(6)
    assert [s.immediate for s in sim.stops] == [True]
    assert sim.poll("a[0]").abort_round == 1


def test_bug_crash_looping_replacement_does_not_reset_elastic_timeout() -> None:
    """BUG job.py:430: a relaunch counts toward --min-np before it reaches rendezvous.

    A slot whose worker crashes on every start resets the below-min-np timer at
    each relaunch; with back-off capped below the elastic timeout (the default
    300 s < 600 s), the job waits forever instead of failing.
    """
    sim = started(2, {"a": 2}, cooldown=(10, 30), elastic_timeout_s=100)
    sim.exit("a[1]")
    sim.join("a[0]", reason="failure")
    while sim.outcome is None and sim.now < T0 + 400:
        sim.advance(1)
        newest = sim.job.workers[sim.id("a[1]")]
        if newest.alive:
            sim.exit("a[1]")  # crashes before reaching rendezvous, every time
    assert len(sim.launched) > 3
    failed(sim, "fewer than --min-np 2")
    assert sim.now <= T0 + 110
