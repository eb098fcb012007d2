"""Every benchmark that ``./dev bench`` runs builds its command line: ``--help`` works and offers ``--quick``.

A benchmark whose argument parser cannot be built (two options with one name, say) fails only when
``./dev bench`` reaches it, after the others have run for minutes; this finds it in seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
try:
    import run_all  # noqa: E402  (benchmarks/ is not a package)
finally:
    sys.path.remove(str(BENCHMARKS))

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("bench", run_all.BENCHMARKS, ids=lambda b: b.name)
def test_each_benchmark_parses_the_options_dev_bench_passes(bench):
    script = BENCHMARKS / bench.script
    assert script.is_file(), f"./dev bench names {bench.script}, which does not exist"
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60,
                          cwd=BENCHMARKS)
    assert proc.returncode == 0, proc.stderr.strip().splitlines()[-1:]
    assert "--quick" in proc.stdout
