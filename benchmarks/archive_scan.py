"""What the check before ``torch.load`` costs: ``torch_archive.stored_records`` next to the load it guards.

Every checkpoint load (``checkpoint.safety.safe_load``, DCP items) and every state sync
(``worker.comm.statecodec.decode``, on rank 0 in ``encode`` too) first reads the archive's
directory and dry-runs its pickle's opcodes (``torch_archive._check_pickle``: tuples nested
too deep or referenced too often, which the load would hash in C; calls that walk the same
containers again and again; more objects built than the archive's size allows). This times that check and
``torch.load(weights_only=True)`` of the same bytes, best of ``--runs``, one after the other on
each of: a checkpoint's ``state.pt`` (a model of 600 parameters with Adam state: kB of pickle,
MB of storages); a sync's attributes (a few numbers and a list of 1,000 floats); and the
largest pickles a script makes, an ``ObjectState`` attribute holding a list of a million ints
or floats, or a dict of 100,000 string keys.

The target is a check that costs at most half of the load it guards on each of them (before
it was a pure-Python ``pickletools.genops`` loop: about as long as the load itself, 0.6 s
for the million ints on this machine).

Run: ``.venv/bin/python benchmarks/archive_scan.py [--runs 5] [--quick]`` (seconds); it prints a
table and writes it into docs/benchmarks.md (``docsection``: section ``archive-scan`` and its glance row).
"""

from __future__ import annotations

import argparse
import io
import time
import zipfile
from typing import Any, Callable

import docsection
from common import stamp, where

TARGET = 0.5
GLANCE_TARGET = "Check before `torch.load` (checkpoints, state sync) ≤ 0.5× the load"


def _saved(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _checkpoint() -> dict[str, Any]:
    import torch

    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(300)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}


def cases() -> dict[str, bytes]:
    return {
        "checkpoint state.pt: 600 parameters + Adam": _saved(_checkpoint()),
        "sync: attributes with a list of 1,000 floats": _saved({"epoch": 1, "batch": 2, "losses": [0.5] * 1000}),
        "sync: a list of 1,000,000 ints": _saved({"indices": list(range(1_000_000))}),
        "sync: a list of 1,000,000 floats": _saved({"losses": [i / 3 for i in range(1_000_000)]}),
        "sync: a dict of 100,000 string keys": _saved({"seen": {f"sample-{i}": i for i in range(100_000)}}),
    }


def _best(fn: Callable[[], Any], runs: int) -> float:
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        took.append(time.perf_counter() - start)
    return min(took)


def measure(runs: int) -> list[tuple[str, int, int, float, float]]:
    """(case, archive bytes, pickle bytes, check s, load s) for each case."""
    import torch

    from cloud_elastic.torch_archive import stored_records

    rows = []
    for name, data in cases().items():
        archive = zipfile.ZipFile(io.BytesIO(data))
        pickle = sum(r.file_size for r in archive.infolist() if r.filename.endswith("data.pkl"))
        check = _best(lambda: stored_records(io.BytesIO(data), 0, len(data)), runs)
        load = _best(lambda: torch.load(io.BytesIO(data), weights_only=True, map_location="cpu"), runs)
        rows.append((name, len(data), pickle, check, load))
    return rows


def report(runs: int, rows: list[tuple[str, int, int, float, float]], command: str) -> tuple[str, list[str]]:
    worst = max(check / load for _, _, _, check, load in rows)
    met = worst <= TARGET
    lines = [f"{stamp(command)} Best of {runs} runs each.", "",
             "| what is loaded | archive | its pickle | check | `torch.load` | check / load |", "|---|---|---|---|---|---|",
             *[f"| {name} | {size:,} B | {pickle:,} B | {check * 1000:.1f} ms | {load * 1000:.1f} ms | "
               f"{check / load:.2f} |" for name, size, pickle, check, load in rows], "",
             f"Target: the check at most {TARGET:g} × the load on each: {docsection.verdict(met)} (worst {worst:.2f})."]
    row = [GLANCE_TARGET, f"worst {worst:.2f} × the load" + (" (quick run)" if runs < 3 else ""),
           f"{worst / TARGET:.2f}", where("Check before a load"), docsection.verdict(met)]
    return "\n".join(lines), row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=None, help="runs of each (default 5; 2 with --quick)")
    docsection.add_arguments(p)
    args = p.parse_args()
    runs = args.runs or (2 if args.quick else 5)
    if runs < 1:
        p.error("--runs must be at least 1")
    text, row = report(runs, measure(runs), f"benchmarks/archive_scan.py --runs {runs}")
    docsection.publish(args, "archive-scan", "Check before a load", text, [row])
    if "**missed**" in row[-1]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
