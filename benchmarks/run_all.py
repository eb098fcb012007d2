"""Every benchmark, one after another, each rewriting its section of docs/benchmarks.md: ``./dev bench``.

    ./dev bench [--quick] [--peers] [--only NAME ...] [--out DIR]

Each benchmark is a script of this folder that also runs alone; this runs each
in turn with the same options (``docsection.add_arguments``), under
``/tmp/bench.lock`` so that two people's benchmarks never share the machine, and
prints one line per benchmark at the end (seconds, exit status). The exit status
is non-zero when any benchmark failed.

A full run writes docs/benchmarks.md and docs/images. ``--quick`` is a smoke run
of a few minutes: fewer repeats, and its sections and pictures go into a copy of
docs/benchmarks.md under ``--out`` (a temporary folder by default), so published
figures are never replaced by a smoke run's. ``--peers`` adds torchft and
torchrun elastic to the recovery, host-added and goodput benchmarks (``./dev bench``
installs requirements/bench.txt for it).

The GPU benchmark (``gpu.py``, which writes a markdown table to ``--out-md``)
runs only where ``torch.cuda.is_available()``; it and ``compression.py`` run
only if their files exist. A script that does not take ``--doc`` gets only
``--quick``, and a GPU table is put in its section here.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import common  # noqa: F401  (sets PYTHONPATH: every process a benchmark starts imports this checkout)
import docsection

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LOCK = "/tmp/bench.lock"


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str
    quick_timeout_s: float
    timeout_s: float
    peers: bool = False  # takes --peers
    needs_gpu: bool = False


BENCHMARKS = [
    Benchmark("cli-import", "cli_import.py", 120, 600),
    Benchmark("commit-cost", "commit_cost.py", 600, 4 * 3600),
    Benchmark("recovery", "recovery.py", 300, 2 * 3600, peers=True),
    Benchmark("silence", "silence.py", 400, 2 * 3600),
    Benchmark("host-added", "host_added.py", 300, 2 * 3600, peers=True),
    Benchmark("notice-latency", "notice_latency.py", 400, 3600),
    Benchmark("watcher-cost", "watcher_cost.py", 120, 600),
    Benchmark("commit-bandwidth", "commit_bw.py", 300, 1800),
    Benchmark("allreduce", "allreduce_bw.py", 300, 1800),
    Benchmark("driver-scale", "driver_scale.py", 300, 1800),
    Benchmark("store-server", "store_server.py", 180, 900),
    Benchmark("durable", "durable.py", 400, 3600),
    Benchmark("compression", "compression.py", 400, 3600),
    Benchmark("archive-scan", "archive_scan.py", 120, 600),
    Benchmark("straggler", "straggler.py", 400, 1800),
    Benchmark("slow-link", "link_probe.py", 300, 900),
    Benchmark("early-return", "early_return.py", 400, 1800),
    Benchmark("sharded", "sharded.py", 400, 3600),
    Benchmark("sharded-heal", "sharded_heal.py", 300, 1800),
    Benchmark("sharded-checkpoint", "sharded_checkpoint.py", 300, 1800),
    Benchmark("soak", "soak.py", 300, 2 * 3600),
    Benchmark("kubernetes", "kubernetes.py", 300, 1800),
    Benchmark("kill-to-full-size", "kill_to_full.py", 400, 1800),
    Benchmark("goodput", "goodput.py", 1200, 3600, peers=True),
    Benchmark("multi-source", "multi_source.py", 120, 600),
    Benchmark("gpu", "gpu.py", 400, 3600, needs_gpu=True),
]


def _accepts(script: Path, option: str) -> bool:
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    return option in out.stdout


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run(bench: Benchmark, args: argparse.Namespace, doc: Path, images: Path, env: dict[str, str]) -> str:
    """Run one benchmark; its status: "ok", "skipped: ...", or "FAILED: ..."."""
    script = HERE / bench.script
    if not script.exists():
        return f"skipped: benchmarks/{bench.script} does not exist"
    if bench.needs_gpu and not _cuda():
        return "skipped: no GPU (torch.cuda.is_available() is false)"
    argv = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
    if args.peers and bench.peers:
        argv.append("--peers")
    table = None
    if _accepts(script, "--doc"):
        argv += ["--doc", str(doc), "--images", str(images)]
    elif _accepts(script, "--out-md"):  # gpu.py: a markdown table, put into its section here
        table = Path(tempfile.mkdtemp()) / f"{bench.name}.md"
        argv += ["--out-md", str(table)]
    timeout = bench.quick_timeout_s if args.quick else bench.timeout_s
    print(f"\n[bench] {bench.name}: {' '.join(argv[1:])}", flush=True)
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"FAILED: no result within {timeout:.0f} s"
    if done.returncode != 0:
        return f"FAILED: exit status {done.returncode}"
    if table is not None:
        if not table.exists():
            return f"FAILED: {bench.script} wrote no {table.name}"
        docsection.write_section(bench.name, "GPU", table.read_text(), doc)
    return "ok"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of every benchmark, into a copy of the doc")
    ap.add_argument("--peers", action="store_true", help="also torchft and torchrun elastic (requirements/bench.txt)")
    ap.add_argument("--only", action="append", choices=[b.name for b in BENCHMARKS], help="this benchmark only")
    ap.add_argument("--out", type=Path, default=None,
                    help="--quick: the folder of the doc's copy and the pictures (default: a new temporary one)")
    args = ap.parse_args()
    if args.quick:
        out = args.out or Path(tempfile.mkdtemp(prefix="cloud-elastic-bench-"))
        (out / "images").mkdir(parents=True, exist_ok=True)
        doc, images = out / "benchmarks.md", out / "images"
        shutil.copyfile(docsection.DOC, doc)
    else:
        doc, images = docsection.DOC, docsection.IMAGES
    env = dict(os.environ)
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    with open(LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[bench] waiting for {LOCK} (another benchmark is running)", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        results = []
        for bench in chosen:
            began = time.monotonic()
            status = run(bench, args, doc, images, env)
            results.append((bench.name, time.monotonic() - began, status))
            if status.startswith("skipped"):
                print(f"[bench] {bench.name} {status}", flush=True)
    print("\n[bench] summary" + (" (quick)" if args.quick else ""))
    for name, seconds, status in results:
        print(f"[bench]   {name:<17} {seconds:6.0f} s  {status}")
    print(f"[bench] total {sum(s for _, s, _ in results):.0f} s; sections in {doc}, pictures in {images}")
    return 1 if any(status.startswith("FAILED") for _, _, status in results) else 0


if __name__ == "__main__":
    sys.exit(main())
