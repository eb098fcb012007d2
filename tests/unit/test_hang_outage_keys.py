"""Workers given up together count once, whatever order the driver's scans find them in (review s57 rvF F1).

``Hangs`` kept only the last give-up's key: one network drop of two hosts, whose four waiting workers the scans
found as b, c, b, c, counted 3 and ended a healthy job at start-up ("worker 127.0.0.3[0] was given up 3 times in a
row at commit 0", though it was given up once). A host's round member and its newcomer, frozen together, counted 2.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.repeats import REPEATS, Hangs
from tests.unit.test_job import KILLED, Sim, failed, started
from tests.unit.test_job_repeats import at_commit, signalled

pytestmark = pytest.mark.timeout(30)


def waiting(order: str) -> tuple[Sim, list[tuple[str, str]]]:
    """Host a (1 slot) still booting; hosts ``set(order)`` (2 slots each) have their workers registered, unarmed
    (their silence alone counts), waiting for the first round. Their (slot, id), in ``order`` of host letters."""
    hosts = sorted(set(order))
    n = 1 + 2 * len(hosts)
    sim = Sim(n, min_np=n, cooldown=(1.0, 2.0), elastic_timeout_s=60)
    sim.discover({"a": 1, **{h: 2 for h in hosts}})
    free = {h: [f"{h}[0]", f"{h}[1]"] for h in hosts}
    ws = [(s, sim.id(s)) for s in (free[h].pop(0) for h in order)]
    for _, w in ws:
        sim.job.registered(w, sim.now)
        sim.job.workers[w].stacks_signal = False
    return sim, ws


def drop(sim: Sim, ws: list[tuple[str, str]]) -> None:
    """One outage takes ``ws`` down, each going silent half a second after the one before it (the order of their
    last heartbeats, so of their give-ups); the driver gives them up and its kills end them."""
    for _, w in ws:
        sim.advance(0.5)
        sim.silent.add(w)
    for _ in range(40):
        sim.advance(0.5)
        if not any(sim.job.workers[w].alive for _, w in ws):
            break
    for s, w in ws:
        if sim.outcome is None:
            signalled(sim, w, printed=False)
            sim.exit(s, KILLED)


@pytest.mark.parametrize("order", ["bbcc", "bcbc", "bccb", "bbccdd", "bcdbcd"])
def test_one_outage_of_several_hosts_counts_once_in_any_order(order, caplog) -> None:
    """two_hosts_one_drop.sh: 127.0.0.3 and .4 froze together for 9 s while their workers waited for the first
    round: rc 1. Each order of their give-ups now counts one, and so does a three-host (zone-wide) blip."""
    caplog.set_level("WARNING", logger="cloud_elastic.driver.job.failures")
    sim, ws = waiting(order)
    drop(sim, ws)
    assert sim.outcome is None, sim.outcome
    assert caplog.text.count(f"1 of {REPEATS} in a row at commit 0") == 1, caplog.text
    assert f"2 of {REPEATS}" not in caplog.text, caplog.text


def test_a_hosts_round_member_and_its_newcomer_frozen_together_count_once(caplog) -> None:
    """b[0] is rank 1 of round 1, b[1] a newcomer on a slot added to b, in no round; host b freezes once. Its round
    and its outage were separate keys: "2 of 3" from one freeze."""
    caplog.set_level("WARNING", logger="cloud_elastic.driver.job.failures")
    sim = started(2, {"a": 1, "b": 1}, max_np=3, cooldown=(1.0, 2.0), progress_timeout_s=30, elastic_timeout_s=60)
    at_commit(sim, "a[0]", 6)
    at_commit(sim, "b[0]", 6)
    sim.discover({"a": 1, "b": 2})
    sim.job.registered(sim.id("b[1]"), sim.now)
    host = [("b[0]", sim.id("b[0]")), ("b[1]", sim.id("b[1]"))]
    assert [sim.job.workers[w].round for _, w in host] == [1, 0]
    for _, w in host:
        sim.job.workers[w].stacks_signal = False
    drop(sim, host)
    assert sim.outcome is None, sim.outcome
    assert caplog.text.count(f"1 of {REPEATS} in a row at commit 6") == 1, caplog.text
    assert f"2 of {REPEATS}" not in caplog.text, caplog.text


def test_a_worker_that_ran_on_past_an_outage_of_its_host_and_hangs_later_counts_again(caplog) -> None:
    """b[0] froze and was given up (1 of 3); b[1], launched with it, went on heartbeating, and hangs on its own later.
    Keyed by what was launched on its host before the first give-up, it matched b[0]'s outage and counted 0."""
    caplog.set_level("WARNING", logger="cloud_elastic.driver.job.failures")
    sim, ws = waiting("bb")
    drop(sim, ws[:1])
    sim.advance(10.0)  # past one --heartbeat-timeout
    drop(sim, ws[1:])
    assert sim.outcome is None, sim.outcome
    assert f"2 of {REPEATS} in a row at commit 0" in caplog.text, caplog.text


def test_outages_of_several_hosts_again_and_again_end_the_job_saying_how_many_workers(caplog) -> None:
    """Hosts b and c drop together, their relaunched workers drop again, and again: three outages at commit 0 end the
    job (unarmed workers: their silence alone counts), in a line that counts the workers and names no one worker as
    if it had hung three times."""
    sim, ws = waiting("bcbc")
    for n in range(REPEATS):
        assert sim.outcome is None, (n, sim.outcome)
        drop(sim, ws)
        if sim.outcome is not None:
            break
        for _ in range(20):  # both slots cool down and get new workers
            sim.advance(0.5)
            if all(sim.id(s) != w for s, w in ws):
                break
        ws = [(s, sim.id(s)) for s, _ in ws]
        for _, w in ws:
            sim.job.registered(w, sim.now)
            sim.job.workers[w].stacks_signal = False
    # The third outage ends the job at its first give-up: 4 + 4 + 1 workers given up in all.
    failed(sim, f"no progress: hung workers were given up {REPEATS} times in a row at commit 0 (9 workers on 2 hosts "
                f"(b, c); those given up together, in one outage or one round, count once)", "; the last: worker ")


def test_hangs_keeps_every_key_of_its_commit() -> None:
    """Keys b, c, b counted 3 when only the last was kept. Every key of a counted give-up's is kept until a new
    commit; a give-up sharing any key with one counted counts 0 and adds its own keys (a round's member on host b
    matches b's newcomer through their outage)."""
    hangs = Hangs()
    assert hangs.given_up(0, frozenset({"outage 1"})) == 1
    assert hangs.given_up(0, frozenset({"outage 2"})) == 2
    assert hangs.given_up(0, frozenset({"outage 1"})) == 0
    assert hangs.given_up(0, frozenset({"outage 2", "round 1"})) == 0
    assert hangs.given_up(0, frozenset({"round 1", "outage 3"})) == 0
    assert hangs.given_up(0, frozenset({"outage 3"})) == 0
    assert hangs.given_up(1, frozenset({"outage 3"})) == 1  # a new commit: counted from 1 again
