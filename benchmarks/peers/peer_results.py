"""The peers benchmarks' results file: each scenario's rows under its key, with when and under what load."""

from __future__ import annotations

import json
import os
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
