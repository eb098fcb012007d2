"""benchmarks/gpu.py's table lands in docs/benchmarks.md's GPU section, the one ``./dev bench`` writes.

(``--update-docs`` called ``write_section`` with the wrong arguments and failed after a GPU run:
nothing on a CPU machine had ever called it.)
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(30)


def _load(name: str):
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_gpu_table_replaces_the_gpu_section_and_nothing_else(tmp_path):
    gpu, run_all = _load("gpu"), _load("run_all")
    doc = tmp_path / "benchmarks.md"
    shutil.copyfile(REPO / "docs" / "benchmarks.md", doc)
    before = doc.read_text()
    assert "<!-- gpu:begin -->" in before, "docs/benchmarks.md has no GPU section"
    table = "### GPU benchmark (NVIDIA X1, torch 9, NCCL 9)\n\n| variant | median step |\n|---|---|\n| DDP | 1.0 ms |"
    gpu.record(table, doc)
    after = doc.read_text()
    assert table in after and after.count("<!-- gpu:begin -->") == 1
    outside = lambda text: text[: text.index("<!-- gpu:begin -->")] + text[text.index("<!-- gpu:end -->"):]  # noqa: E731
    assert outside(after) == outside(before)
    # ./dev bench (run_all.py) writes the same section.
    assert [b.name for b in run_all.BENCHMARKS if b.script == "gpu.py"] == [gpu.SECTION_KEY]
