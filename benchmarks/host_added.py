"""Host added: the running workers' stall while a third worker is admitted, and the newcomer's time to its first step.

    .venv/bin/python benchmarks/host_added.py [--repeats 7] [--state-mb 10,100,1000] [--device-ms 30] [--peers] [--quick]

Two workers train a small MLP (3 hidden layers of width 256, batch 64, SGD with
momentum, one OpenMP thread each) and a third is admitted, a fresh job per
repeat, each system as it admits one:

* cloud-elastic: a discovery script lists 127.0.0.1 and 127.0.0.2; once both
  workers are past the warm-up, 127.0.0.3 is added to its answer. The driver
  finds it at its next discovery (every 1 s, the default), starts a worker
  there, and admits it at the running workers' next commit (every step here).
* with ``--peers`` (``requirements/bench.txt``), torchft 0.2: a Lighthouse in
  this process and one replica group of one worker per process, the third
  replica group's process started here; and torchrun elastic (``--nnodes
  2:3``, c10d, monitor 0.1 s, last call 1 s, a checkpoint every 10 steps): a
  third agent is started, and the running agents restart all their workers.

Per repeat: the *normal step* (median interval between a survivor's consecutive
completed steps over the 2 s before the host was added; and at size 3, over the
first 3 s once the newcomer is active, which is not part of the stall), the *longest gap*
between consecutive completed steps of a survivor from the host's addition to
0.5 s after the first step at size 3, or after the first step at which the
newcomer no longer follows (cloud-elastic's follow mode, ``commit.follow``: the
window in which it receives the state counts; its length is reported) (for torchrun, whose workers are all
restarted: from the old group's last step to the new group's first), the
*stall* (longest gap − normal step), the *stall from the switch on* (the same,
of the gaps that end at or after the first step at size 3: a gap before it
falls while the newcomer starts up, on this machine's cores), the *admitting step's gap* (the longest
gap ending within 0.1 s of the first step at size 3: torchft reports the
admitted replica only from the step after the one that admits it) and the
newcomer's time from its process start (and from the host's appearance in the
discovery answer; for torchft the two are the same) to its first completed step,
and an *undisturbed control* measured in the same job: the survivors' longest gap
(less the normal step) over a stretch at size 3 as long as the one the stall from
the switch on looks at, right after it (the newcomer active, nothing of the
admission left), so that the stall can be read against what three workers on
these cores do over as many seconds anyway (none for torchrun: no survivor).
And the CPU time the hypervisor *stole* from this VM (``/proc/stat``'s steal,
both cores summed, sampled every 50 ms) over the stall's gap from the switch on
and over the control's longest gap, each widened to the samples around it: a
long gap with as long a steal in it was the host's, not the admission's.
The systems take turns within each repeat, so a slow minute hits each of them.

``--state-mb 10,100,1000`` (the default; 10 with ``--quick``; ``none`` for
none) adds, per size, a row of cloud-elastic whose state carries that many MB
more (``workload.py --state-mb``: an entry of the optimizer's state of which each
step changes 64 KiB, a different part each step, so the step time stays the small
model's while every sync carries it to the newcomer and a follower must follow
its changes), in the same rounds; ``--against`` adds the other checkout's rows at
each size too. Each job's peak resident memory (every
process of the job, summed; sampled every 0.2 s) is reported.

``--against DIR`` adds a row of cloud-elastic run from another checkout (a ``git
worktree`` of an older revision, say), in the same rounds: a change's effect side by
side, which two runs on this shared machine cannot show.

``--device-ms 30`` adds, in the same rounds, an *emulated GPU host*'s twin of
every cloud-elastic row (not of ``--against``'s): each step sleeps 30 ms before its
forward and backward passes (``workload.py --device-s``: device time, which loads
no CPU, as ``goodput.py`` emulates it; before the gradients' allreduce, which
still waits for a late peer), the model unchanged. The CPU-bound rows are the
target's own measure, but on 2 cores three workers share what two had, so every
step at size 3 is slower than at size 2 and the stall's longest gap counts that
too; with most of a step asleep, three workers step about as fast as two, as on
hosts of their own, and what remains is the admission's cost. (The newcomer's
start-up, importing torch, still runs on this machine's cores.)

Prints the table and writes it into docs/benchmarks.md (``docsection``: section
``host-added`` and its glance row, which names the sizes; with ``--device-ms``,
section ``host-added-emulated`` and no glance row: an added view, not the target's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import docsection
from common import (PY, JobExited, Miss, Procs, REPO, WORKLOAD, command, descendants, pct, stamp,
                    torchrun_elastic_cmds, where)

sys.path.insert(0, str(REPO))
from tests.chaos.schedule import ChaosDiscovery  # noqa: E402

SMALL = ["--features", "256", "--hidden", "256", "--layers", "3", "--batch-size", "64"]
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
WARM_STEPS = 150  # steps of both workers before the host is added (about 1 s at this size)
AFTER_STEPS = 40  # steps at size 3 the survivors make before the repeat ends
ADMISSION_WINDOW_S = 0.1  # the admitting step ends this close to the first step at size 3
STALL_AFTER_S = 0.5  # the stall's gaps are looked for until this long after the newcomer is active
SECTION = "Host added: the running workers' stall"
EMULATED_SECTION = "Added view: the admission on an emulated GPU host"
STALL_TARGET_S = 0.020
GLANCE_STALL = "Host added → running workers' stall (longest step gap − normal step) ≤ 20 ms"
CLOUD_ELASTIC = "cloud-elastic (commit every step)"
STATE_SIZES = "10,100,1000"


def with_state(mb: float) -> str:
    """The row (and system) name of cloud-elastic with ``mb`` MB more state."""
    return f"cloud-elastic, +{mb:g} MB of state"


def emulated(name: str, ms: float) -> str:
    """The row of ``name`` on an emulated GPU host (``--device-ms``)."""
    return f"{name}, emulated GPU host ({ms:g} ms device time a step)"


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def process_start(pid: int) -> float:
    """Wall-clock start of a process (/proc, 10 ms resolution).

    The start is kept in clock ticks since boot; /proc/stat's ``btime`` is whole
    seconds, so the boot's wall time comes from CLOCK_BOOTTIME instead.
    """
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + ticks / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------ the three systems
class Scenario:
    """One system's job: ``start()`` two workers, ``add()`` the third; ``stop()`` ends everything."""

    job: Procs
    restarts_all = False  # torchrun: the running workers are replaced, not kept

    def is_newcomer(self, pid: int, before: set[int]) -> bool:
        """Whether the worker ``pid`` is the admitted one (its first step at size 3 ends the wait)."""
        return pid not in before

    def stop(self) -> None:
        self.job.stop()


#: The newcomer starts from scratch, importing torch, as on a new instance (an SSH host) and as the peers' do:
#: forked from the driver's preloaded server, a loopback "new host" would skip that (as in goodput.py).
FRESH_WORKERS = {"CLOUD_ELASTIC_LOCAL_FORKSERVER": "0"}


class CloudElastic(Scenario):
    def __init__(self, tmp: Path, state_mb: float = 0.0, tree: Path | None = None, device_s: float = 0.0,
                 trace: bool = False, follow: bool = True) -> None:
        self.tree = tree  # --against: another checkout's cloud_elastic (PYTHONPATH and the working directory)
        #: Follow-mode admission (the default), or the whole sync (``CLOUD_ELASTIC_FOLLOW=0``: ``--whole-sync``'s rows).
        self.env = dict(FRESH_WORKERS, CLOUD_ELASTIC_FOLLOW="1" if follow else "0")
        self.discovery = ChaosDiscovery(tmp, HOSTS[:2])
        self.cmd = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "--min-np", "2", "--max-np", "3",
                    "--host-discovery-script", str(self.discovery.script), "--blacklist-cooldown-range", "300", "300",
                    PY, WORKLOAD, "elastic", *SMALL, "--step-log", "--commit-every", "1",
                    *(["--state-mb", f"{state_mb:g}"] if state_mb else []),
                    *(["--device-s", f"{device_s:g}"] if device_s else []), *(["--trace"] if trace else [])]

    def start(self) -> None:
        if self.tree is None:
            self.job = Procs([self.cmd], dict(self.env))
        else:
            self.job = Procs([self.cmd], dict(self.env, PYTHONPATH=str(self.tree)), cwd=self.tree)

    def add(self) -> None:
        self.discovery.set(HOSTS)


class TorchFT(Scenario):
    def __init__(self, tick_ms: int) -> None:
        self.tick_ms = tick_ms

    def _cmd(self, replica: int) -> list[str]:
        return [PY, WORKLOAD, "torchft-worker", *SMALL, "--step-log", "--replica-id", str(replica),
                "--lighthouse", self.lighthouse.address()]

    def start(self) -> None:
        from torchft._torchft import LighthouseServer

        # torchft's defaults but the tick: 5 s heartbeat timeout, 60 s join timeout, at least one replica.
        self.lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=60000,
                                           heartbeat_timeout_ms=5000, quorum_tick_ms=self.tick_ms)
        self.job = Procs([self._cmd(0), self._cmd(1)], {})

    def add(self) -> None:
        self.job.add(self._cmd(2))

    def stop(self) -> None:
        super().stop()
        self.lighthouse.shutdown()


class TorchrunElastic(Scenario):
    restarts_all = True

    def __init__(self, tmp: Path) -> None:
        self.cmds = torchrun_elastic_cmds(3, 1, [*SMALL, "--step-log", "--checkpoint-every", "10"],
                                          str(tmp), monitor_s=0.1, last_call_s=1)

    def start(self) -> None:
        self.job = Procs(self.cmds[:2], {})

    def add(self) -> None:
        self.agent = self.job.add(self.cmds[2]).pid
        self._mine: dict[int, bool] = {}

    def is_newcomer(self, pid: int, before: set[int]) -> bool:
        """Every worker is new after the restart: the admitted one is the third agent's child."""
        if pid not in self._mine:
            up, hops = pid, 0
            while up > 1 and up != self.agent and hops < 4:
                up, hops = parent(up), hops + 1
            self._mine[pid] = up == self.agent
        return self._mine[pid]


SYSTEMS: dict[str, Callable[[Path], Scenario]] = {
    CLOUD_ELASTIC: CloudElastic,
    "torchft (defaults: 100 ms quorum tick)": lambda tmp: TorchFT(100),
    "torchft (10 ms quorum tick)": lambda tmp: TorchFT(10),
    "torchrun elastic (monitor 0.1 s, last call 1 s, checkpoint every 10)": TorchrunElastic,
}


# ------------------------------------------------------------------------------ one admission
def stolen_s() -> float:
    """The CPU seconds the hypervisor has stolen from this machine since it booted, every CPU summed
    (``/proc/stat``'s steal); NaN where the kernel does not say."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def steal_in(samples: list[tuple[float, float]], a: float, b: float) -> float:
    """Seconds stolen between the last sample at or before ``a`` and the first at or after ``b`` (``(time,
    stolen_s)`` samples in time order): the gap widened to the samples around it; NaN without both."""
    before = [s for t, s in samples if t <= a]
    after = [s for t, s in samples if t >= b]
    return after[0] - before[-1] if before and after else float("nan")


class PeakRSS:
    """The peak of the summed resident memory of a job's processes, sampled every 0.2 s until ``stop()``
    (its processes listed once a second), and the machine's stolen CPU time (:func:`stolen_s`) every 50 ms in
    ``steal``, ``(time.time(), seconds)``."""

    def __init__(self, job: Procs) -> None:
        self.job, self.peak_bytes, self._done = job, 0, threading.Event()
        self.steal: list[tuple[float, float]] = [(time.time(), stolen_s())]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        page, pids, listed, sampled = os.sysconf("SC_PAGE_SIZE"), [], 0.0, 0.0
        while not self._done.wait(0.05):
            self.steal.append((time.time(), stolen_s()))
            if time.monotonic() - sampled < 0.2:
                continue
            sampled = time.monotonic()
            if time.monotonic() - listed > 1.0:  # the walk of /proc once a second: the job's CPU is measured
                pids, listed = descendants([p.pid for p in self.job.procs]), time.monotonic()
            total = 0
            for pid in pids:
                try:
                    total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except (OSError, IndexError, ValueError):
                    pass
            self.peak_bytes = max(self.peak_bytes, total)

    def stop(self) -> float:
        self._done.set()
        self._thread.join(5)
        return self.peak_bytes


def one_admission(scenario: Scenario, bound_s: float) -> dict[str, Any]:
    """Start two workers, add the third, and return the raw times of this repeat (see the module docstring)."""
    scenario.start()
    job = scenario.job
    rss = PeakRSS(job)
    try:
        job.wait(lambda: len({e["pid"] for e in job.logs if e["step"] >= WARM_STEPS and e["size"] == 2}) >= 2, 300,
                 "two workers past the warm-up")
        time.sleep(1.0)  # a steady stretch for the normal step
        with job.cond:
            before = {e["pid"] for e in job.logs}
        t_add = time.time()
        scenario.add()

        def newcomer_step():
            return next((e for e in job.logs if e["size"] == 3 and scenario.is_newcomer(e["pid"], before)), None)

        try:
            first = job.wait(newcomer_step, bound_s, "the newcomer's first step")
        except (TimeoutError, JobExited) as exc:
            raise Miss(str(exc)) from exc

        def enough() -> bool:
            counts: dict[int, int] = {}
            last: dict[int, float] = {}
            for e in job.logs:
                if e["size"] == 3 and not e.get("following"):  # after a follow window (``commit.follow``)
                    counts[e["pid"]] = counts.get(e["pid"], 0) + 1
                    last[e["pid"]] = max(last.get(e["pid"], 0.0), e["t"])
            if sum(1 for n in counts.values() if n >= AFTER_STEPS) < 3:
                return False
            if scenario.restarts_all:  # no survivor (torchrun): no control
                return True
            # The undisturbed stretch at size 3 (``analyse``'s control): as long again as the stall's from the switch.
            first3 = min(e["t"] for e in job.logs if e["size"] == 3)
            active = min(e["t"] for e in job.logs if e["size"] == 3 and not e.get("following"))
            end = active + STALL_AFTER_S + (active + STALL_AFTER_S - first3)
            return all(last.get(pid, 0.0) >= end for pid in before)

        job.wait(enough, 60, "three workers stepping at size 3")
        with job.cond:
            logs = list(job.logs)
        if scenario.restarts_all:
            survivors = {e["pid"] for e in logs if e["size"] == 3 and e["pid"] != first["pid"]}
        else:
            survivors = {e["pid"] for e in logs if e["pid"] in before and e["size"] == 2}
        started = process_start(first["pid"])
        return {"t_add": t_add, "newcomer_pid": first["pid"], "newcomer_started": started, "peak_rss": rss.stop(),
                "steal": [(t, s) for t, s in rss.steal if t >= t_add - 3],
                "newcomer_first_step": first["t"], "survivors": sorted(survivors), "before_pids": sorted(before),
                "steps": sorted((e["t"], e["pid"], e["size"]) for e in logs if e["t"] >= t_add - 3),
                "first_active": min(e["t"] for e in logs if e["size"] == 3 and not e.get("following"))}
    finally:
        rss.stop()
        scenario.stop()


def analyse(raw: dict[str, Any], restarts_all: bool) -> dict[str, float]:
    """The repeat's figures, in seconds, from its raw step times."""
    t_add, steps = raw["t_add"], raw["steps"]
    by_pid: dict[int, list[tuple[float, int]]] = {}
    for t, pid, size in steps:
        by_pid.setdefault(pid, []).append((t, size))
    first3 = min(t for t, pid, size in steps if size == 3)
    normal = max(statistics.median(b[0] - a[0] for a, b in zip(v, v[1:]) if t_add - 2 <= a[0] and b[0] <= t_add)
                 for pid, v in by_pid.items() if pid in raw["before_pids"] and len(v) > 2)
    # A newcomer that follows (``commit.follow``) is active from a later commit: the gaps until then count too.
    active = max(first3, raw.get("first_active", first3))

    def at_3(v: list[tuple[float, int]], within_s: float) -> list[float]:
        return [b[0] - a[0] for a, b in zip(v, v[1:]) if a[1] == 3 and a[0] >= active and b[0] <= active + within_s]

    # The normal step at size 3: the first 3 s once every worker is active, after any follow window (all of them,
    # for a survivor that had no step there: a slow repeat).
    after = max(statistics.median(at_3(v, 3) or at_3(v, float("inf")) or [float("nan")])
                for pid, v in by_pid.items() if pid in raw["survivors"])
    if restarts_all:  # the old group's last step to the new group's first
        last2 = max(t for t, _pid, size in steps if size == 2 and t < first3)
        gap = switch = from_switch = first3 - last2
    else:
        gaps, switches, admits, later, spans = [], [], [], [], []
        for pid in raw["survivors"]:
            v = by_pid[pid]
            pairs = [(a, b) for a, b in zip(v, v[1:]) if b[0] >= t_add and a[0] <= active + STALL_AFTER_S]
            gaps.append(max((b[0] - a[0], b[0] - first3) for a, b in pairs))
            a, b = max(((a, b) for a, b in pairs if b[0] >= first3), key=lambda ab: ab[1][0] - ab[0][0])
            later.append(b[0] - a[0])
            spans.append((a[0], b[0]))
            switches.append(next(b[0] - a[0] for a, b in pairs if b[1] == 3))
            # torchft's admitting step is reported at size 2 (the healing replica is not yet counted),
            # one step before the first at size 3: the longest gap ending near that first step.
            admits.append(max(b[0] - a[0] for a, b in pairs if abs(b[0] - first3) <= ADMISSION_WINDOW_S))
        (gap, where), switch, admit = max(gaps), max(switches), max(admits)
        from_switch = max(later)
        stall_span = spans[later.index(from_switch)]
    # The control: the survivors' longest gap over as long a stretch at size 3 right after, with no admission in it
    # (the newcomer active, nothing in flight): what this machine's three workers do over that many steps anyway.
    stretch = active + STALL_AFTER_S - first3
    quiet = [(b[0] - a[0], a[0], b[0]) for pid in raw["survivors"] for a, b in zip(by_pid[pid], by_pid[pid][1:])
             if a[1] == 3 and a[0] >= active + STALL_AFTER_S and b[0] <= active + STALL_AFTER_S + stretch]
    steal, nan = raw.get("steal", []), float("nan")
    quiet_gap = max(quiet) if quiet and not restarts_all else None
    return {"normal_step_s": normal, "normal_step_at_3_s": after, "longest_gap_s": gap, "switch_gap_s": switch,
            "follow_window_s": active - first3,
            "admission_gap_s": gap if restarts_all else admit,
            # Where the longest gap ended, from the first step at size 3 (0: it is the switch itself).
            "longest_gap_end_after_switch_s": 0.0 if restarts_all else where,
            "stall_s": gap - normal,
            # The stall's gaps from the switch on (the admitting step's and the window's): those before it fall
            # while the newcomer starts, on this machine's cores, which a host of its own would not share.
            "stall_from_switch_s": from_switch - normal,
            "undisturbed_stall_s": quiet_gap[0] - normal if quiet_gap else nan,
            # The hypervisor's steal over the stall's gap from the switch on, and over the control's longest gap.
            "steal_in_stall_s": nan if restarts_all else steal_in(steal, *stall_span),
            "steal_in_control_s": steal_in(steal, *quiet_gap[1:]) if quiet_gap else nan,
            "start_to_first_step_s": raw["newcomer_first_step"] - raw["newcomer_started"],
            "added_to_first_step_s": raw["newcomer_first_step"] - t_add, "peak_rss_gib": raw["peak_rss"] / 2**30}


# ------------------------------------------------------------------------------ report
def duration(x: float) -> str:
    """Milliseconds below 10 s (``54 ms``), seconds from there (``25.1 s``)."""
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def follows(windows: list[float]) -> str:
    """How long newcomers followed before they were active (``commit.follow``); – where none did."""
    if not any(windows):
        return "–"
    return f"{pct(windows, .5):.2f} s / {pct(windows, .95):.2f} s"


def pair(values: list[float]) -> str:
    """p50 / p95 in milliseconds of the values that were measured; – where none was."""
    known = [v for v in values if v == v]
    return f"{duration(pct(known, .5))} / {duration(pct(known, .95))}" if known else "–"


def most(values: list[float]) -> str:
    """The largest of the values measured, ms; – where none was."""
    known = [v for v in values if v == v]
    return duration(max(known)) if known else "–"


def table(rows: dict[str, dict], rss: bool = True) -> str:
    """The figures per system; ``rss``: with the job's peak resident memory."""
    ms = duration
    s = lambda x: f"{x:.2f} s"  # noqa: E731
    lines = ["| system (2 workers + 1 admitted) | normal step, size 2 / size 3 | longest gap, p50 / p95 | stall (gap − normal step), "
             "p50 / p95 | stall from the switch on, p50 / p95 | undisturbed control: as long at size 3 after it, p50 / p95 | "
             "hypervisor steal in that gap / in the control's, max | admitting step's gap, p50 / p95 | newcomer: process start → first step, p50 / p95 | "
             "host added → first step, p50 | newcomer follows, p50 / p95 | " + ("peak RSS, whole job | " if rss else "")
             + "repeats |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if rss else "")]
    for name, r in rows.items():
        a = r["figures"]
        if not a:
            lines.append(f"| {name} | – | miss | miss | – | – | – | – | miss | miss | – | " + ("– | " if rss else "")
                         + f"0 of {r['misses']} |")
            continue
        col = lambda k: [x[k] for x in a]  # noqa: E731
        memory = f"{max(col('peak_rss_gib')):.1f} GiB | " if rss else ""
        lines.append(
            f"| {name} | {ms(statistics.median(col('normal_step_s')))} / "
            f"{ms(statistics.median(col('normal_step_at_3_s')))} | {ms(pct(col('longest_gap_s'), .5))} / "
            f"{ms(pct(col('longest_gap_s'), .95))} | {ms(pct(col('stall_s'), .5))} / {ms(pct(col('stall_s'), .95))} | "
            f"{ms(pct(col('stall_from_switch_s'), .5))} / {ms(pct(col('stall_from_switch_s'), .95))} | "
            f"{pair(col('undisturbed_stall_s'))} | {most(col('steal_in_stall_s'))} / {most(col('steal_in_control_s'))} | "
            f"{ms(pct(col('admission_gap_s'), .5))} / {ms(pct(col('admission_gap_s'), .95))} | "
            f"{s(pct(col('start_to_first_step_s'), .5))} / "
            f"{s(pct(col('start_to_first_step_s'), .95))} | {s(pct(col('added_to_first_step_s'), .5))} | "
            f"{follows(col('follow_window_s'))} | {memory}"
            f"{len(a)} of {len(a) + r['misses']} |")
    return "\n".join(lines)


def glance(rows: dict[str, dict], sizes: dict[float, str]) -> list[list[str]]:
    """The stall's glance row; with ``sizes`` (MB -> row name), the p50 / p95 stall at each state size too. The
    target is the p95 at every size measured ("flat from 10 MB to 1 GB"): the ratio is the worst size's, and a
    size without an admission misses it."""
    figures = rows.get(CLOUD_ELASTIC, {}).get("figures")
    if not figures:
        return [[GLANCE_STALL, "no admission within the bound", "–", where(SECTION), docsection.verdict(False)]]
    stalls = [f["stall_s"] for f in figures]
    p50, p95 = pct(stalls, .5), pct(stalls, .95)
    by_size, worst, every = [], p95, True
    for mb, name in sizes.items():
        sized = [f["stall_s"] for f in rows[name]["figures"]]
        by_size.append(f"{mb:g} MB: " + (f"{duration(pct(sized, .5))} / {duration(pct(sized, .95))}" if sized
                                         else "miss"))
        every = every and bool(sized)
        worst = max(worst, pct(sized, .95)) if sized else worst
    more = f"; with more state (p50 / p95), {', '.join(by_size)}" if by_size else ""
    return [[GLANCE_STALL, f"p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms over {len(stalls)} admission(s){more}",
             f"{worst / STALL_TARGET_S:.2f}", where(SECTION), docsection.verdict(every and worst <= STALL_TARGET_S)]]


def parse_sizes(text: str) -> list[float]:
    """``10,100,1000`` -> [10.0, 100.0, 1000.0]; ``none`` (or empty) -> []."""
    if text.strip().lower() in ("", "none", "0"):
        return []
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="admissions per system (default 7; 1 with --quick)")
    p.add_argument("--bound", type=float, default=None,
                   help="seconds the newcomer gets to its first step (default 90; 30 with --quick)")
    p.add_argument("--peers", action="store_true", help="also torchft and torchrun elastic (requirements/bench.txt)")
    p.add_argument("--state-mb", default=None,
                   help=f"cloud-elastic with this much more state, MB, comma-separated (default {STATE_SIZES}; 10 "
                        "with --quick; none: none)")
    p.add_argument("--against", type=Path, default=None,
                   help="also cloud-elastic from this other checkout (e.g. a `git worktree` of an older revision), "
                        "in the same rounds: a change's effect, side by side")
    p.add_argument("--device-ms", default="0",
                   help="device time a step, ms, comma-separated (default 0: the CPU-bound rows alone): each value "
                        "but 0 adds, in the same rounds, an emulated GPU host's twin of every cloud-elastic row "
                        "(workload.py --device-s), published in section host-added-emulated, not the glance row")
    p.add_argument("--whole-sync", action="store_true",
                   help="also every cloud-elastic row with the whole sync (CLOUD_ELASTIC_FOLLOW=0) instead of the "
                        "default follow-mode admission, in the same rounds")
    docsection.add_arguments(p)
    args = p.parse_args()
    repeats, bound = args.repeats or (1 if args.quick else 7), args.bound or (30.0 if args.quick else 90.0)
    os.environ.setdefault("RUST_LOG", "warn")  # the Lighthouse in this process logs every quorum at info
    chosen = {n: f for n, f in SYSTEMS.items() if args.peers or n == CLOUD_ELASTIC}
    sizes = {mb: with_state(mb) for mb in parse_sizes(args.state_mb if args.state_mb is not None
                                                      else "10" if args.quick else STATE_SIZES)}
    chosen.update({name: (lambda mb: lambda tmp: CloudElastic(tmp, mb))(mb) for mb, name in sizes.items()})
    devices = [ms for ms in parse_sizes(args.device_ms) if ms > 0]
    twins = {emulated(name, ms): (lambda mb, ms: lambda tmp: CloudElastic(tmp, mb, device_s=ms / 1000))(mb, ms)
             for ms in devices for mb, name in [(0.0, CLOUD_ELASTIC), *sizes.items()]}
    if args.against is not None:
        tree = args.against.resolve()
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True).stdout
        at = f"cloud-elastic at `{rev.strip() or tree.name}`"
        chosen[f"{at} (--against)"] = lambda tmp: CloudElastic(tmp, 0.0, tree)
        chosen.update({f"{at}, +{mb:g} MB of state (--against)": (lambda mb: lambda tmp: CloudElastic(tmp, mb, tree))(mb)
                       for mb in sizes})
    if args.whole_sync:
        chosen.update({f"{name}, whole sync (CLOUD_ELASTIC_FOLLOW=0)":
                       (lambda mb: lambda tmp: CloudElastic(tmp, mb, follow=False))(mb)
                       for mb, name in [(0.0, CLOUD_ELASTIC), *sizes.items()]})
    chosen.update(twins)
    rows: dict[str, dict] = {n: {"figures": [], "misses": 0} for n in chosen}
    with tempfile.TemporaryDirectory() as root:
        # Rounds over the systems, so that a slow minute of the shared machine hits each of them.
        for i in range(repeats):
            for name, make in chosen.items():
                scenario = make(Path(tempfile.mkdtemp(dir=root)))
                try:
                    raw = one_admission(scenario, bound)
                except (Miss, TimeoutError, JobExited) as exc:  # a job that never got going is a miss too
                    print(f"{name}: repeat {i + 1}: {str(exc).splitlines()[0]}", flush=True)
                    rows[name]["misses"] += 1
                    continue
                fig = analyse(raw, scenario.restarts_all)
                rows[name]["figures"].append(fig)
                print(f"{name}: repeat {i + 1}: " + ", ".join(f"{k} {v:.2f} GiB" if k.endswith("_gib") else
                                                               f"{k} {v * 1000:.1f} ms" for k, v in fig.items()),
                      flush=True)
    # cloud-elastic, its rows with more state, then the peers.
    ours = [CLOUD_ELASTIC, *sizes.values(), *twins]
    order = [*ours, *(n for n in rows if n not in ours)]
    more = (" *+N MB of state*: the same job with N MB (10^6 bytes) more in the optimizer's state, an entry of which "
            "each step changes 64 KiB, a different part each step (`workload.py --state-mb`): every sync carries it "
            "to the newcomer, a follower must follow its changes, and a commit kept in place copies none of it, so "
            "the normal step stays the small model's. *Newcomer follows*: from its first step to the first step at "
            "which it no longer follows (cloud-elastic's follow mode); the longest gap is looked for until 0.5 s "
            "after that." if sizes else "")
    text = (f"{stamp(command())}{more} *Normal step*: size 2, the median step of the 2 s before the host was added; "
            f"size 3, of the first 3 s once the newcomer is active. Peak RSS: every process of the job (driver, "
            f"workers, newcomer; for torchft without the Lighthouse), summed, the largest over the repeats.")
    if twins:  # an added view: its own section, and the glance row (the CPU-bound rows' target) left alone
        text += (f" *Emulated GPU host* (`--device-ms`): each step sleeps that long before its forward and backward "
                 f"passes (`workload.py --device-s`: device time, no CPU; the gradients' allreduce after it still waits "
                 f"for a late peer), the model and batch unchanged, so three workers "
                 f"on 2 cores step about as fast as two, as on hosts of their own; the newcomer's start-up (importing "
                 f"torch) is not emulated: it runs on this machine's cores beside the workers.")
        docsection.publish(args, "host-added-emulated", EMULATED_SECTION,
                           f"{text}\n\n{table({n: rows[n] for n in order})}")
    else:
        docsection.publish(args, "host-added", SECTION, f"{text}\n\n{table({n: rows[n] for n in order})}",
                           glance(rows, sizes))


if __name__ == "__main__":
    main()
