"""Soak: a job reset N times on loopback; the survivor's (rank 0's) threads, descriptors and RSS over the resets.

    .venv/bin/python benchmarks/soak.py [--resets 1000] [--quick]

A real job (``cloud-elastic run``, its workers forked by the driver's fork
server) of three loopback hosts, one worker each (this script's ``--worker``: a
linear model, SGD, a commit every step, 20 ms of sleep per step so the machine
stays quiet), ``-np 3 --min-np 1``, hosts from a discovery script this
benchmark rewrites. The worker on 127.0.0.1 is the oldest, so it keeps rank 0
throughout and is never touched: it is the survivor. The two others are hit in
turn, each hit followed by waiting for the job to be back at three workers:

* ``kill``: SIGKILL; the driver starts a new worker on the freed slot (the
  blacklist's cooldown is off: ``--blacklist-cooldown-range 0 1``);
* ``stop``: SIGSTOP; the driver gives it up after ``--heartbeat-timeout 2`` and
  kills it, then starts a new one (it is SIGKILLed here too once given up);
* ``remove``: the host leaves the discovery answer; its worker leaves
  gracefully at a commit (``--host-missing-grace 0``); then the host is added
  back and a new worker joins;
* ``alone``: both other hosts are removed, so the survivor trains alone in a
  group of one, then both are added back;
* ``+new`` (after ``kill``, ``stop`` or ``alone``): the worker started in the
  freed place is hit too: killed as soon as a round with it forms (the
  survivor is forming the group with it, or sending it the state), or stopped
  0-0.1 s after it registers (the driver is admitting it). The survivor's
  formation may fail then, and it leaves its previous round by failure
  (``alone+...``: its group of one).

A *reset* is every round formed after the first (``round_formed`` events): a
hit costs one or two, depending on whether the new worker was ready before the
smaller round formed. A sampler reads the survivor's ``/proc/PID/task``,
``/proc/PID/fd`` and ``VmRSS`` every 0.25 s (and the driver's, for reference).
Transients (a group being destroyed, a release timer, a reconnecting client)
come and go, so a level is the *floor* (minimum) of a stretch of samples: the
first tenth of the run's resets, each tenth, the last 30 samples. Growth per 100
resets is the difference between the last and the first tenth's floors over the
resets between them. Rank 0 also reports its reaper's counts (groups reclaimed,
groups leaked).

Runs in the default commit mode (see ``JOB_ENV``). Prints the
section, one line (the page keeps its length), and writes it into
docs/benchmarks.md (``docsection``: section ``soak`` and its glance row).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import docsection
from common import PY, QUIET, REPO, command, descendants, signal_all, stamp, where

SECTION = "Soak: 1,000 resets"
GLANCE = "No leak over 1,000 resets: a survivor's threads and descriptors flat"
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
SURVIVOR = HOSTS[0]
SAMPLE_S = 0.25
STEP_SLEEP_S = 0.02
#: The default commit mode. (The 1,002-reset run in docs/benchmarks.md used snapshot commits: in the default
#: mode a newcomer stopped while it received the state then failed the job, a bug since fixed in ebb39ab.)
JOB_ENV = {"PYTHONUNBUFFERED": "1"}
WAIT_S = 180.0
QUIET_END_S = 20.0  # a hit that does not get the job back to three workers by then fails the benchmark


# ------------------------------------------------------------------------------ the job's worker
def worker() -> None:
    """One worker of the soak job: prints ``SOAK {...}`` at the start of every round it trains in."""
    import torch
    import torch.nn.functional as F

    import cloud_elastic.torch as hvd
    from cloud_elastic.worker.context import get_context

    print("SOAKSTART " + json.dumps({"pid": os.getpid(), "host": os.environ.get("CLOUD_ELASTIC_HOSTNAME")}),
          flush=True)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        ctx = get_context()
        print("SOAK " + json.dumps({"pid": os.getpid(), "host": os.environ.get("CLOUD_ELASTIC_HOSTNAME"),
                                    "rank": hvd.rank(), "size": hvd.size(), "round": ctx.info.round,
                                    "reclaimed": ctx.reclaimed_groups, "leaked": ctx.leaked_groups}), flush=True)
        while True:
            x = torch.randn(16, 64)
            optimizer.zero_grad()
            F.mse_loss(model(x), x[:, :1]).backward()
            optimizer.step()
            state.step += 1
            state.commit()
            time.sleep(STEP_SLEEP_S)

    train(state)


# ------------------------------------------------------------------------------ the job, seen from here
def counts(pid: int) -> tuple[int, int, int]:
    """(threads, open descriptors, RSS in KiB) of a live process."""
    rss = next(int(l.split()[1]) for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("VmRSS"))
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd")), rss


class SoakJob:
    """The job, its discovery answer, its rounds (events file) and its workers' ``SOAK`` lines."""

    def __init__(self, tmp: Path) -> None:
        sys.path.insert(0, str(REPO))
        from tests.chaos.schedule import ChaosDiscovery

        self.discovery = ChaosDiscovery(tmp, HOSTS)
        self.events_path = tmp / "events.jsonl"
        cmd = [PY, "-m", "cloud_elastic.cli", "run", "-np", "3", "--min-np", "1", "--max-np", "3",
               "--host-discovery-script", str(self.discovery.script), "--blacklist-cooldown-range", "0", "1",
               "--heartbeat-timeout", "2", "--host-missing-grace", "0", "--events-file", str(self.events_path),
               PY, str(Path(__file__).resolve()), "--worker"]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **QUIET, **JOB_ENV), start_new_session=True)
        self.lock = threading.Lock()
        self.lines: list[str] = []
        self.workers: list[dict] = []  # SOAK records, in arrival order
        self.started: list[dict] = []  # SOAKSTART records: a worker's process started
        self.rounds: list[dict] = []   # round_formed events
        self.ready: list[dict] = []    # worker_ready events
        self._events_at = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append(line)
                del self.lines[:-200]
                if "SOAK {" in line:
                    self.workers.append(json.loads(line.split("SOAK ", 1)[1]))
                elif "SOAKSTART {" in line:
                    self.started.append(json.loads(line.split("SOAKSTART ", 1)[1]))

    def _poll_events(self) -> None:
        try:
            with open(self.events_path) as f:
                f.seek(self._events_at)
                text = f.read()
        except FileNotFoundError:
            return
        complete = text[: text.rfind("\n") + 1]
        self._events_at += len(complete.encode())
        for line in complete.splitlines():
            event = json.loads(line)
            if event.get("event") == "round_formed":
                self.rounds.append(event)
            elif event.get("event") == "worker_ready":
                self.ready.append(event)

    def wait(self, what: str, pred, timeout_s: float = WAIT_S, poll_s: float = 0.05):
        deadline = time.monotonic() + timeout_s
        while True:
            self._poll_events()
            with self.lock:
                value = pred()
            if value:
                return value
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with self.lock:
                    tail = "".join(self.lines[-40:])
                raise SystemExit(f"soak: {what}: not within {timeout_s:.0f} s (driver exit {self.proc.poll()}):\n{tail}")
            time.sleep(poll_s)

    def resets(self) -> int:
        return max(0, len(self.rounds) - 1)

    def full(self) -> dict[str, dict] | None:
        """host -> its worker's SOAK record in the latest round, once that round has all three hosts."""
        if not self.rounds or self.rounds[-1]["size"] != len(HOSTS):
            return None
        latest = self.rounds[-1]["round"]
        seen = {w["host"]: w for w in self.workers if w["round"] == latest}
        return seen if len(seen) == len(HOSTS) else None

    def stop(self) -> None:
        signal_all([self.proc.pid] + descendants([self.proc.pid]))
        self.proc.wait()


class Sampler:
    """Samples the survivor's and the driver's counts every ``SAMPLE_S`` with the resets so far."""

    def __init__(self, job: SoakJob, survivor: int) -> None:
        self.job, self.survivor = job, survivor
        self.samples: list[tuple[int, int, int, int]] = []  # (resets, threads, fds, rss KiB)
        self.driver: list[tuple[int, int, int, int]] = []
        self.lost = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            resets = self.job.resets()
            try:
                self.samples.append((resets, *counts(self.survivor)))
                self.driver.append((resets, *counts(self.job.proc.pid)))
            except (OSError, StopIteration):
                self.lost = True
                return

    def close(self) -> None:
        self._done.set()
        self._thread.join()


# ------------------------------------------------------------------------------ the resets
#: One cycle of hits (see the module docstring).
CYCLE = ("kill", "stop", "remove", "kill+new", "alone", "stop+new", "alone+kill+new", "alone+stop+new")


def hit(job: SoakJob, kind: str, host: str, survivor: int, rng: random.Random) -> None:
    """Hit the worker on ``host`` (``alone``: both others) as ``kind`` says; return once the job trains at three
    workers again, with new workers in the hit places and the same survivor."""
    members = job.wait("three workers", job.full)
    hosts = HOSTS[1:] if kind.startswith("alone") else [host]
    victims = {h: members[h]["pid"] for h in hosts}
    before = len(job.rounds)
    with job.lock:
        started_at, ready_at = len(job.started), len(job.ready)
    if kind.startswith(("remove", "alone")):
        job.discovery.set([h for h in HOSTS if h not in hosts])
    else:
        os.kill(victims[host], signal.SIGKILL if kind.startswith("kill") else signal.SIGSTOP)
    job.wait(f"a round without the worker on {', '.join(hosts)} ({kind})",
             lambda: any(all(h not in r["ranks"] for h in hosts) for r in job.rounds[before:]))
    stopped = [] if kind.startswith("kill") or kind.startswith(("remove", "alone")) else [victims[host]]
    job.discovery.set(HOSTS)
    if kind.endswith("+new"):
        if "kill" in kind:  # as the round that admits it forms: its peers are forming the group with it
            gone = next(i for i in range(before, len(job.rounds)) if all(h not in job.rounds[i]["ranks"] for h in hosts))
            job.wait(f"a round with the new worker on {hosts[0]}",
                     lambda: any(hosts[0] in r["ranks"] for r in job.rounds[gone + 1:]), poll_s=0.005)
        else:  # as it registers: the driver is about to admit it
            job.wait(f"the new worker on {hosts[0]} registered",
                     lambda: any(e["host"] == hosts[0] for e in job.ready[ready_at:]))
            time.sleep(rng.uniform(0.0, 0.1))
        newcomer = job.wait(f"a new worker on {hosts[0]}", lambda: next(
            (w["pid"] for w in job.started[started_at:] if w["host"] == hosts[0]), None))
        try:
            os.kill(newcomer, signal.SIGSTOP if "stop" in kind else signal.SIGKILL)
            stopped.append(newcomer)
        except ProcessLookupError:
            pass
    job.wait(f"new workers on {', '.join(hosts)} after {kind}", lambda: (m := job.full()) is not None and all(
        m[h]["pid"] not in (victims[h], *stopped) for h in hosts) and m[SURVIVOR]["pid"] == survivor)
    for pid in stopped:  # given up by the driver already; make sure they are gone
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def summarize(samples: list[tuple[int, int, int, int]], resets: int) -> dict:
    """Floors (threads, descriptors, RSS KiB) of the run's stretches: before the first reset, each tenth of
    the resets, the last 30 samples; and the growth per 100 resets from the first tenth to the last."""
    def floors(rows: list[tuple]) -> tuple[int, int, int] | None:
        return tuple(min(r[c] for r in rows) for c in (1, 2, 3)) if rows else None

    tenths = [floors([s for s in samples if resets * i / 10 < s[0] <= resets * (i + 1) / 10]) for i in range(10)]
    known = [t for t in tenths if t is not None]
    return {
        "before": floors([s for s in samples if s[0] == 0]) or floors(samples[:1]),
        "tenths": tenths,
        "last30": floors(samples[-30:]),
        "end": samples[-1][1:],
        "growth": tuple((known[-1][c] - known[0][c]) / (resets * 0.9) * 100 for c in range(3)),
    }


def figures(s: dict) -> str:
    """One process's floors, in words: (threads, descriptors, RSS MiB) per stretch, then each tenth's."""
    known = [t for t in s["tenths"] if t is not None]

    def three(v: tuple) -> str:
        return f"{v[0]}, {v[1]}, {v[2] / 1024:.0f}"

    def column(c: int) -> str:
        return " ".join("–" if t is None else (f"{t[c] / 1024:.0f}" if c == 2 else str(t[c])) for t in s["tenths"])

    g = s["growth"]
    return (f"before the first reset {three(s['before'])}; first tenth of the resets {three(known[0])}; last tenth "
            f"{three(known[-1])}; last 30 samples {three(s['last30'])}; growth per 100 resets {g[0]:+.2f}, {g[1]:+.2f}, "
            f"{g[2] / 1024:+.2f} (each tenth: threads {column(0)}; descriptors {column(1)}; RSS {column(2)})")


def text_of(run: dict, stamp_line: str) -> str:
    """The section: one line (the page keeps its length), from the run's summary (``main`` prints it as JSON)."""
    hits = ", ".join(f"{k} {v}" for k, v in run["hits"].items())
    return (f"{stamp_line} {run['resets']} resets in {run['seconds'] / 60:.0f} min (hits: {hits}). Floors of the "
            f"samples (threads, descriptors, RSS MiB), rank 0: {figures(run['survivor'])}; its reaper reclaimed "
            f"{run['reaper']['reclaimed']} abandoned groups and leaked {run['reaper']['leaked']}. The driver: "
            f"{figures(run['driver'])}.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resets", type=int, default=None, help="resets to cause (default 1000; 12 with --quick)")
    p.add_argument("--seed", type=int, default=44, help="seed of the delays before a newcomer is hit")
    p.add_argument("--verbose", action="store_true", help="a line per hit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    docsection.add_arguments(p)
    args = p.parse_args()
    if args.worker:
        worker()
        return
    goal = args.resets or (12 if args.quick else 1000)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        job = SoakJob(Path(tmp))
        try:
            members = job.wait("the first round of three workers", job.full, 300)
            survivor_pid = members[SURVIVOR]["pid"]
            time.sleep(2.0)  # samples before the first reset
            sampler = Sampler(job, survivor_pid)
            time.sleep(2.0)
            kinds = dict.fromkeys(CYCLE, 0)
            rng = random.Random(args.seed)
            n = 0
            while job.resets() < goal:
                kind, host = CYCLE[n % len(CYCLE)], HOSTS[1 + n % 2]
                hit(job, kind, host, survivor_pid, rng)
                kinds[kind] += 1
                n += 1
                if args.verbose:
                    print(f"soak: {time.time():.2f} {kind} on {host}: {job.resets()} resets, survivor "
                          f"{sampler.samples[-1][1:]}", flush=True)
                elif n % 10 == 0:
                    print(f"soak: {job.resets()} resets, {time.monotonic() - started:.0f} s, survivor "
                          f"{sampler.samples[-1][1:]} (threads, fds, RSS KiB), load {os.getloadavg()[0]:.1f}",
                          flush=True)
            job.wait("three workers", job.full)
            # Quiet samples: longer than a given-up formation lives (five tries sharing the 65 s deadline), so
            # that "the last 30 samples" are of the job at rest, not of the last hit.
            time.sleep(QUIET_END_S)
            sampler.close()
            if sampler.lost:
                raise SystemExit("soak: the survivor exited")
            reaper = [w for w in job.workers if w["pid"] == survivor_pid][-1]
        finally:
            job.stop()
    resets = job.resets()
    elapsed = time.monotonic() - started
    mine, driver = summarize(sampler.samples, resets), summarize(sampler.driver, resets)
    run = {"resets": resets, "hits": kinds, "seconds": round(elapsed), "survivor": mine, "driver": driver,
           "reaper": reaper}
    print(json.dumps(run), flush=True)
    text = text_of(run, stamp(command()))
    first = next(t for t in mine["tenths"] if t is not None)
    last = [t for t in mine["tenths"] if t is not None][-1]
    flat = last[0] <= first[0] and last[1] <= first[1] and reaper["leaked"] == 0
    glance = [[GLANCE, f"threads {first[0]} → {last[0]}, descriptors {first[1]} → {last[1]}, RSS "
               f"{first[2] / 1024:.0f} → {last[2] / 1024:.0f} MiB (floors, first and last tenth of {resets} resets); "
               f"{reaper['leaked']} groups leaked", f"{resets / 1000:.2f} (resets run / 1,000)",
               where(SECTION), docsection.verdict(flat and resets >= 1000)]]
    docsection.publish(args, "soak", SECTION, text, glance)


if __name__ == "__main__":
    main()
