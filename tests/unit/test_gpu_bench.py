"""benchmarks/gpu.py's pieces that a CPU can check: where its table goes, and what ``--profile`` counts.

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
    # benchmarks/ on sys.path only while the module loads: left there, it shadowed packages of the same name for
    # every later test of this xdist worker (benchmarks/kubernetes.py for ``import kubernetes``: the Kubernetes
    # provider's tests failed with "'kubernetes' is not a package" when they came after this file).
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
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


def test_the_profile_counts_the_host_waits_of_each_profiled_step():
    import torch

    gpu = _load("gpu")
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    profile = gpu.StepProfile(start=2, steps=3, cuda=False)
    for index in range(6):
        profile.before_step(index)
        opt.zero_grad()
        loss = model(torch.ones(4, 8)).sum()
        loss.backward()
        opt.step()
        loss.item()  # one host read of a tensor per step (a device sync on a GPU)
        profile.after_step(index)
    assert profile.result is not None and profile.result["steps"] == 3
    assert profile.result["host_waits_per_step"]["aten::_local_scalar_dense"] == 1
    assert any(name.startswith("Optimizer.step") for name, _ in profile.result["top_host_ms_per_step"])
