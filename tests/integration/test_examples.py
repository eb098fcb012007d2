"""The shipped examples run as documented."""

from __future__ import annotations

import json
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
        cwd=REPO, capture_output=True, text=True, timeout=110,  # 4 s alone; 60 s ran out in a clean-clone run at load 15-20
    )
    assert out.returncode == 0, out.stderr
    assert "done: 10 steps" in out.stdout and "1 worker(s) at the end" in out.stdout


def test_collectives_and_gradient_averaging_across_workers(jobs):
    # Two "hosts": 127.0.0.1 with two slots and 127.0.0.2 with one.
    # --heartbeat-timeout 20: the check is about the exit's reason; a slow teardown is covered by the workers'
    # `exiting` message (docs/architecture/worker.md, "At exit"), and this is the margin should that message be late.
    job = jobs(["run", "-np", "3", "-H", "127.0.0.1:2,127.0.0.2:1", "--heartbeat-timeout", "20", sys.executable,
                "tests/integration/collectives_check.py"])
    # The script does not use elastic.run: it runs as a fixed-size job, which succeeds when every worker exits 0.
    assert job.finish() == 0, job.output()
    assert "training completed on 3 worker(s), every one exiting 0" in job.lines[-1], job.output()
    rows = [json.loads(line.split("CHECK ", 1)[1]) for line in job.lines if "CHECK " in line]
    assert sorted(r["rank"] for r in rows) == [0, 1, 2], job.output()
    for row in rows:
        for name in ("gradient_average", "allreduce_average", "allreduce_sum", "allgather_ragged", "broadcast_object", "broadcast",
                     "broadcast_parameters", "broadcast_to_receivers", "broadcast_state_sizes", "gather_rows", "sync_facts_alone",
                     "heal_buffers_from_rank0"):
            assert row[name] is True, (name, row)
        # rank: (local_rank, local_size, cross_rank, cross_size)
        assert row["topology"] == [[0, 2, 0, 2], [1, 2, 0, 1], [0, 1, 1, 2]]


def test_sharded_example_trains_on_two_loopback_hosts_of_two_workers(jobs):
    job = jobs(["run", "--whole-hosts", "--slots-per-host", "2", "-np", "4", "--min-np", "2",
                "-H", "127.0.0.1:2,127.0.0.2:2", sys.executable, "examples/sharded_fsdp2.py", "--steps", "6"])
    assert job.finish() == 0, job.output()
    done = [line for line in job.lines if "> done: 6 steps" in line]
    assert len(done) == 4 and all("4 worker(s) on 2 host(s)" in line for line in done), job.output()
    held = sorted(int(line.split("holds ")[1].split()[0]) for line in done)
    full = int(done[0].split("of the model's ")[1].split()[0])
    assert held[0] + held[-1] == full and held[-1] < full, done  # each host's two workers hold half each
