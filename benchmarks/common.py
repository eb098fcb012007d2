"""What the benchmarks share: the run's stamp (date, commit, machine), percentiles, process trees,
side-by-side step times, and the ``STEPLOG`` lines of a job's workers.

These are measurements, not tests: the machine may be shared and noisy, so the benchmarks report
ratios measured side by side and percentiles over repeats, each with the run that gave it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# Every process a benchmark starts imports this checkout, whatever is installed (an editable install may
# point at another one).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
#: Environment of every job a benchmark starts: one OpenMP thread per worker, quiet Rust logs (torchft).
QUIET = {"RUST_LOG": "warn", "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"}


# ------------------------------------------------------------------------------ the run's stamp
def machine() -> str:
    """Cores, CPU, memory, GPU, Python and torch of this machine, in one line."""
    import torch

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}")


def commit() -> str:
    """This checkout's commit, with ``+changes`` when files differ from it (the run measured those)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short=7", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def stamp(command: str) -> str:
    """The sentence that opens a section a benchmark writes: when, on what code and machine, by what command."""
    return (f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on commit `{commit()}` with `{command}`, "
            f"on {machine()}; load average {os.getloadavg()[0]:.1f} at the end.")


def command() -> str:
    """How this benchmark was started, as the doc records it (without where its output went)."""
    args, kept = sys.argv[1:], []
    while args:
        arg = args.pop(0)
        if arg in ("--doc", "--images"):
            args = args[1:]
        elif not arg.startswith(("--doc=", "--images=")):
            kept.append(arg)
    return " ".join([f"benchmarks/{Path(sys.argv[0]).name}", *kept])


def where(section: str) -> str:
    """The glance table's "where measured" cell: date, commit, machine and the section to read."""
    import torch

    kind = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"{os.cpu_count()}-core CPU"
    anchor = re.sub(r"[^a-z0-9 -]", "", section.lower()).replace(" ", "-")
    return f"{datetime.now(timezone.utc):%Y-%m-%d}, `{commit()}`, {kind} ([{section}](#{anchor}))"


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (a miss counts as inf, so a p95 over a miss is a miss)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def span(values: list[float], digits: int = 3) -> str:
    """``0.938–1.083``, or one figure when all are the same."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}–{high}"


def median_and_middle_half(values: list[float]) -> str:
    """``1.013× (0.998–1.032, 12 rounds)``: the median ratio and the middle half of the rounds."""
    return f"{statistics.median(values):.3f}× ({pct(values, .25):.3f}–{pct(values, .75):.3f}, {len(values)} rounds)"


# ------------------------------------------------------------------------------ pictures
def subplots(*args, **kwargs):
    """``matplotlib.pyplot.subplots`` without a display (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------ process trees
def descendants(roots: list[int]) -> list[int]:
    """The roots and every process below them (launchers start workers in sessions of their own,
    which a kill of the root's process group does not reach)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def signal_all(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------ side-by-side step times
class PausableJob:
    """A job whose whole process tree can be stopped and resumed (SIGSTOP/SIGCONT)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], workers: int = 2) -> None:
        self.name = name
        self.workers = workers  # TIMING rows its run must print, one per worker
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **env), start_new_session=True)
        self.lines: list[str] = []
        self.windows: list[tuple[float, float]] = []  # wall-clock (resumed, paused) of every slice it ran
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def _signal(self, sig: int) -> None:
        # The root first, so it cannot start a child between the listing and the signal.
        signal_all([self.proc.pid] + descendants([self.proc.pid]), sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def run_for(self, seconds: float) -> None:
        t0 = time.time()
        self._signal(signal.SIGCONT)
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.pause()
        self.windows.append((t0, time.time()))

    def done(self) -> bool:
        return self.proc.poll() is not None

    def kill(self) -> None:
        if not self.done():
            self._signal(signal.SIGKILL)  # the whole tree, listed while its root lives

    def rows(self) -> list[dict]:
        self._reader.join(30)
        rows = [json.loads(m.group(1)) for m in re.finditer(r"TIMING (\{.*\})", "".join(self.lines))]
        if self.proc.returncode != 0 or len(rows) != self.workers:
            raise SystemExit(f"{self.name} run failed (exit {self.proc.returncode}):\n{''.join(self.lines)[-3000:]}")
        return rows


def to_new_size(job, size: int) -> tuple[float, int]:
    """After a signal sent to ``job`` (a ``tests.integration.harness.Job`` of probe workers): wait for its first
    commit at ``size`` and for its end; return that commit's ``time.monotonic()`` and the steps rank 0 lost.
    The caller kills the job if this raises."""
    job.wait_event("commit", size=size, timeout=60)
    marker = f'"size": {size}'
    when = next(t for t, line in zip(job.times, job.lines) if marker in line and '"kind": "commit"' in line)
    if job.finish(timeout=120) != 0:
        raise RuntimeError("job failed:\n" + job.output())
    lost = sum(max(0, r["executed"] - r["step"]) for r in job.of("reset") if r["rank"] == 0)
    return when, lost


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def interleaved_step_times(variants: dict[str, tuple[list[str], dict[str, str]]], slice_s: float, warmup: int,
                           timeout_s: float = 1200, rows_out: dict[str, list[dict]] | None = None,
                           workers: int = 2) -> dict[str, list[tuple[float, float]]]:
    """Run every variant at once, one at a time in round-robin slices; per round, each one's step time.

    All jobs live through the same minutes of the shared machine, and within
    a round (one slice of each) they run seconds apart, so drifts in the
    machine's speed hit them alike. A step counts only when it started and
    ended inside one slice of its job (a pause never falls into it) and
    comes after ``warmup`` steps. Returns name -> per round (wall, CPU)
    seconds per step: the median over the slice's steps of the slowest
    rank's wall time, and of the CPU time summed over the workers.
    ``rows_out``, if given, receives each job's TIMING rows (for extra fields);
    each job has ``workers`` workers (two by default).
    """
    # A SIGTERM (kill, timeout) must also run the cleanup below, or the paused jobs stay behind, stopped.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_signal) if main else None
    jobs = [PausableJob(name, cmd, env, workers) for name, (cmd, env) in variants.items()]
    deadline = time.monotonic() + timeout_s
    try:
        for job in jobs:
            job.pause()
        while not all(job.done() for job in jobs):
            if time.monotonic() > deadline:
                raise SystemExit("interleaved step-time jobs did not finish in time")
            for job in jobs:
                if not job.done():
                    job.run_for(slice_s)
    finally:
        for job in jobs:
            job.kill()
        if main:
            signal.signal(signal.SIGTERM, previous)
    per_round: dict[str, list[tuple[float, float]]] = {}
    for job in jobs:
        rows = job.rows()
        if rows_out is not None:
            rows_out[job.name] = rows
        rounds = []
        for t0, t1 in job.windows:
            walls, cpus = [], []
            for row in rows:
                kept = [(w, c) for i, (e, w, c) in enumerate(zip(row["end"], row["wall_s"], row["cpu_s"]))
                        if i >= warmup and e - w >= t0 and e <= t1]
                walls.append([w for w, _ in kept])
                cpus.append([c for _, c in kept])
            if min(len(w) for w in walls) >= 5:
                rounds.append((max(statistics.median(w) for w in walls), sum(statistics.median(c) for c in cpus)))
            else:
                rounds.append((float("nan"), float("nan")))
        per_round[job.name] = rounds
    return per_round


def round_ratios(per_round: dict[str, list[tuple[float, float]]], name: str, base: str = "ddp",
                 which: int = 0) -> list[float]:
    """Per round in which both ran steady steps: ``name``'s step time / ``base``'s."""
    return [a[which] / b[which] for a, b in zip(per_round[name], per_round[base])
            if a[which] == a[which] and b[which] == b[which]]


# ------------------------------------------------------------------------------ a job's step log
_STEPLOG = re.compile(r"STEPLOG (\{[^{}]*\})")  # workers sharing a pipe can glue lines together


def parse(line: str) -> list[dict]:
    """The ``STEPLOG`` records of one output line (``workload.py --step-log``)."""
    out = []
    for text in _STEPLOG.findall(line):
        try:
            out.append(json.loads(text))
        except json.JSONDecodeError:  # a line cut by another worker's output
            pass
    return out


class JobExited(RuntimeError):
    """Every process of a job ended while a benchmark waited for it to do something; ``codes``: their exit codes."""

    def __init__(self, message: str, codes: list[int | None] = ()) -> None:
        super().__init__(message)
        self.codes = list(codes)


class Miss(Exception):
    """The event a benchmark measures did not come within its bound: a result (a miss), not a failure."""


@dataclass
class Procs:
    """Processes of one job (one or several roots), their STEPLOG lines as they arrive."""

    cmds: list[list[str]]
    env: dict[str, str]
    #: Where the processes start: another checkout (a worktree of another revision) runs its own
    #: cloud_elastic, since ``python -m`` and the workers it forks import from there first.
    cwd: Path = REPO
    logs: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cond = threading.Condition()
        self.procs: list[subprocess.Popen] = []
        for cmd in self.cmds:
            self.add(cmd)

    def add(self, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start one more root process of this job (a newcomer, another agent)."""
        proc = subprocess.Popen(cmd, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, **QUIET, **self.env, **(env or {})), start_new_session=True)
        self.procs.append(proc)
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        return proc

    def _read(self, proc: subprocess.Popen) -> None:
        # No notify per line: a waiter woken hundreds of times a second to rescan every log line would
        # take CPU from the workers being measured; wait() polls instead.
        for line in proc.stdout:
            records = parse(line)
            with self.cond:
                self.lines.append(line)
                self.logs.extend(records)

    def wait(self, pred, timeout: float, what: str):
        """Poll ``pred()`` (under the lock) until it is truthy; TimeoutError naming ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            with self.cond:
                value = pred()
                if value:
                    return value
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: not within {timeout}s:\n{''.join(self.lines[-30:])}")
                if all(p.poll() is not None for p in self.procs):
                    codes = [p.returncode for p in self.procs]
                    raise JobExited(f"{what}: the job exited ({codes}):\n" + "".join(self.lines[-30:]), codes)
            time.sleep(0.05)

    def stop(self) -> None:
        signal_all(descendants([p.pid for p in self.procs]))
        for p in self.procs:
            p.wait()


# ------------------------------------------------------------------------------ the peers' launchers
WORKLOAD = str(REPO / "benchmarks" / "workload.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: torchrun for a job whose membership changes. In its default mode (the rendezvous' TCPStore shared with the
#: workers) a node that joins a running job waits forever for the master address (``RendezvousStoreInfo.build``),
#: which the old rank 0, keeping its first round's, never writes for the new round: every admission, and every
#: restart after a kill, then hangs until the store's timeout (torch 2.13). torch's own opt-out makes every node
#: build it in every round.
TORCHRUN_ELASTIC = ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", PY, "-m", "torch.distributed.run"]


def torchrun_elastic_cmds(nodes: int, nproc: int, extra: list[str], ckpt_dir: str, monitor_s: float | None,
                          last_call_s: float | None) -> list[list[str]]:
    """One torchrun agent per node running ``workload.py torchrun-elastic``, c10d rendezvous on the first."""
    port = free_port()
    base = [*TORCHRUN_ELASTIC, "--nnodes", f"1:{nodes}" if nodes == 1 else f"2:{nodes}",
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", f"bench{port}", "--max-restarts", "100"]
    if monitor_s is not None:
        base += ["--monitor-interval", str(monitor_s)]
    if last_call_s is not None:
        base += ["--rdzv-conf", f"last_call_timeout={last_call_s}"]
    return [base + [WORKLOAD, "torchrun-elastic", "--checkpoint-dir", ckpt_dir, *extra] for _ in range(nodes)]


def run_two_workers(script: str, marker: str, quick: bool, timeout_s: float) -> dict:
    """Run ``script --worker`` as two workers of one loopback host under ``cloud-elastic run`` (one
    OpenMP thread each) and return the JSON its rank 0 prints after ``marker``; exit on failure."""
    cmd = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:2",
           PY, script, "--worker", *(["--quick"] if quick else [])]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    line = next((l for l in proc.stdout.splitlines() if marker in l), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{Path(script).name} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads(line.split(marker, 1)[1])
