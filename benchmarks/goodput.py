"""Goodput on a seeded trace of spot events: cloud-elastic, torchft and torchrun elastic on the same trace.

    .venv/bin/python benchmarks/goodput.py [--rates 1 3] [--spares 0 1] [--seed 41] [--peers] [--quick]

Goodput = useful samples ÷ what an undisturbed run at full size makes in the same time.

The job has three workers, one per emulated host (loopback addresses
127.0.0.2, 127.0.0.3, ...). Each worker emulates a GPU host's costs
(``goodput_worker.py``): ``--startup-s`` slept once per new process (CUDA
initialisation and data loading) and ``--device-s`` slept in every step (device
time, which does not load this machine's CPU), so capacity scales with workers
on 2 cores.

The trace (:func:`make_trace`) is drawn from ``--seed`` alone: at R events a
minute, a host is lost every 120/R s (±15 %, seeded), by turns a ``kill -9``
(the instance is gone at once) and a spot notice (the instance is gone
``--lead-s`` later, whatever its workers do), and each loss brings a new
instance, at a new address, ``--boot-s`` after the event (the host back, the
third kind of event). Which host is lost is a seeded pick among those running.
The benchmark plays the cloud: for cloud-elastic, a discovery script lists the
running instances and a fake AWS metadata service per host serves the spot
notice (``--notice-watcher aws``); for the peers, which have no discovery and
no notice watcher, it starts a host's process (torchft replica group,
torchrun agent) when the host boots and kills it when the host goes. A process
started on a gone host fails at once, as an ssh to it would.

Per system and event rate, a fresh job: once it steps at full size, the 30 s
before the trace (10 s with ``--quick``) give its undisturbed samples per
second; then the trace plays for its length. Useful samples are those of the
steps that stay in the training's history (a step trained again after a
rollback or a restart from a checkpoint counts once, at its last size).
Also reported: each kill's and notice's time to the first step that starts
after it at full size.

``--spares N ...`` (default ``0 1``: both, side by side) runs cloud-elastic
once per N with ``cloud-elastic run --spares N`` (issue 41: N workers beyond
the target size, started and waiting, that replace a lost one in the same
recovery). With N > 0 the job gets N more hosts from the start; its trace has
the same event times and kinds (the same seed), the picks falling among every
running instance, the spare included, as a cloud's reclaims do. The peers have
no spares: they run once per rate, on the trace of 0 spares. The cost of a
spare is stated as the instances paid (running) on average over the trace and
the goodput per instance paid (goodput × 3 ÷ instances paid: 1 for an
undisturbed job of 3 instances).

Prints the table and writes it into docs/benchmarks.md (``docsection``: section
``goodput`` and its glance row, which states the figure with one spare against
the 0.99 target).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docsection
from common import PY, REPO, TORCHRUN_ELASTIC, JobExited, Procs, command, descendants, free_port, signal_all, stamp, where

sys.path.insert(0, str(REPO))
from tests.emulator.fake_metadata import FakeAWSMetadata, per_host  # noqa: E402

WORKER = str(Path(__file__).resolve().with_name("goodput_worker.py"))
SIZE = 3  # workers of the job at full size (-np)
SECTION = "Goodput on a trace of spot events"
TARGET = 0.99
GLANCE = "Goodput at 3 events a minute (kill -9, spot notice, host back; boot 20 s, start-up 10 s) ≥ 0.99 with one spare"
CLOUD_ELASTIC = "cloud-elastic"
TORCHFT = "torchft 0.2 (defaults: heartbeat 5 s, quorum tick 100 ms)"
TORCHRUN = "torchrun elastic (c10d, monitor 0.1 s, last call 1 s, checkpoint every 10 steps)"


# ------------------------------------------------------------------------------ the trace
@dataclass(frozen=True)
class TraceEvent:
    """One event at ``at_s`` seconds into the trace: "kill" (kill -9, the host gone at once), "notice"
    (a spot notice), "gone" (the noticed host terminated; part of its notice, not counted as an
    event) or "back" (a new instance running at a new address)."""

    at_s: float
    kind: str
    host: str


@dataclass(frozen=True)
class Trace:
    seed: int
    events_per_min: float
    duration_s: float
    boot_s: float
    lead_s: float
    initial: tuple[str, ...]
    events: tuple[TraceEvent, ...]

    def hosts(self) -> list[str]:
        return [*self.initial, *(e.host for e in self.events if e.kind == "back")]

    def counted(self) -> list[TraceEvent]:
        return [e for e in self.events if e.kind != "gone"]

    def mean_instances(self, cap: int | None = None) -> float:
        """Instances running (paid for), on average over the trace: the cost side of spares. With ``cap``,
        at most ``cap`` of them count: ``mean_instances(SIZE) / SIZE`` is the goodput of a system that
        used every running instance at once, the ceiling without spares."""
        running, last, area = len(self.initial), 0.0, 0.0
        for e in self.events:
            area += min(running, cap or running) * (e.at_s - last)
            last = e.at_s
            running += {"kill": -1, "gone": -1, "back": 1}.get(e.kind, 0)
        return (area + min(running, cap or running) * (self.duration_s - last)) / self.duration_s


def address(i: int) -> str:
    return f"127.0.0.{2 + i}"


def make_trace(seed: int, events_per_min: float, duration_s: float, boot_s: float, lead_s: float,
               hosts: int) -> Trace:
    """The events of ``duration_s`` seconds, from ``seed`` and the rate only (see the module docstring).

    A loss and the host back it brings are two events, so losses come every ``120 / events_per_min``
    seconds; the first a quarter of that interval in. A loss never takes the last running host."""
    if not lead_s < boot_s:
        raise SystemExit("--lead-s must be shorter than --boot-s (a replacement never overlaps the host it replaces)")
    rng = random.Random(f"goodput/{seed}/{events_per_min:g}")
    interval = 120.0 / events_per_min
    running = [address(i) for i in range(hosts)]
    leaving: set[str] = set()
    events: list[TraceEvent] = []
    kind = rng.choice(["kill", "notice"])
    made, t = hosts, interval / 4
    while t < duration_s:
        at = round(t + rng.uniform(-0.15, 0.15) * interval, 2)
        for e in events:  # hosts back and gone by then
            if e.at_s <= at and e.kind == "back" and e.host not in running:
                running.append(e.host)
            if e.at_s <= at and e.kind == "gone" and e.host in running:
                running.remove(e.host)
        candidates = sorted(h for h in running if h not in leaving)
        pick = rng.random()
        if len(candidates) >= 2:
            victim = candidates[int(pick * len(candidates))]
            events.append(TraceEvent(at, kind, victim))
            if kind == "kill":
                running.remove(victim)
            else:
                leaving.add(victim)
                events.append(TraceEvent(round(at + lead_s, 2), "gone", victim))
            events.append(TraceEvent(round(at + boot_s, 2), "back", address(made)))
            made += 1
        kind = "notice" if kind == "kill" else "kill"
        t += interval
    kept = sorted((e for e in events if e.at_s < duration_s), key=lambda e: e.at_s)
    return Trace(seed, events_per_min, duration_s, boot_s, lead_s, tuple(address(i) for i in range(hosts)), tuple(kept))


# ------------------------------------------------------------------------------ the systems
class System:
    """One system's job on the emulated hosts: ``start`` on the trace's first hosts, then the trace's
    events as methods; ``stop`` ends every process."""

    name: str
    job: Procs

    def back(self, host: str) -> None:
        raise NotImplementedError

    def kill(self, host: str) -> None:
        raise NotImplementedError

    def notice(self, host: str) -> None:
        """The peers have no notice watcher: nothing happens until the host goes."""

    def gone(self, host: str) -> None:
        self.kill(host)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.job.stop()


class CloudElastic(System):
    def __init__(self, trace: Trace, tmp: Path, worker_args: list[str], spares: int) -> None:
        self.name = CLOUD_ELASTIC
        self.trace, self.tmp, self.spares = trace, tmp, spares
        self.dead = tmp / "dead"
        self.dead.mkdir()
        self.running = list(trace.initial)
        self.script = tmp / "discover.sh"
        self.script.write_text(f"#!/bin/sh\ncat '{tmp / 'hosts.txt'}'\n")
        self.script.chmod(0o755)
        self._write()
        self.cmd = [PY, "-m", "cloud_elastic.cli", "run", "-np", str(SIZE), "--min-np", "1", "--max-np", str(SIZE),
                    *(["--spares", str(spares)] if spares else []), "--host-discovery-script", str(self.script),
                    "--notice-watcher", "aws", PY, WORKER, "elastic", *worker_args]
        self._stack = contextlib.ExitStack()

    def _write(self) -> None:
        tmp = self.tmp / "hosts.tmp"
        tmp.write_text("".join(f"{h}:1\n" for h in self.running))
        tmp.replace(self.tmp / "hosts.txt")

    def start(self) -> None:
        self.fakes = self._stack.enter_context(per_host(FakeAWSMetadata, self.trace.hosts()))
        port = next(iter(self.fakes.values())).port
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{port}", "AWS_EC2_METADATA_DISABLED": "false",
               "GOODPUT_DEAD_DIR": str(self.dead),
               # Every worker starts from scratch, importing torch, as on a new instance (and as the peers'
               # do): forked from the driver's preloaded server, a loopback "new host" would skip that.
               "CLOUD_ELASTIC_LOCAL_FORKSERVER": "0"}
        self.job = Procs([self.cmd], env)

    def _pids_on(self, host: str) -> list[int]:
        with self.job.cond:
            return sorted({r["pid"] for r in self.job.logs if r.get("host") == host})

    def back(self, host: str) -> None:
        self.running.append(host)
        self._write()

    def kill(self, host: str) -> None:
        (self.dead / host).touch()  # first: a worker starting there now fails
        if host in self.running:
            self.running.remove(host)
            self._write()
        signal_all(descendants(self._pids_on(host)))

    def notice(self, host: str) -> None:
        self.fakes[host].set_spot_action("terminate", time.time() + self.trace.lead_s)

    def stop(self) -> None:
        super().stop()
        self._stack.close()


class TorchFT(System):
    name = TORCHFT

    def __init__(self, trace: Trace, tmp: Path, worker_args: list[str]) -> None:
        self.trace, self.worker_args = trace, worker_args
        self.procs: dict[str, subprocess.Popen] = {}

    def _cmd(self, host: str) -> list[str]:
        return [PY, WORKER, "torchft", *self.worker_args, "--lighthouse", self.lighthouse.address(), "--host", host]

    def start(self) -> None:
        from torchft._torchft import LighthouseServer

        self.lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=60000,
                                           heartbeat_timeout_ms=5000, quorum_tick_ms=100)
        self.job = Procs([], {})
        for host in self.trace.initial:
            self.back(host)

    def back(self, host: str) -> None:
        self.procs[host] = self.job.add(self._cmd(host))

    def kill(self, host: str) -> None:
        proc = self.procs.pop(host, None)
        if proc is not None:
            signal_all(descendants([proc.pid]))

    def stop(self) -> None:
        super().stop()
        self.lighthouse.shutdown()


class TorchrunElastic(System):
    name = TORCHRUN

    def __init__(self, trace: Trace, tmp: Path, worker_args: list[str]) -> None:
        self.trace, self.tmp, self.worker_args = trace, tmp, worker_args
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        from torch.distributed import TCPStore

        # The rendezvous store on this machine (the CPU VM), as an etcd would be: a lost host never takes it along.
        self.port = free_port()
        self.store = TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False, multi_tenant=True)
        self.job = Procs([], {})
        for host in self.trace.initial:
            self.back(host)

    def back(self, host: str) -> None:
        cmd = [*TORCHRUN_ELASTIC, "--nnodes", f"1:{SIZE}", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", f"goodput{self.port}",
               "--rdzv-conf", "is_host=false,last_call_timeout=1", "--max-restarts", "1000", "--monitor-interval", "0.1",
               WORKER, "torchrun", "--checkpoint-dir", str(self.tmp), *self.worker_args]
        self.procs[host] = self.job.add(cmd, {"GOODPUT_HOST": host})

    def kill(self, host: str) -> None:
        proc = self.procs.pop(host, None)
        if proc is not None:
            signal_all(descendants([proc.pid]))


# ------------------------------------------------------------------------------ one run
def history(records: list[dict]) -> list[dict]:
    """The steps that stay in the training's history, in order: a step logged again (after a rollback or a
    restart from a checkpoint) replaces the earlier one and every later step of the old history."""
    kept: list[dict] = []
    for r in sorted(records, key=lambda r: r["t"]):
        while kept and kept[-1]["step"] > r["step"]:
            kept.pop()
        if kept and kept[-1]["step"] == r["step"]:
            kept[-1] = r
        else:
            kept.append(r)
    return kept


def samples(kept: list[dict], t0: float, t1: float, batch: int) -> int:
    return batch * sum(r["size"] for r in kept if t0 <= r["t"] < t1)


def to_full_size(records: list[dict], since: float, host: str, until: float) -> float | None:
    """Seconds from an event at ``since`` on ``host`` to the end of the first step at full size that started
    after the host's last step (a noticed host's workers may step on until they leave); None if none by ``until``."""
    last = max([r["t"] for r in records if r["host"] == host and r["t"] >= since], default=since)
    steps: dict[int, list[dict]] = {}
    for r in records:
        if r["size"] >= SIZE and r["t0"] > last and r["t"] <= until:
            steps.setdefault(r["step"], []).append(r)
    # A step counts once SIZE hosts logged it, none of them the lost one: a step whose collective ran just
    # before a kill can end after it, logged by the survivors only, and a restart from a checkpoint
    # repeats step numbers (its records are all later than ``last``).
    ends = [max(r["t"] for r in rs) for rs in steps.values()
            if len({r["host"] for r in rs}) >= SIZE and host not in {r["host"] for r in rs}]
    return min(ends) - since if ends else None


def sizes(kept: list[dict], t0: float) -> str:
    """When the world size of the kept steps changed, from the trace's start: ``-35.0 s: 3, 12.1 s: 2, ...``."""
    out, size = [], None
    for r in kept:
        if r["size"] != size:
            size = r["size"]
            out.append(f"{r['t'] - t0:.1f} s: {size}")
    return ", ".join(out)


def one_run(system: System, trace: Trace, baseline_s: float, batch: int, bound_s: float,
            log_dir: Path | None = None, tag: str = "") -> dict:
    system.start()
    job = system.job
    try:
        steps = lambda: [r for r in job.logs if "step" in r]  # noqa: E731
        job.wait(lambda: any(r["size"] >= SIZE for r in steps()), bound_s, f"{system.name}: stepping at full size")
        time.sleep(5.0)  # past the first steps at full size
        tb = time.time()
        time.sleep(baseline_s)
        t0 = time.time()
        applied, ended = [], None
        # The trace plays on even when every process of the job has ended: a host that comes back starts
        # its process again (a torchrun agent joins the rendezvous and resumes from the checkpoint).
        for e in [*sorted(trace.events, key=lambda e: e.at_s), TraceEvent(trace.duration_s, "end", "")]:
            while time.time() < t0 + e.at_s:
                time.sleep(min(0.5, max(0.0, t0 + e.at_s - time.time())))
                if ended is None and all(p.poll() is not None for p in job.procs):
                    ended = time.time() - t0
                    print(f"{system.name}: every process ended at {ended:.1f} s:\n" + "".join(job.lines[-20:]), flush=True)
            if e.kind == "end":
                break
            getattr(system, e.kind)(e.host)
            applied.append((time.time(), e))
            print(f"{system.name}: {e.at_s:6.1f} s {e.kind} {e.host}", flush=True)
        t1 = time.time()
        with job.cond:
            records = steps()
    finally:
        system.stop()
        if log_dir is not None and getattr(system, "job", None) is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            name = "".join(c if c.isalnum() else "-" for c in system.name.split(" (")[0])
            (log_dir / f"{name}{'-' + tag if tag else ''}-{trace.events_per_min:g}.log").write_text("".join(system.job.lines))
    kept = history(records)
    base = samples(kept, tb, t0, batch) / (t0 - tb)
    useful = samples(kept, t0, t1, batch)
    print(f"{system.name}: world size from the trace's start: {sizes(kept, t0)}", flush=True)
    times = {kind: [to_full_size(records, at, e.host, t1) for at, e in applied if e.kind == kind]
             for kind in ("kill", "notice")}
    return {"goodput": useful / (base * (t1 - t0)), "baseline_per_s": base, "useful": useful, "window_s": t1 - t0,
            "ended_s": ended,
            "to_full": times, "left_s": {k: [t1 - at for at, e in applied if e.kind == k] for k in times}}


# ------------------------------------------------------------------------------ report
def _times(values: list[float | None], left: list[float]) -> str:
    if not values:
        return "–"
    return ", ".join(f"{v:.1f}" if v is not None else f"> {l:.0f}" for v, l in zip(values, left))


Results = dict[tuple[str, float, int], dict]  # (system, events a minute, spares) -> one run's figures


def per_instance(r: dict) -> float:
    """Goodput per instance paid: useful samples ÷ what the instances paid would make at full speed
    (1.0: an undisturbed job of SIZE instances; a spare that is never needed costs 1/(SIZE+1) of it)."""
    return r["goodput"] * SIZE / r["instances"]


def table(results: Results, traces: dict[tuple[float, int], Trace]) -> str:
    lines = ["| system | spares | events a minute (kills, notices, hosts back) | goodput | instances paid, mean | "
             f"goodput per instance paid (× {SIZE} ÷ instances) | undisturbed samples/s | "
             "kill → first step at full size (s, each) | notice → first step at full size (s, each) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (name, rate, spares), r in sorted(results.items(), key=lambda kv: kv[0][1]):  # stable: run order per rate
        counted = traces[(rate, spares)].counted()
        mix = ", ".join(str(sum(e.kind == k for e in counted)) for k in ("kill", "notice", "back"))
        paid = f"{traces[(rate, spares)].mean_instances():.2f}"
        if "error" in r:
            lines.append(f"| {name} | {spares} | {rate:g} ({mix}) | failed: {r['error']} | {paid} | – | – | – | – |")
            continue
        died = f" (every process had ended at {r['ended_s']:.0f} s)" if r.get("ended_s") is not None else ""
        lines.append(f"| {name} | {spares} | {rate:g} ({mix}) | **{r['goodput']:.3f}**{died} | {paid} | "
                     f"{per_instance(r):.3f} | {r['baseline_per_s']:.0f} | "
                     f"{_times(r['to_full']['kill'], r['left_s']['kill'])} | "
                     f"{_times(r['to_full']['notice'], r['left_s']['notice'])} |")
    return "\n".join(lines)


def glance(results: Results) -> list[list[str]]:
    """The glance row: cloud-elastic with one spare at 3 events a minute against the target, with none, the peers,
    and what the spare costs."""
    at3 = {(n, spares): r for (n, rate, spares), r in results.items() if rate == 3 and "goodput" in r}
    if not at3:
        return []
    one, none = at3.get((CLOUD_ELASTIC, 1)), at3.get((CLOUD_ELASTIC, 0))
    parts = []
    if one is not None:
        kills = [v for v in one["to_full"]["kill"] if v is not None]
        parts.append(f"{one['goodput']:.3f} with one spare" + (f" (kill → full size {max(kills):.1f} s)" if kills else ""))
    if none is not None:
        kills = [v for v in none["to_full"]["kill"] if v is not None]
        parts.append(f"{none['goodput']:.3f} with none" + (f" (kill → full size {max(kills):.0f} s)" if kills else ""))
    if one is not None and none is not None:
        parts.append(f"the spare: {one['instances']:.2f} instances paid on average against {none['instances']:.2f}, "
                     f"goodput per instance paid {per_instance(one):.3f} against {per_instance(none):.3f}")
    peers = [f"{n.split(' ')[0]} {r['goodput']:.3f}" for (n, spares), r in at3.items() if n != CLOUD_ELASTIC]
    if peers:
        parts.append(", ".join(peers))
    if one is None:
        return [[GLANCE, "; ".join(["not run with a spare", *parts]), "–", where(SECTION), docsection.verdict(False)]]
    return [[GLANCE, "; ".join(parts), f"{one['goodput'] / TARGET:.3f}", where(SECTION),
             docsection.verdict(one["goodput"] >= TARGET)]]


def has_spares() -> bool:
    out = subprocess.run([PY, "-m", "cloud_elastic.cli", "run", "--help"], capture_output=True, text=True, cwd=REPO)
    return "--spares" in out.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=float, nargs="+", default=None,
                   help="events a minute, one run per system each (default 1 3; 3 with --quick)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of trace per run (default 240 at 1 event a minute, 120 at more; 60 with --quick)")
    p.add_argument("--spares", type=int, nargs="+", default=[0, 1],
                   help="cloud-elastic's --spares (issue 41), one run per N, side by side on the same trace; N more "
                        "hosts from the start (default: 0 1)")
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--boot-s", type=float, default=20.0, help="a new instance runs this long after the event")
    p.add_argument("--lead-s", type=float, default=10.0, help="a noticed instance goes this long after its notice")
    p.add_argument("--startup-s", type=float, default=10.0, help="a new worker process's start-up (slept)")
    p.add_argument("--device-s", type=float, default=0.2, help="device time per step (slept)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--peers", action="store_true", help="also torchft and torchrun elastic (requirements/bench.txt)")
    p.add_argument("--only", action="append", choices=["cloud-elastic", "torchft", "torchrun"],
                   help="run only this system (repeatable; implies --no-write)")
    p.add_argument("--log-dir", type=Path, default=None, help="write each run's whole output here")
    docsection.add_arguments(p)
    args = p.parse_args()
    args.no_write = args.no_write or bool(args.only)
    if max(args.spares) > 0 and not has_spares():
        raise SystemExit("this checkout's `cloud-elastic run` has no --spares (issue 41): run with --spares 0")
    rates = args.rates or ([3.0] if args.quick else [1.0, 3.0])
    baseline_s = 10.0 if args.quick else 30.0
    os.environ.setdefault("RUST_LOG", "warn")  # the Lighthouse in this process logs every quorum at info
    worker_args = ["--startup-s", str(args.startup_s), "--device-s", str(args.device_s),
                   "--batch-size", str(args.batch_size)]
    spares_runs = sorted(set(args.spares))
    duration = lambda rate: args.duration or (60.0 if args.quick else 240.0 if rate <= 1 else 120.0)  # noqa: E731
    # One trace per rate and number of spares: the same seed, so the same event times and kinds.
    traces = {(rate, n): make_trace(args.seed, rate, duration(rate), args.boot_s, args.lead_s, SIZE + n)
              for rate in rates for n in sorted({0, *spares_runs})}
    results: Results = {}
    for rate in rates:
        runs: list[tuple[str, int, object]] = [
            ("cloud-elastic", n, (lambda n: lambda tmp: CloudElastic(traces[(rate, n)], tmp, worker_args, n))(n))
            for n in spares_runs]
        if args.peers:
            runs += [("torchft", 0, lambda tmp: TorchFT(traces[(rate, 0)], tmp, worker_args)),
                     ("torchrun", 0, lambda tmp: TorchrunElastic(traces[(rate, 0)], tmp, worker_args))]
        for key, spares, make in runs:
            if args.only and key not in args.only:
                continue
            trace = traces[(rate, spares)]
            print(f"trace at {rate:g} events a minute, {spares} spare(s): "
                  + ", ".join(f"{e.at_s:.1f} {e.kind} {e.host}" for e in trace.events), flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                system = make(Path(tmp))
                try:
                    r = one_run(system, trace, baseline_s, args.batch_size, bound_s=180.0, log_dir=args.log_dir,
                                tag=f"{spares}spare" if key == "cloud-elastic" else "")
                except (TimeoutError, JobExited) as exc:
                    print(f"{system.name}: {exc}", flush=True)
                    r = {"error": str(exc).splitlines()[0].replace(f"{system.name}: ", "")[:80]}
                r["instances"] = trace.mean_instances()
                results[(system.name, rate, spares)] = r
                print(f"{system.name}, {spares} spare(s), at {rate:g}/min: " + ", ".join(f"{k} {v}" for k, v in r.items()),
                      flush=True)
    if args.log_dir is not None:
        (args.log_dir / "results.json").write_text(json.dumps(
            {f"{n}, {s} spare(s) @ {r:g}/min": v for (n, r, s), v in results.items()}, indent=1))
    no_spare = {r: t for (r, n), t in traces.items() if n == 0}
    text = "\n\n".join([
        f"{stamp(command())} Three workers, one per emulated host; each new worker process sleeps "
        f"{args.startup_s:g} s before it joins (start-up: CUDA initialisation, data loading) and each step sleeps "
        f"{args.device_s:g} s (device time, no load on the CPU), batch {args.batch_size}. Trace seed {args.seed}: a "
        f"host lost by turns to `kill -9` and to a spot notice (gone {args.lead_s:g} s later), each followed by a new "
        f"host {args.boot_s:g} s after the loss; {', '.join(f'{t.duration_s:g} s at {r:g}/min' for r, t in no_spare.items())}. "
        f"Goodput = useful samples (steps kept in the training's history) ÷ the same job's samples per second over "
        f"the {baseline_s:g} s at full size before the trace × the trace's length. Spares: "
        f"{', '.join(map(str, spares_runs))} (`--spares`): with N, N more instances from the start, the same event "
        f"times and kinds, the picks among every running instance (the spare included); the peers run on the trace "
        f"of 0 spares. Instances paid = running, on average over the trace. Without spares a system that used every "
        f"running instance at once would reach {', '.join(f'{t.mean_instances(SIZE) / SIZE:.3f} at {r:g}/min' for r, t in no_spare.items())} "
        f"(the ceiling without spares). One run per row, one after another on a shared machine.",
        table(results, traces)])
    docsection.publish(args, "goodput", SECTION, text, glance(results))

if __name__ == "__main__":
    main()
