"""The peers benchmarks' results file: each scenario's rows under its key, with when and under what load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any]:
    results = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(results.get("when"), dict):
        results["when"] = {}
    return results


def record(path: Path, results: dict[str, Any], key: str, value: Any) -> None:
    """Put ``value`` under ``key`` in ``results``, stamp it, and write the file (a later failure loses nothing)."""
    results[key] = value
    results.setdefault("when", {})[key] = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                                           f"load average {os.getloadavg()[0]:.1f} at the end")
    path.write_text(json.dumps(results, indent=1) + "\n")


def run_two_workers(script: str, marker: str, quick: bool, timeout_s: float) -> Any:
    """Run ``script --worker`` as two workers of one loopback host under ``cloud-elastic run``
    (one OpenMP thread each) and return the JSON its rank prints after ``marker``."""
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:2",
           sys.executable, script, "--worker", *(["--quick"] if quick else [])]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    line = next((l for l in proc.stdout.splitlines() if marker in l), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{Path(script).name} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads(line.split(marker, 1)[1])
