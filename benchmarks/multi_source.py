"""Several host sources against a recorded availability trace: cost and goodput vs on-demand only and one Spot group.

    python benchmarks/multi_source.py [--quick] [--record]

The trace (``benchmarks/traces/two_spot_pools.json``) holds, minute by minute over 12 hours, how many
one-GPU hosts two Spot pools had running. It is synthetic and fixed: drawn once from a seeded model of
Spot pools (``--record`` draws it again, the same for the same seed) and replayed as is by every run, so
runs compare. An on-demand group has capacity whenever it is asked for, after a boot delay.

Every job is the driver's own pure core (:class:`~cloud_elastic.driver.job.elastic_job.ElasticJob`:
the choice rule, the fallback, drains at a commit, ``--manage-capacity``, the cost meter), fed the trace
as discovery snapshots and played by a small runtime whose workers start, rendezvous, step, commit,
drain and leave as the real ones do, on a simulated clock. What is measured is the policy, not the
machine: a step takes ``STEP_S``; a worker process takes ``START_S`` to reach rendezvous; a round that
admits a newcomer pauses ``SYNC_S`` (the state broadcast), one that only shrinks ``REFORM_S``
(both from the host-added and notice-latency benchmarks); a reclaimed Spot host gives a 2-minute notice.

Jobs (``-np 8 --min-np 4``; every one waits below ``--min-np`` instead of failing):

* on-demand only: one on-demand group of 8;
* Spot, one group: pool A alone;
* this job: pools A and B, and the on-demand group as ``fallback`` with ``--fallback-after 600 --manage-capacity``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import common  # noqa: F401  (sets PYTHONPATH)
import docsection
from common import command, stamp, where

from cloud_elastic.driver.job.actions import Finish, Launch, Policy, Release, SetCapacity, Stop
from cloud_elastic.driver.job.elastic_job import ElasticJob
from cloud_elastic.driver.job.exit_status import ExitStatus
from cloud_elastic.driver.job.hosts import Blacklist, HostManager
from cloud_elastic.protocol import Assignment, ExitOrder
from cloud_elastic.providers.api import DiscoveredHosts, Drain
from cloud_elastic.providers.sources import SourceSpec

DEBUG = False
HERE = Path(__file__).resolve().parent
TRACE = HERE / "traces" / "two_spot_pools.json"
SECTION = "Several host sources: Spot pools and an on-demand fallback"

NP, MIN_NP = 8, 4
TICK_S = 5.0
STEP_S = 1.0
START_S = 5.0
SYNC_S = 1.0
REFORM_S = 0.5
NOTICE_S = 120.0
CHECKPOINT_S = 300.0  # --checkpoint-dir at the default interval: a job that loses every worker resumes from it
BOOT_S = 180.0  # an on-demand instance, from the capacity call to a ready host
PRICES = {"spot-a": 0.90, "spot-b": 1.05, "on-demand": 3.06}  # dollars per slot-hour (one GPU a host)


# ------------------------------------------------------------------------------------ the trace
def record(path: Path, seed: int = 45, hours: int = 12) -> dict:
    """Draw the trace: each pool runs at its capacity, with dips (a reclaim wave) every 1.5-3 h for 20-90 min."""
    rng = random.Random(seed)
    minutes = hours * 60
    pools = {}
    for pool, capacity in (("spot-a", 8), ("spot-b", 6)):
        counts = [capacity] * minutes
        t = rng.randint(30, 120)
        while t < minutes:
            length, low = rng.randint(20, 90), rng.randint(0, capacity // 2)
            for m in range(t, min(minutes, t + length)):
                counts[m] = low
            t += length + rng.randint(90, 180)
        pools[pool] = counts
    shared = rng.randint(minutes // 3, minutes // 2)  # one wave that takes both pools at once
    for m in range(shared, min(minutes, shared + 75)):
        pools["spot-a"][m], pools["spot-b"][m] = 1, 0
    trace = {"step_s": 60, "seed": seed, "hours": hours,
             "model": "synthetic: per pool, full capacity with a dip to 0..capacity/2 every 1.5-3 h for 20-90 min, "
                      "and one 75-min wave over both pools",
             "pools": pools}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace) + "\n")
    return trace


# ------------------------------------------------------------------------------------ the cloud
@dataclass
class Group:
    """One group's hosts: address -> (ready at, leaving at or None)."""

    name: str
    hosts: dict[str, list] = field(default_factory=dict)
    seq: int = 0

    def live(self, now: float) -> list[str]:
        return [h for h, (ready, leave) in self.hosts.items() if ready <= now and (leave is None or leave > now)]

    def resize(self, target: int, now: float, delay: float, notice: float) -> None:
        staying = [h for h, (_, leave) in self.hosts.items() if leave is None]
        for host in staying[target:]:  # the newest leave first, with a notice
            self.hosts[host][1] = now + notice
        for _ in range(target - len(staying)):
            self.seq += 1
            self.hosts[f"{self.name}-{self.seq}"] = [now + delay, None]
        for host in [h for h, (_, leave) in self.hosts.items() if leave is not None and leave <= now]:
            del self.hosts[host]

    def snapshot(self, now: float) -> tuple[dict, dict]:
        ready, draining = {}, {}
        for host, (up, leave) in self.hosts.items():
            if up > now or (leave is not None and leave <= now):
                continue
            if leave is None:
                ready[host] = 1
            else:
                draining[host] = Drain(leave, "spot interruption")
        return ready, draining


# ------------------------------------------------------------------------------------ the runtime
@dataclass
class Worker:
    ready_at: float
    state: str = "booting"  # booting, waiting, running, gone
    round: int = 0
    gen: int = 0


def run_job(trace: dict, sources: tuple[SourceSpec, ...], minutes: int, *, fallback_after_s: float | None = None,
            manage: bool = False, od_size: int = 0) -> dict:
    """Replay ``minutes`` of the trace through one job; its samples, cost and fallback hours."""
    job = ElasticJob(Policy(NP, MIN_NP, NP, elastic_timeout_s=1e9, start_timeout_s=1e9, heartbeat_timeout_s=1e9,
                            progress_timeout_s=0, checkpointing=True, sources=sources,
                            fallback_after_s=fallback_after_s, manage_capacity=manage),
                     HostManager(Blacklist((10, 300), random.Random(0))), job_id="bench")
    groups = {s.name: Group(s.name) for s in sources}
    if "on-demand" in groups and od_size:
        groups["on-demand"].resize(od_size, 0.0, 0.0, NOTICE_S)
    workers: dict[str, Worker] = {}
    now, end = 0.0, minutes * 60.0
    samples = steps = 0.0
    checkpoint = (0.0, 0.0, 0.0)  # (when, steps, samples) of the last durable checkpoint
    paused_until = 0.0
    fallback_slot_s = 0.0
    job.start(now)
    while now < end:
        minute = int(now // 60)
        for name, group in groups.items():
            if name in trace["pools"]:
                group.resize(trace["pools"][name][minute], now, 0.0, NOTICE_S)
            else:
                group.resize(len([h for h, (_, leave) in group.hosts.items() if leave is None]), now, BOOT_S, 0.0)
        ready, draining, owner = {}, {}, {}
        for name, group in groups.items():
            r, d = group.snapshot(now)
            ready.update(r), draining.update(d)
            owner.update({h: name for h in (*r, *d)})
        job.discovered(DiscoveredHosts(ready=ready, draining=draining, sources=owner,
                                       prices={h: PRICES[owner[h]] for h in owner}), now)
        job.tick(now)
        for action in job.take_actions():
            if isinstance(action, Launch):
                workers[action.worker_id] = Worker(now + START_S)
            elif isinstance(action, Stop):
                w = workers.get(action.worker_id)
                if w is not None and w.state != "gone":
                    w.state = "gone"
                    job.exited(action.worker_id, ExitStatus(-15), now)
            elif isinstance(action, SetCapacity):
                group = groups[action.source]
                group.resize(action.hosts, now, BOOT_S, 0.0)
            elif isinstance(action, (Release, Finish)):
                pass
        for kind, fields in job.take_events():
            if DEBUG:
                print(f"{now:7.0f} {kind} {fields}")
        for wid, w in workers.items():
            host = wid.split("[")[0]
            if w.state != "gone" and host not in ready and host not in draining and host not in job.hosts.missing:
                w.state = "gone"  # the host went away under it (no notice reached it in time)
                job.exited(wid, ExitStatus(-9), now)
                continue
            if w.state == "booting" and now >= w.ready_at:
                job.registered(wid, now)
                job.rendezvous(wid, 0, "start", now)
                w.state = "waiting"
            elif w.state == "running":
                # Every member commits every step: the commit it holds is the round's step count.
                reply = job.heartbeat(wid, now, commits=int(steps), commit_seq=int(steps))
                if reply is not None and (reply.leave or reply.update_gen > w.gen or reply.abort_round >= w.round
                                          or reply.round > w.round):
                    job.rendezvous(wid, w.round, "update", now, commits=int(steps), commit_seq=int(steps))
                    w.gen, w.state = reply.update_gen, "waiting"
        formed = False
        for wid, w in workers.items():
            if w.state != "waiting":
                continue
            answer = job.assignment(wid)
            if isinstance(answer, ExitOrder):
                w.state = "gone"
                job.exited(wid, ExitStatus(0), now)
            elif isinstance(answer, Assignment):
                w.state, w.round, w.gen = "running", answer.round, answer.update_gen
                if answer.from_checkpoint and answer.ranks.rank == 0:  # what was trained after it is lost
                    steps, samples = checkpoint[1], checkpoint[2]
                    job.checkpoint_loaded(int(steps), int(steps), "checkpoint")
                formed = True
                paused_until = max(paused_until, now + (SYNC_S if answer.needs_sync else REFORM_S))
        members = [w for w in workers.values() if w.state == "running" and w.round == job.round]
        waiting = any(w.state == "waiting" for w in workers.values())
        if members and not waiting and not formed:
            useful = max(0.0, min(TICK_S, now + TICK_S - paused_until))
            samples += len(members) * useful / STEP_S
            steps += useful / STEP_S
            if now - checkpoint[0] >= CHECKPOINT_S:
                checkpoint = (now, steps, samples)
        fallback_slot_s += TICK_S * sum(1 for wid, w in workers.items() if w.state != "gone"
                                        and owner.get(wid.split("[")[0]) == "on-demand" and len(sources) > 1)
        now += TICK_S
    if job.outcome is not None:
        raise RuntimeError(f"the job ended inside the trace: {job.outcome.reason}")
    summary = job.capacity.sourcing.summary(now)
    return {"samples": samples, "dollars": summary.dollars, "hours": end / 3600, "fallback_h": fallback_slot_s / 3600,
            "slot_hours": summary.slot_hours}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="draw the trace again (seed 45) before replaying it")
    docsection.add_arguments(ap)
    args = ap.parse_args()
    logging.getLogger("cloud_elastic").setLevel(logging.ERROR)  # the job core's INFO lines, thousands of them
    trace = record(TRACE) if args.record or not TRACE.exists() else json.loads(TRACE.read_text())
    minutes = 120 if args.quick else trace["hours"] * 60
    a, b = SourceSpec("spot-a", "aws", price=PRICES["spot-a"]), SourceSpec("spot-b", "aws", price=PRICES["spot-b"])
    od = SourceSpec("on-demand", "aws", price=PRICES["on-demand"])
    runs = {
        "on-demand only (8 hosts)": run_job(trace, (od,), minutes, od_size=NP),
        "Spot, one group (pool A)": run_job(trace, (a,), minutes),
        "Spot, two groups, no fallback": run_job(trace, (a, b), minutes),
        "this job: two Spot groups + on-demand fallback": run_job(
            trace, (a, b, SourceSpec("on-demand", "aws", price=PRICES["on-demand"], fallback=True)), minutes,
            fallback_after_s=600, manage=True),
    }
    ideal = NP * minutes * 60 / STEP_S
    base = runs["on-demand only (8 hosts)"]
    rows = ["| job | cost | goodput (samples / on-demand's) | $ per 1,000 samples | fallback slot-hours |",
            "|---|---|---|---|---|"]
    for name, r in runs.items():
        per = r["dollars"] / r["samples"] * 1000 if r["samples"] else float("inf")
        rows.append(f"| {name} | ${r['dollars']:.2f} | {r['samples'] / base['samples']:.2f} | {per:.4f} "
                    f"| {r['fallback_h']:.1f} |")
    mine = runs["this job: two Spot groups + on-demand fallback"]
    one = runs["Spot, one group (pool A)"]
    text = (f"{stamp(command())}\n\n" + "\n".join(rows) + "\n\n"
            f"{minutes / 60:g} h of `benchmarks/traces/two_spot_pools.json` (synthetic, seed {trace['seed']}) "
            f"replayed through the driver's job core, `-np {NP} --min-np {MIN_NP}`; prices per slot-hour: "
            + ", ".join(f"{k} ${v:.2f}" for k, v in PRICES.items())
            + f". On-demand only reaches {base['samples'] / ideal:.2f} of the ideal {ideal:,.0f} samples (the rest is "
            f"start-up). The fallback ran {mine['fallback_h']:.1f} slot-hours; a slot waiting below --min-np is paid "
            "for too.")
    ratio = mine["dollars"] / base["dollars"] if base["dollars"] else 0.0
    met = ratio <= 0.5 and mine["samples"] >= 0.9 * base["samples"]
    glance = [["Spot pools + on-demand fallback: cost ≤ 0.5× on-demand only at ≥ 0.9× its goodput (trace replay)",
               f"{ratio:.2f}× the cost at {mine['samples'] / base['samples']:.2f}× the goodput "
               f"(one Spot group: {one['samples'] / base['samples']:.2f}×)",
               f"{ratio / 0.5:.2f}", where(SECTION), docsection.verdict(met)]]
    docsection.publish(args, "multi-source", SECTION, text, glance)


if __name__ == "__main__":
    sys.exit(main())
