"""Helpers of the GPU tests: the probe's command line, the workers' environment, and reading EVENTs."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

from tests.integration.harness import _EVENT, REPO, Event, Job

PROBE = Path(__file__).with_name("gpu_probe.py")


@functools.cache
def visible_gpus() -> tuple[int, str]:
    """(number of CUDA devices this process sees, why none when 0)."""
    import torch

    if not torch.cuda.is_available():
        build = "a CPU build of torch" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
        return 0, f"CUDA is not available ({build}, torch {torch.__version__})"
    return torch.cuda.device_count(), ""


def probe(*args: str) -> list[str]:
    """The command that runs the GPU probe as every worker of a job."""
    return [sys.executable, str(PROBE), *args]


def env(**extra: str) -> dict[str, str]:
    """This checkout first on every process's path (the driver's, the workers', helpers'), whatever is installed."""
    path = [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return {"PYTHONPATH": os.pathsep.join(path), **extra}


def by_pid(events: list[Event]) -> dict[int, list[Event]]:
    out: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        out[e["pid"]].append(e)
    return out


def commit_checksums(job: Job) -> dict[int, set[str]]:
    """step -> the checksums every worker printed for its commit of that step."""
    out: dict[int, set[str]] = defaultdict(set)
    for e in job.of("commit"):
        out[e["step"]].add(e["checksum"])
    return out


def timed_events(job: Job, kind: str, **match: object) -> list[tuple[float, Event]]:
    """(when its line arrived, as ``time.monotonic()``; the event) for each ``kind`` EVENT matching ``match``."""
    out = []
    for line, t in zip(list(job.lines), list(job.times)):
        m = _EVENT.match(line)
        if m:
            data = json.loads(m.group("json"))
            if data.get("kind") == kind and all(data.get(k) == v for k, v in match.items()):
                out.append((t, Event(kind, data)))
    return out
