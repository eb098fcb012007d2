"""The shipped examples run as documented."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_horovod_documentation_example_runs_with_only_imports_changed(jobs):
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:2", sys.executable, "examples/horovod_elastic_doc.py"])
    assert job.finish() == 0, job.output()
    assert "[0]<127.0.0.1[0]> finished 2 epochs on 2 worker(s)" in job.lines
    source = (REPO / "examples" / "horovod_elastic_doc.py").read_text()
    code = source.split('"""', 2)[2]  # past the module docstring, which quotes the original import
    assert "import cloud_elastic.torch as hvd" in code and "import horovod" not in code


def test_synthetic_example_trains_under_the_launcher(jobs):
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1,127.0.0.2", sys.executable, "examples/torch_synthetic.py", "--steps", "40"])
    assert job.finish() == 0, job.output()
    assert any(line.startswith("[0]<127.0.0.1[0]> done: 40 steps") for line in job.lines), job.output()


def test_a_worker_script_also_runs_standalone_without_the_launcher():
    out = subprocess.run(
        [sys.executable, "examples/torch_synthetic.py", "--steps", "10", "--log-every", "5"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "done: 10 steps" in out.stdout and "1 worker(s) at the end" in out.stdout
