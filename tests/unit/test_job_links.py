"""driver/job/links.py: the slow-network rule on pair figures, the probe schedule, and the drain in the job."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import WorkerState
from cloud_elastic.driver.job.links import (HIGH_COMM_SWEEP_S, ORDER_TIMEOUT_S, SWEEP_EVERY_S, LinkWatch,
                                            faster_without_host, slow_host)
from cloud_elastic.protocol import LinkReport
from tests.unit.test_job import Sim, started

pytestmark = pytest.mark.timeout(30)

S = WorkerState
FAST, SLOW = 1000.0, 20.0


def mesh(hosts: str, speed: dict[str, float], default: float = FAST) -> dict[tuple[str, str], float]:
    """Every pair of ``hosts`` (one letter each), at the figure of its slowest listed host, else ``default``."""
    return {(a, b): min(speed.get(a, default), speed.get(b, default))
            for i, a in enumerate(hosts) for b in hosts[i + 1:]}


# ------------------------------------------------------------------ the rule
def test_the_host_common_to_the_slow_pairs_is_named_and_the_healthy_pairs_clear_the_others():
    found = slow_host(mesh("abc", {"c": SLOW}))
    assert found is not None and found.host == "c" and found.mb_s == SLOW and found.peers_mb_s == FAST
    assert found.peers == ("a", "b")
    assert slow_host(mesh("abcdef", {"d": 100.0})).host == "d"


def test_one_slow_pair_names_nobody():
    pairs = mesh("abcd", {})
    pairs[("a", "b")] = SLOW  # a bad cable between a and b: each has fast links elsewhere
    assert slow_host(pairs) is None


def test_noise_within_the_factor_names_nobody():
    pairs = mesh("abcd", {})
    pairs[("a", "c")], pairs[("b", "c")], pairs[("c", "d")] = 400.0, 300.0, 600.0  # c 1.7-3.3x slower
    assert slow_host(pairs) is None
    pairs[("a", "c")], pairs[("b", "c")], pairs[("c", "d")] = 250.0, 200.0, 240.0  # every link of c 4x slower
    assert slow_host(pairs).host == "c"


def test_unequal_but_healthy_hosts_are_not_named():
    # a and b have faster NICs than the rest: every other host looks slow next to a-b alone.
    pairs = mesh("abcd", {}, default=100.0)
    pairs[("a", "b")] = FAST
    assert slow_host(pairs) is None


def test_a_host_measured_with_one_peer_only_is_not_named():
    assert slow_host({("a", "b"): FAST, ("a", "c"): SLOW}) is None  # c: one peer; a: a fast link
    assert slow_host({("a", "b"): SLOW}) is None


def test_two_equally_slow_hosts_name_one_of_them_by_name_and_the_slower_first():
    pairs = mesh("abcdef", {"e": SLOW, "f": SLOW})
    assert slow_host(pairs).host == "e"  # a tie: the first by name
    pairs = mesh("abcdef", {"e": SLOW, "f": SLOW / 2})
    assert slow_host(pairs).host == "f"


def test_a_host_is_worth_draining_only_when_the_others_would_do_more_work_without_it():
    # Three workers, steps of 0.1 s compute and 0.1 s in collectives, the slow links 50x slower:
    # two at about 0.102 s beat three at 0.2 s.
    assert faster_without_host(3, 1, 0.1, 0.1, 1 / 50)
    # A compute-bound job (0.01 s in collectives): three at 0.11 s beat two at 0.1 s.
    assert not faster_without_host(3, 1, 0.1, 0.01, 1 / 50)
    assert not faster_without_host(1, 1, 0.1, 0.1, 0.0) and not faster_without_host(3, 1, 0.0, 0.0, 0.0)


def test_a_factor_of_one_or_less_names_nobody():
    assert slow_host(mesh("abc", {"c": SLOW}), factor=1.0) is None


# -------------------------------------------------------------- the schedule
def report(watch: LinkWatch, worker: str, host: str, port: int, t: float, probed: int = 0,
           mb_s: dict[str, float] | None = None):
    return watch.heard(worker, host, LinkReport(port, probed, tuple((mb_s or {}).items())), t)


def run_probes(watch: LinkWatch, hosts: dict[str, str], speed: dict[str, float], t: float, rounds: int = 10) -> float:
    """Every worker heartbeats; whoever is asked to probe answers at the next beat with the figures of ``speed``."""
    for _ in range(rounds):
        watch.plan(hosts.items(), t)
        for wid, host in hosts.items():
            order = report(watch, wid, host, 7000, t)
            if order is not None:
                figures = {}
                for peer in order.peers:
                    pid, _, rest = peer.partition("@")
                    figures[pid] = min(speed.get(host, FAST), speed.get(rest.split(":")[0], FAST))
                report(watch, wid, host, 7000, t + 0.5, order.seq, figures)
        t += 1.0
    return t


def test_one_probe_at_a_time_each_newcomer_once_against_the_next_hosts_of_the_ring():
    watch = LinkWatch()
    hosts = {"a[0]": "a", "b[0]": "b", "c[0]": "c"}
    for wid, host in hosts.items():
        assert report(watch, wid, host, 7000, 0.0) is None  # ports known; nothing asked yet
    watch.plan(hosts.items(), 0.0)
    asked = {wid: report(watch, wid, h, 7000, 0.1) for wid, h in hosts.items()}
    assert [w for w, o in asked.items() if o is not None] == ["a[0]"]  # one at a time
    assert asked["a[0]"].peers == ("b[0]@b:7000", "c[0]@c:7000")
    assert report(watch, "a[0]", "a", 7000, 0.2).seq == asked["a[0]"].seq  # asked again until answered
    report(watch, "a[0]", "a", 7000, 0.3, asked["a[0]"].seq, {"b[0]": FAST, "c[0]": FAST})
    watch.plan(hosts.items(), 1.0)
    assert report(watch, "b[0]", "b", 7000, 1.1).peers == ("c[0]@c:7000", "a[0]@a:7000")
    assert watch.figures(1.0) == {("a", "b"): FAST, ("a", "c"): FAST}


def test_a_host_of_several_slots_is_probed_by_one_of_its_workers():
    watch = LinkWatch()
    hosts = {f"a[{i}]": "a" for i in range(4)} | {f"b[{i}]": "b" for i in range(4)} | {"c[0]": "c"}
    asked: list[str] = []
    t = 0.0
    for _ in range(10):
        watch.plan(hosts.items(), t)
        for wid, host in hosts.items():
            order = report(watch, wid, host, 7000, t)
            if order is not None:
                asked.append(wid)
                report(watch, wid, host, 7000, t + 0.5, order.seq, {p.split("@")[0]: FAST for p in order.peers})
        t += 1.0
    assert sorted(asked) == ["a[0]", "b[0]", "c[0]"]


def test_an_unanswered_probe_is_given_up_and_the_next_worker_asked():
    watch = LinkWatch()
    hosts = {"a[0]": "a", "b[0]": "b"}
    for wid, host in hosts.items():
        report(watch, wid, host, 7000, 0.0)
    watch.plan(hosts.items(), 0.0)
    assert report(watch, "a[0]", "a", 7000, 0.1) is not None
    watch.plan(hosts.items(), ORDER_TIMEOUT_S + 1)
    assert report(watch, "a[0]", "a", 7000, ORDER_TIMEOUT_S + 1) is None
    assert report(watch, "b[0]", "b", 7000, ORDER_TIMEOUT_S + 1) is not None


def test_hosts_are_swept_again_rarely_and_sooner_while_collectives_take_half_the_time():
    watch = LinkWatch()
    hosts = {"a[0]": "a", "b[0]": "b", "c[0]": "c"}
    t = run_probes(watch, hosts, {}, 0.0)
    watch.plan(hosts.items(), t)
    assert all(report(watch, w, h, 7000, t) is None for w, h in hosts.items())  # every newcomer probed once
    watch.plan(hosts.items(), t, comm_share=0.2)
    assert all(report(watch, w, h, 7000, t) is None for w, h in hosts.items())
    watch.plan(hosts.items(), HIGH_COMM_SWEEP_S + 1, comm_share=0.6)  # collectives take over half the step
    assert report(watch, "a[0]", "a", 7000, HIGH_COMM_SWEEP_S + 1) is not None
    watch = LinkWatch()
    t = run_probes(watch, hosts, {}, 0.0)
    watch.plan(hosts.items(), SWEEP_EVERY_S + 1)  # the rare sweep
    assert report(watch, "a[0]", "a", 7000, SWEEP_EVERY_S + 1) is not None


def test_a_share_of_time_in_collectives_that_doubles_brings_the_sweep_forward_once():
    watch = LinkWatch()
    hosts = {"a[0]": "a", "b[0]": "b", "c[0]": "c"}
    t = run_probes(watch, hosts, {}, 0.0)
    watch.plan(hosts.items(), t, comm_share=0.1)  # the round's first figure
    t = HIGH_COMM_SWEEP_S + 1
    watch.plan(hosts.items(), t, comm_share=0.15)  # grew, but not twice
    assert all(report(watch, w, h, 7000, t) is None for w, h in hosts.items())
    watch.plan(hosts.items(), t, comm_share=0.25)  # more than twice, and above 0.2: a sweep
    assert report(watch, "a[0]", "a", 7000, t) is not None
    t = run_probes(watch, hosts, {}, t)
    t += HIGH_COMM_SWEEP_S + 1
    watch.plan(hosts.items(), t, comm_share=0.3)  # what it now is: no new sweep for the same level
    assert all(report(watch, w, h, 7000, t) is None for w, h in hosts.items())


def test_a_slow_host_is_named_only_after_its_own_probe_confirms_it_and_then_once():
    watch = LinkWatch()
    hosts = {"a[0]": "a", "b[0]": "b", "c[0]": "c"}
    t, named = 0.0, []
    for _ in range(10):
        t = run_probes(watch, hosts, {"c": SLOW}, t, rounds=1)
        found = watch.verdict(t)
        if found is not None:
            named.append((found.host, t))
    assert [h for h, _ in named] == ["c"]


def test_a_single_low_figure_is_probed_again_and_clears():
    watch = LinkWatch()
    hosts = {"a[0]": "a", "b[0]": "b", "c[0]": "c"}
    t = run_probes(watch, hosts, {}, 0.0)
    # One bad sweep of c's links (c descheduled while probed), then c probes again at full speed.
    watch._pairs[("a", "c")] = (SLOW, t)
    watch._pairs[("b", "c")] = (SLOW, t)
    assert watch.verdict(t) is None  # a suspect only
    t = run_probes(watch, hosts, {}, t, rounds=3)
    assert watch.verdict(t) is None and watch._suspect is None


def test_figures_of_hosts_that_left_are_not_used():
    watch = LinkWatch()
    hosts = {"a[0]": "a", "b[0]": "b", "c[0]": "c"}
    t = run_probes(watch, hosts, {"c": SLOW}, 0.0)
    del hosts["c[0]"]
    watch.plan(hosts.items(), t)
    assert watch.figures(t) == {("a", "b"): FAST}


# ------------------------------------------------------------------ in the job
def beat(sim: Sim, seconds: float, speed: dict[str, float], compute_s: float = 0.1, comm_s: float = 0.1) -> None:
    """Every live worker heartbeats each 0.5 s with a probe port, and answers a probe order with ``speed``."""
    end = sim.now + seconds
    answers: dict[str, LinkReport] = {}
    while sim.now < end:
        sim.now = min(end, sim.now + 0.5)
        for wid, w in list(sim.job.workers.items()):
            if not w.alive:
                continue
            reply = sim.job.heartbeat(wid, sim.now, compute_s=compute_s, comm_s=comm_s,
                                      link=answers.get(wid, LinkReport(7000)))
            if reply is not None and reply.probe is not None:
                host = w.slot.host
                answers[wid] = LinkReport(7000, reply.probe.seq, tuple(
                    (p.split("@")[0], min(speed.get(host, FAST), speed.get(p.split("@")[1].split(":")[0], FAST)))
                    for p in reply.probe.peers))
        sim.job.tick(sim.now)
        sim._collect()


def test_a_host_with_a_slow_network_drains_at_its_next_commit_with_no_rollback_and_the_others_stay():
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    slow = sim.job.workers[sim.id("c[0]")]
    for _ in range(30):
        beat(sim, 1, {"c": SLOW})
        if slow.state is not S.RUNNING:
            break
    assert slow.state is S.DRAINING and slow.why.startswith("slow network: host c")
    assert all(sim.job.workers[sim.id(s)].state is S.RUNNING for s in ("a[0]", "b[0]"))
    events = [f for kind, f in sim.events if kind == "slow_link"]
    assert len(events) == 1 and events[0]["host"] == "c" and events[0]["workers"] == [sim.id("c[0]")]
    assert events[0]["mb_s"] == SLOW and events[0]["peers_mb_s"] == FAST and events[0]["comm_share"] == 0.5
    assert not [kind for kind, _ in sim.events if kind == "straggler"]
    assert sim.blocked("c[0]")
    assert sim.poll("a[0]").update_gen == 1 and sim.job.abort_round == 0  # a graceful change: no rollback


def test_a_link_under_1_mb_s_is_said_with_two_significant_digits():
    """Review h29: the line said "its fastest link 0.0 MB/s" of a link its event measured at 0.02."""
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    slow = sim.job.workers[sim.id("c[0]")]
    for _ in range(30):
        beat(sim, 1, {"c": 0.02})
        if slow.state is not S.RUNNING:
            break
    assert slow.why.startswith("slow network: host c") and "its fastest link 0.02 MB/s against a median" in slow.why, \
        slow.why


def test_a_newcomer_found_slow_while_it_waits_for_admission_is_sent_away_unadmitted():
    from cloud_elastic.protocol import ExitOrder

    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1, max_np=4)
    beat(sim, 10, {})  # the first three measured each other: all fast
    sim.discover({"a": 1, "b": 1, "c": 1, "d": 1})
    sim.join("d[0]")  # it waits at rendezvous; the members are still in their round
    newcomer = sim.job.workers[sim.id("d[0]")]
    for _ in range(30):
        beat(sim, 1, {"d": SLOW})
        if newcomer.state is not S.WAITING:
            break
    assert newcomer.state is S.EXITING and newcomer.rank is None
    reply = sim.reply("d[0]")
    assert isinstance(reply, ExitOrder) and reply.reason.startswith("slow network: host d")
    assert [f["host"] for kind, f in sim.events if kind == "slow_link"] == ["d"]
    assert all(sim.job.workers[sim.id(s)].state is S.RUNNING for s in ("a[0]", "b[0]", "c[0]"))
    assert sim.job.abort_round == 0


def test_equal_hosts_drain_nobody_and_the_watch_is_off_at_straggler_factor_zero():
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    beat(sim, 30, {})
    assert not [kind for kind, _ in sim.events if kind == "slow_link"]
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1, straggler_factor=0)
    beat(sim, 30, {"c": SLOW})
    assert not [kind for kind, _ in sim.events if kind == "slow_link"]


def test_a_slow_host_is_kept_when_draining_it_would_go_below_min_np(caplog):
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=3)
    beat(sim, 30, {"c": SLOW})
    assert sim.job.workers[sim.id("c[0]")].state is S.RUNNING
    assert caplog.text.count("has a slow network") == 1 and "below --min-np 3" in caplog.text


def test_a_slow_host_is_kept_when_the_job_would_not_be_faster_without_it(caplog):
    # Collectives take a tenth of the step: three workers still do more than two would.
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    beat(sim, 30, {"c": SLOW}, compute_s=0.1, comm_s=0.01)
    assert sim.job.workers[sim.id("c[0]")].state is S.RUNNING
    assert caplog.text.count("has a slow network") == 1 and "would not be faster without it" in caplog.text
    assert not [kind for kind, _ in sim.events if kind == "slow_link"]


def test_status_shows_each_workers_share_of_time_in_collectives():
    import dataclasses

    from cloud_elastic.driver.job.health import comm_share
    from cloud_elastic.status import HostStatus, StatusReply, WorkerStatus, render_status

    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    assert comm_share(sim.job.workers[sim.id("a[0]")]) is None  # nothing measured yet
    beat(sim, 2, {}, compute_s=0.1, comm_s=0.3)
    assert comm_share(sim.job.workers[sim.id("a[0]")]) == pytest.approx(0.75)
    worker = WorkerStatus(0, "a[0]#1", "training", 0, 0.1, 0.75)
    reply = StatusReply(job="j", phase="training", round=1, world_size=1, num_proc=1, min_np=1, max_np=1,
                        uptime_s=1.0, resets=0, commit_step=None, steps_per_s=None,
                        hosts=(HostStatus("a", 1, "ready", (worker,)),), blacklisted=(), notices=())
    assert "a     1      ready  [0] rank 0 training 100.0 ms/step 75% comm\n" in render_status(reply, now=0.0)
    assert StatusReply.from_json(reply.to_json()) == reply
    assert StatusReply.from_json(dataclasses.replace(reply, hosts=(HostStatus("a", 1, "ready", (
        WorkerStatus(0, "a[0]#1", "training", 0),)),)).to_json()).hosts[0].workers[0].comm_share is None
