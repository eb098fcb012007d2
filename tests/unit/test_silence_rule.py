"""The fast silence rule (driver/job/liveness.py) on scripted timelines and on recorded heartbeat traces.

A member is given up before the heartbeat timeout only when its heartbeats stopped for longer
than its own adaptive limit *and* its peers wait for it in a collective; the stall is named
(log and ``collective_stalled`` event) before. The recorded traces
(``data/heartbeat_traces.json``, from ``benchmarks/heartbeat_traces.py``) are real arrivals
at a driver: three loopback workers on the 2-core machine, as it was (*jittery*), with two CPU
hogs beside them (*loaded*), and with one worker collecting 3 million objects every 10 s
(*paused*). They are replayed with the worst case for a false alarm: peers always waiting for
the worker judged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.liveness import FAST_FLOOR_S, SilenceWatch, silence_limit
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.protocol import FlightEntry

pytestmark = pytest.mark.timeout(30)

TRACES = json.loads((Path(__file__).parent / "data" / "heartbeat_traces.json").read_text())
TIMEOUT = 5.0
TICK = 0.05  # the driver's loop


def members(n: int = 3, round_: int = 1) -> list[WorkerRecord]:
    out = []
    for i in range(n):
        w = WorkerRecord(f"w{i}", Slot(f"10.0.0.{i + 1}", 0), seq=i, launched_at=0.0, last_seen=0.0)
        for state in (WorkerState.CONNECTED, WorkerState.WAITING, WorkerState.RUNNING):
            w.to(state)
        w.round, w.rank = round_, i
        out.append(w)
    return out


class Sim:
    """A SilenceWatch fed heartbeats at given times and scanned every tick, as the driver does."""

    def __init__(self, workers: list[WorkerRecord]) -> None:
        self.events: list[tuple[str, dict]] = []
        self.watch = SilenceWatch(TIMEOUT, 60.0, lambda kind, **f: self.events.append((kind, f)))
        self.workers = {w.worker_id: w for w in workers}
        self.lost: dict[str, tuple[float, str]] = {}
        self.events_at_loss: dict[str, int] = {}

    def beat(self, wid: str, t: float, flight: FlightEntry | None, pause_s: float = 0.0) -> None:
        if wid in self.lost:
            return
        self.workers[wid].last_seen = t
        self.watch.heard(wid, t, flight, pause_s)

    def scan(self, t: float) -> None:
        alive = [w for w in self.workers.values() if w.worker_id not in self.lost]
        for w, what in self.watch.overdue(alive, len(self.workers), t, t, round_=1):
            self.lost[w.worker_id] = (t, what)
            self.events_at_loss[w.worker_id] = len(self.events)

    def run(self, arrivals: list[tuple[float, str, FlightEntry | None, float]], until: float) -> None:
        arrivals = sorted(arrivals, key=lambda a: a[0])
        t, i = 0.0, 0
        while t <= until:
            while i < len(arrivals) and arrivals[i][0] <= t:
                at, wid, flight, pause = arrivals[i]
                self.beat(wid, at, flight, pause)
                i += 1
            self.scan(t)
            t = round(t + TICK, 6)


def steady(wid: str, start: float, end: float, flight, every: float = 0.5, pause: float = 0.0) -> list:
    out, t = [], start
    while t < end:
        out.append((round(t, 6), wid, flight(t) if callable(flight) else flight, pause))
        t += every
    return out


def waiting_since(t0: float, seq: int = 5, op: str = "gradient allreduce"):
    return lambda t: FlightEntry(1, seq, op, "entered", round(max(0.0, t - t0), 3))


BEHIND = FlightEntry(1, 4, "gradient allreduce", "completed", 0.0)


# ------------------------------------------------------------------ scripted
def test_a_member_silent_while_its_peers_wait_for_it_is_named_then_given_up_by_the_fast_rule() -> None:
    sim = Sim(members())
    beats = steady("w1", 0.0, 10.0, BEHIND)  # stops at 10 s, its last report: #4 completed
    for wid in ("w0", "w2"):
        beats += steady(wid, 0.0, 10.2, BEHIND) + steady(wid, 10.2, 30.0, waiting_since(10.1))
    sim.run(beats, until=20.0)
    t, what = sim.lost["w1"]
    assert list(sim.lost) == ["w1"] and t < 9.5 + TIMEOUT  # long before the heartbeat timeout
    assert "while rank(s) 0, 2 waited" in what and "collective #5 (gradient allreduce) of round 1" in what, what
    kinds = [k for k, _ in sim.events[: sim.events_at_loss["w1"]]]
    assert kinds == ["collective_stalled"]  # named before it is given up
    stalled = sim.events[0][1]
    assert (stalled["round"], stalled["seq"], stalled["op"], stalled["waiting"]) == (1, 5, "gradient allreduce", [0, 2])
    assert [(m["rank"], m["worker"], m["host"], m["slot"]) for m in stalled["missing"]] == [(1, "w1", "10.0.0.2", 0)]
    assert stalled["missing"][0]["last"].startswith("#4 gradient allreduce of round 1 completed")
    assert stalled["verdict"] == "silent rank(s) given up"


def test_the_fast_rule_works_from_the_start_of_a_job_with_a_long_heartbeat_timeout() -> None:
    # Found by review: the first scans (every member still warming up, no limit of its own yet) put the next
    # scan a whole --heartbeat-timeout away; with 30 s a host frozen early was found after 24 s, not 1.7 s.
    sim = Sim(members())
    sim.watch = SilenceWatch(30.0, 60.0, lambda kind, **f: sim.events.append((kind, f)))
    beats = steady("w1", 0.0, 10.0, BEHIND)
    for wid in ("w0", "w2"):
        beats += steady(wid, 0.0, 10.2, BEHIND) + steady(wid, 10.2, 40.0, waiting_since(10.1))
    sim.run(beats, until=30.0)
    t, what = sim.lost["w1"]
    assert list(sim.lost) == ["w1"] and t < 13.0, (t, what)
    assert "while rank(s) 0, 2 waited" in what


def test_waiting_ranks_one_collective_apart_are_both_waiting_and_the_stall_is_the_earlier_collective() -> None:
    """A broadcast's root may still be sending (#100) while a receiver has moved on to the next one (#101):
    both wait for the stopped rank, which is named; neither waiting rank is."""
    sim = Sim(members())
    beats = steady("w1", 0.0, 10.0, FlightEntry(1, 90, "gradient allreduce", "completed", 0.0))
    beats += steady("w0", 0.0, 10.2, BEHIND) + steady("w0", 10.2, 30.0, waiting_since(10.1, seq=100, op="broadcast"))
    beats += steady("w2", 0.0, 10.2, BEHIND) + steady("w2", 10.2, 30.0, waiting_since(10.15, seq=101, op="broadcast"))
    sim.run(beats, until=16.0)
    assert list(sim.lost) == ["w1"]
    stalled = sim.events[0][1]
    assert (stalled["seq"], stalled["waiting"], [m["rank"] for m in stalled["missing"]]) == (100, [0, 2], [1])


def test_two_members_frozen_together_are_both_given_up_fast_though_the_first_give_up_aborts_the_round() -> None:
    """Ranks 0 and 2 stop at once; rank 1 waits for both in #5. Rank 2's heartbeats came at another pace, its last one
    0.1 s after rank 0's: at the scan that gives rank 0 up it is not past its own limit yet. The give-up aborts the
    round, rank 1 leaves the collective for rendezvous, and nobody waits in a collective any more; rank 2, whom the
    same stall blamed, still holds the round's re-formation up. It is given up once past its own limit (a review saw
    it wait the whole heartbeat timeout, 5 s, in 3 runs of 5)."""
    sim = Sim(members())
    beats = steady("w0", 0.0, 10.0, BEHIND) + steady("w2", 0.0, 10.0, BEHIND, every=0.6)
    aborted = FlightEntry(1, 5, "gradient allreduce", "failed", 0.0)
    t, i, beats = 0.0, 0, sorted(beats + steady("w1", 0.0, 10.2, BEHIND), key=lambda a: a[0])
    w1_flight = waiting_since(10.1)
    while t <= 20.0:
        while i < len(beats) and beats[i][0] <= t:
            at, wid, flight, pause = beats[i]
            sim.beat(wid, at, flight, pause)
            i += 1
        if t >= 10.2 and round(t / 0.5, 6) == int(round(t / 0.5, 6)):  # w1 beats every 0.5 s from 10.5
            sim.beat("w1", t, w1_flight(t) if "w0" not in sim.lost else aborted)
        before = set(sim.lost)
        sim.scan(t)
        if "w0" in sim.lost and "w0" not in before:  # the job aborts the round: w1 goes to rendezvous
            sim.workers["w1"].to(WorkerState.WAITING)
        t = round(t + TICK, 6)
    (t0, _), (t2, what) = sim.lost["w0"], sim.lost["w2"]
    assert t0 < 12.0 and t0 < t2 < 12.5, (t0, t2)  # one after the other, both long before 10 + the 5 s timeout
    assert "missing with the rank(s) given up from collective #5 (gradient allreduce) of round 1" in what, what


@pytest.mark.parametrize("heard_after_the_give_up", [False, True])
def test_a_member_frozen_inside_the_collective_just_after_another_holds_up_the_re_formation_and_is_given_up_fast(
        heard_after_the_give_up: bool) -> None:
    """Review h29: rank 1 stops at 10.0 s; rank 2 stops 0.7 s later, inside the collective the others wait in (so the
    stall blames rank 1 alone). Rank 1's give-up aborts the round and ranks 0 and 3 go back to rendezvous, which waits
    for rank 2; it was given up only at the heartbeat timeout (15.7 s), the survivors idle 5 s. Now once past its own
    limit, with a reason that says who waited where. A rank 2 that heartbeat as usual until the give-up, then fell
    silent, is on its way back through its rollback (a restore holding the GIL, review h31): only the heartbeat
    timeout judges it, as before."""
    sim = Sim(members(4))
    inside = waiting_since(10.1)
    aborted = FlightEntry(1, 5, "gradient allreduce", "failed", 0.0)
    # Rank 1's last heartbeat is at 9.5 s, and it is given up at about 11 s. Rank 2's last is at 10.1 s when frozen
    # (0.6 s after rank 1's, overdue at the give-up); healthy, it beats on to 12 s (inside the collective, then with
    # the abort) and falls silent in its rollback.
    healthy_until = 12.0 if heard_after_the_give_up else 10.3
    beats = steady("w1", 0.0, 10.0, BEHIND) + steady("w2", 0.0, 10.1, BEHIND)
    beats += steady("w2", 10.1, healthy_until, lambda t: inside(t) if t < 11.0 else aborted)
    for wid in ("w0", "w3"):
        beats += steady(wid, 0.0, 10.1, BEHIND)
    t, i, beats = 0.0, 0, sorted(beats, key=lambda a: a[0])
    while t <= 20.0:
        while i < len(beats) and beats[i][0] <= t:
            at, wid, flight, pause = beats[i]
            sim.beat(wid, at, flight, pause)
            i += 1
        if t >= 10.1 and round(t / 0.5, 6) == int(round(t / 0.5, 6)):  # the two survivors beat every 0.5 s
            for wid in ("w0", "w3"):
                sim.beat(wid, t, inside(t) if "w1" not in sim.lost else aborted)
        before = set(sim.lost)
        sim.scan(t)
        if "w1" in sim.lost and "w1" not in before:  # the job aborts the round: the survivors go to rendezvous
            for wid in ("w0", "w3"):
                sim.workers[wid].to(WorkerState.WAITING)
        t = round(t + TICK, 6)
    (t1, _), (t2, what) = sim.lost["w1"], sim.lost["w2"]
    if heard_after_the_give_up:
        assert t2 > t1 + TIMEOUT and what.startswith("stopped answering heartbeats for 5."), (t1, t2, what)
        return
    assert t1 < 12.0 and t1 < t2 < 10.1 + 2.5, (t1, t2)  # long before 10.1 + the 5 s timeout
    assert "while rank(s) 0, 3 waited at the rendezvous re-forming round 1 (aborted at collective #5" in what, what
    assert list(sim.lost) == ["w1", "w2"]


def with_gap(wid: str, end: float, flight, gap_at: float, gap_s: float) -> list:
    """``wid``'s heartbeats every 0.5 s until ``end``, with one healthy gap of ``gap_s`` after its last before
    ``gap_at``."""
    before = steady(wid, 0.0, gap_at, flight)
    return before + steady(wid, before[-1][0] + gap_s, end, flight)


@pytest.mark.parametrize("thaws", [True, False])
def test_a_gap_the_other_workers_showed_lately_is_allowed_a_member_whose_peers_wait(thaws: bool) -> None:
    """The machine was loaded a moment ago (its workers' gaps reached 1.8 s): a member silent 1.7 s, past its own
    1.5 s limit, while its peers wait, is not given up (a clean-clone run of the suite gave such a rank 0 up); one
    that stays silent is, after the others' usual gap, long before the heartbeat timeout."""
    sim = Sim(members())
    beats = steady("w1", 0.0, 10.0, BEHIND) + (steady("w1", 11.2, 20.0, BEHIND) if thaws else [])
    for wid in ("w0", "w2"):
        beats += with_gap(wid, 10.2, BEHIND, 4.0, 1.8) + steady(wid, 10.2, 20.0, waiting_since(10.1))
    sim.run(beats, until=20.0)
    if thaws:
        assert not sim.lost, sim.lost
    else:
        t, what = sim.lost["w1"]
        assert 9.5 + 1.8 + 0.5 <= t < 9.5 + TIMEOUT and "(its limit 2.3s)" in what, (t, what)


def test_one_other_worker_that_paused_long_does_not_slow_the_fast_rule_for_all() -> None:
    """The usual gap is the others' median: one of four that once paused 3 s leaves a frozen member's bound at its
    own 1.5 s."""
    sim = Sim(members(5))
    beats = steady("w1", 0.0, 10.0, BEHIND)
    beats += with_gap("w0", 10.2, BEHIND, 4.0, 3.0) + steady("w0", 10.2, 20.0, waiting_since(10.1))
    for wid in ("w2", "w3", "w4"):
        beats += steady(wid, 0.0, 10.2, BEHIND) + steady(wid, 10.2, 20.0, waiting_since(10.1))
    sim.run(beats, until=20.0)
    t, what = sim.lost["w1"]
    assert t < 9.5 + FAST_FLOOR_S + 0.6 and "(its limit 1.5s)" in what, (t, what)


def test_a_silent_member_nobody_waits_for_is_given_up_only_at_the_heartbeat_timeout() -> None:
    sim = Sim(members())
    beats = steady("w1", 0.0, 10.0, BEHIND)
    for wid in ("w0", "w2"):
        beats += steady(wid, 0.0, 30.0, BEHIND)  # computing, or between collectives: nobody waits
    sim.run(beats, until=20.0)
    t, what = sim.lost["w1"]
    assert what.startswith("stopped answering heartbeats for 5.") and not sim.events and t > 9.5 + TIMEOUT


def test_a_silent_member_that_finished_the_stalled_collective_is_not_blamed_for_it() -> None:
    sim = Sim(members())
    ahead = FlightEntry(1, 5, "gradient allreduce", "completed", 0.0)  # w1 is past #5, w2 waits in #5 for w0
    beats = steady("w1", 0.0, 10.0, ahead) + steady("w0", 0.0, 30.0, FlightEntry(1, 4, "x", "completed", 0.0))
    beats += steady("w2", 0.0, 30.0, waiting_since(8.0))
    sim.run(beats, until=14.0)
    assert "w1" not in sim.lost


@pytest.mark.parametrize("returned", [False, True])
def test_a_busy_member_that_heartbeats_while_its_peers_wait_20_s_is_named_once_and_never_given_up(caplog,
                                                                                               returned) -> None:
    """Named once the stall lasts the heartbeat timeout, with why it is not in the collective: busy, or (a review
    saw "busy" for one the driver knew had returned) returned from its training function."""
    sim = Sim(members())
    sim.workers["w1"].returned = returned
    beats = steady("w1", 0.0, 40.0, FlightEntry(1, 6, "broadcast parameters", "completed", 0.0))  # compiling
    for wid in ("w0", "w2"):
        beats += steady(wid, 0.0, 3.0, None) + steady(wid, 3.0, 40.0, waiting_since(3.0, seq=7))
    sim.run(beats, until=23.0)
    assert not sim.lost
    assert [(k, f["verdict"], f["seq"]) for k, f in sim.events] == [("collective_stalled", "still heartbeating", 7)]
    assert sim.events[0][1]["waited_s"] >= TIMEOUT
    named = [r.getMessage() for r in caplog.records if "still heartbeating" in r.getMessage()]
    assert len(named) == 1 and named[0].endswith("(still heartbeating: returned from its training function)" if returned
                                                 else "(still heartbeating: busy, or stuck outside the collective)")


def test_a_worker_that_expects_a_long_collector_pause_gets_it_and_a_new_worker_only_the_timeout() -> None:
    sim = Sim(members())
    # w1 says a full collection may hold it 2 s; it then goes quiet 2.4 s, while its peers wait.
    beats = steady("w1", 0.0, 10.0, BEHIND, pause=2.0) + steady("w1", 12.4, 20.0, BEHIND, pause=2.0)
    for wid in ("w0", "w2"):
        beats += steady(wid, 0.0, 10.2, BEHIND) + steady(wid, 10.2, 20.0, waiting_since(10.1))
    sim.run(beats, until=20.0)
    assert not sim.lost
    fresh = Sim(members())  # heard four times only: too little to judge by anything but the timeout
    beats = steady("w1", 0.0, 1.9, BEHIND) + [b for wid in ("w0", "w2")
                                              for b in steady(wid, 0.0, 12.0, waiting_since(0.1))]
    fresh.run(beats, until=6.0)
    assert "w1" not in fresh.lost


# ------------------------------------------------------------------ recorded traces
def replay_judging(trace: dict[str, list[list[float]]], judged: str, stop_at: float | None = None) -> Sim:
    """Replay ``trace`` with the peers of ``judged`` always waiting for it (the worst case for a false alarm);
    ``stop_at``: its heartbeats end there (a SIGSTOP)."""
    names = sorted(trace)
    sim = Sim(members(len(names)))
    ids = {name: f"w{i}" for i, name in enumerate(names)}
    beats = []
    for name, arrivals in trace.items():
        for t, pause in arrivals:
            if name == judged and stop_at is not None and t >= stop_at:
                break
            flight = BEHIND if name == judged else FlightEntry(1, 5, "gradient allreduce", "entered", round(t, 3))
            beats.append((t, ids[name], flight, pause))
    end = max(a[-1][0] for a in trace.values())
    sim.run(beats, until=end)
    sim.ids = ids
    return sim


@pytest.mark.parametrize("name", sorted(TRACES))
def test_no_worker_of_a_recorded_trace_is_given_up_even_with_its_peers_always_waiting_for_it(name: str) -> None:
    trace = TRACES[name]
    for judged in trace:
        sim = replay_judging(trace, judged)
        assert not sim.lost, (name, judged, sim.lost)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_a_worker_of_a_recorded_trace_stopped_mid_run_is_found_long_before_the_timeout(name: str) -> None:
    trace = TRACES[name]
    for judged, arrivals in trace.items():
        stop = arrivals[len(arrivals) // 2][0] + 0.01
        sim = replay_judging(trace, judged, stop_at=stop)
        wid = sim.ids[judged]
        assert wid in sim.lost, (name, judged)
        t, what = sim.lost[wid]
        assert "while rank(s)" in what and t - stop < TIMEOUT, (name, judged, t - stop, what)


def test_the_recorded_traces_are_what_their_names_say() -> None:
    """Guards the recording: the paused worker really paused and said so, the others did not."""
    def gaps(arrivals):
        return [b[0] - a[0] for a, b in zip(arrivals, arrivals[1:])]

    paused = TRACES["paused"]
    longest = {w: max(gaps(a)) for w, a in paused.items()}
    worst = max(longest, key=longest.get)
    assert longest[worst] > FAST_FLOOR_S - 0.5 and max(p for _, p in paused[worst]) > 1.0
    for name in ("jittery", "loaded"):
        assert all(len(a) > 60 for a in TRACES[name].values())


def test_silence_limit_widens_with_jitter_and_with_a_long_gap_seen() -> None:
    from cloud_elastic.driver.job.liveness import arrived
    from cloud_elastic.driver.job.stalls import Heard

    calm, jittery, paused = Heard(0.0), Heard(0.0), Heard(0.0)
    for i in range(1, 41):
        arrived(calm, 0.5 * i)
        arrived(jittery, jittery.at + (0.3 if i % 2 else 0.8))
        arrived(paused, paused.at + (2.5 if i == 20 else 0.5))
    assert silence_limit(calm) == FAST_FLOOR_S
    assert silence_limit(jittery) > FAST_FLOOR_S
    assert silence_limit(paused) > 2.5  # 2.5 s seen once: allowed again (the allowance fades over minutes)
