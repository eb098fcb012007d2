"""How fast the command line answers when it starts no job: ``--help``, ``providers``, shell completion.

The CLI imports no torch and no cloud SDK for these (tests/unit/test_cli_help.py checks the
modules; this measures the time, which no test asserts). For each command, ``--runs`` runs
interleaved round-robin (so a load change on the shared machine hits every command alike):

* wall time of the whole process, as a user waits for it (the ``cloud-elastic`` console
  script next to this interpreter, else ``python -m cloud_elastic.cli``);
* the same for ``python -c pass``: the interpreter's own start-up, which no change here can remove;
* ``python -X importtime`` around ``main(["providers"])``: the import time of everything the
  command loads (the CLI module and what ``providers`` imports lazily), the modules that cost
  most of it, and whether torch or a cloud SDK is among them.

The target (issue 14) is under 0.3 s for each command and for the imports.

Run: ``.venv/bin/python benchmarks/cli_import.py [--runs 20] [--quick]`` (a few seconds); it prints a
table and writes it into docs/benchmarks.md (``docsection``: section ``cli-import`` and its glance row).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import docsection
from common import REPO, stamp, where

TARGET_S = 0.3
GLANCE_TARGET = "CLI start-up (`--help`, `providers`, completion) < 0.3 s"
_COMPLETE = {"_CLOUD_ELASTIC_COMPLETE": "bash_complete", "COMP_WORDS": "cloud-elastic run --provider ",
             "COMP_CWORD": "3"}
_IMPORTTIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")
#: As tests/unit/test_cli_help.py: modules whose import would make these commands slow.
_HEAVY = ("torch", "numpy", "boto3", "botocore", "google.cloud.compute_v1", "azure.mgmt.compute", "azure.identity",
          "ibm_vpc", "ibm_cloud_sdk_core", "matplotlib", "prometheus_client")


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("cloud-elastic")
    if script.exists():
        return [str(script)]
    found = shutil.which("cloud-elastic")
    return [found] if found else [sys.executable, "-m", "cloud_elastic.cli"]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # This checkout's code, whatever is installed; no user site or bytecode writes to skew a run.
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONNOUSERSITE": "1", **(extra or {})}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _commands() -> dict[str, tuple[list[str], dict[str, str]]]:
    cli = _cli()
    return {
        "cloud-elastic --help": (cli + ["--help"], _env()),
        "cloud-elastic providers": (cli + ["providers"], _env()),
        "completion of `run --provider `": (cli, _env(_COMPLETE)),
        "python -c pass (interpreter start-up)": ([sys.executable, "-c", "pass"], _env()),
    }


def _wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.decode()[-500:]}")
    return took


def _importtime() -> tuple[float, dict[str, float]]:
    """Import time of everything ``cloud-elastic providers`` loads (s), and each module's own time (s)."""
    code = "import sys\nfrom cloud_elastic.cli import main\nsys.exit(main(['providers']))"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=_env(), cwd="/",
                          capture_output=True, text=True, check=True)
    own = {}
    for line in done.stderr.splitlines():
        m = _IMPORTTIME.match(line)
        if m:
            own[m.group(4)] = own.get(m.group(4), 0.0) + int(m.group(1)) / 1e6
    if "cloud_elastic.cli" not in own:
        raise SystemExit("python -X importtime did not report cloud_elastic.cli")
    return sum(own.values()), own


def measure(runs: int) -> tuple[dict[str, list[float]], list[float], dict[str, list[float]]]:
    """Wall times per command, CLI import times, and each module's self time, over ``runs`` rounds."""
    commands = _commands()
    for argv, env in commands.values():  # warm the page cache and write bytecode once
        _wall(argv, env)
    _importtime()
    walls: dict[str, list[float]] = {name: [] for name in commands}
    imports: list[float] = []
    own: dict[str, list[float]] = {}
    for _ in range(runs):
        for name, (argv, env) in commands.items():
            walls[name].append(_wall(argv, env))
        total, modules = _importtime()
        imports.append(total)
        for module, seconds in modules.items():
            own.setdefault(module, []).append(seconds)
    return walls, imports, own


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def report(runs: int, walls: dict[str, list[float]], imports: list[float], own: dict[str, list[float]],
           top: int, command: str) -> tuple[str, list[str]]:
    """The section's text and the glance row."""
    heaviest = sorted(own.items(), key=lambda kv: -statistics.median(kv[1]))[:top]
    heavy = sorted(m for m in own if m in _HEAVY or m.startswith(tuple(h + "." for h in _HEAVY)))
    import_median = statistics.median(imports)
    cli = {name: statistics.median(t) for name, t in walls.items() if not name.startswith("python -c")}
    slowest = max([import_median, *cli.values()])
    met = slowest < TARGET_S
    lines = [
        f"{stamp(command)} Median and slowest of {runs} runs, interleaved.",
        "",
        "| command | wall time, median | slowest |",
        "|---|---|---|",
        *[f"| {name} | {_ms(statistics.median(t))} | {_ms(max(t))} |" for name, t in walls.items()],
        f"| imports of `cloud-elastic providers` (`-X importtime`, all modules) | {_ms(import_median)} | "
        f"{_ms(max(imports))} |",
        "",
        f"Target: under {TARGET_S:g} s for each command and for the imports: {'met' if met else 'NOT met'}. "
        f"Torch or a cloud SDK among the imports: {', '.join(heavy) or 'none'}. "
        "Modules with the largest own import time (median): "
        + ", ".join(f"`{m}` {_ms(statistics.median(t))}" for m, t in heaviest) + ".",
    ]
    row = [GLANCE_TARGET, f"slowest median {_ms(slowest)}" + (" (quick run)" if runs < 10 else ""),
           f"{slowest / TARGET_S:.2f}", where("Command-line start-up"), docsection.verdict(met)]
    return "\n".join(lines), row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=None, help="rounds of every command (default 20; 3 with --quick)")
    p.add_argument("--top", type=int, default=5, help="how many of the costliest modules to name")
    docsection.add_arguments(p)
    args = p.parse_args()
    runs = args.runs or (3 if args.quick else 20)
    if runs < 1:
        p.error("--runs must be at least 1")
    command = f"benchmarks/cli_import.py --runs {runs}"
    text, row = report(runs, *measure(runs), top=args.top, command=command)
    docsection.publish(args, "cli-import", "Command-line start-up", text, [row])


if __name__ == "__main__":
    main()
