"""The shipped examples run as documented."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.integration.harness import REPO, worker_on

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


def test_ported_torchrun_script_survives_a_kill_with_its_state_intact(jobs):
    """docs/torchrun.md's "after": three workers, one killed with ``kill -9`` mid-training. The two survivors
    roll back to their last in-memory commit instead of restarting, shard what is left of the epoch between them,
    and finish every epoch with each of its samples trained once, as identical replicas."""
    job = jobs(["run", "-np", "3", "--min-np", "2", "-H", "127.0.0.1,127.0.0.2,127.0.0.3",
                "--blacklist-cooldown-range", "300", "300",  # no replacement: the survivors finish alone
                sys.executable, "examples/ddp_ported.py", "--step-sleep", "0.05", "--log-every", "1"])
    job.wait_for(lambda j: any(" step 4 " in line and "on 3 worker(s)" in line for line in j.lines), 60,
                 "step 4 on three workers")
    os.kill(worker_on(job.job_id(), "127.0.0.3"), signal.SIGKILL)
    assert job.finish() == 0, job.output()
    out = job.output()
    assert re.search(r"worker 127\.0\.0\.3\[0\]#\d+ \(rank \d\) killed by signal 9", out), out
    rolled = [int(n) for n in re.findall(r"survivors rolled back (\d+) step\(s\)", out)]
    assert len(rolled) == 1 and rolled[0] <= 1, out
    printed = re.findall(r"^\[0\]<[^>]*> epoch \d+ step (\d+) loss \S+ on (\d) worker\(s\)$", out, re.M)
    three, two = ([int(step) for step, size in printed if size == n] for n in "32")
    assert three == list(range(1, len(three) + 1)) and two == list(range(two[0], two[0] + len(two))), printed
    assert three[-1] <= two[0] <= three[-1] + 2, printed  # the survivors went on from their commit, not from 0
    for epoch in range(3):
        assert f"epoch {epoch} done: 512 of 512 samples" in out, out
    assert not re.search(r"done: (?!512 )\d+ of 512 samples", out), out
    done = re.findall(r"> done: 3 epochs, (\d+) steps, rank \d of 2, weights (\w+)$", out, re.M)
    assert len(done) == 2 and len(set(done)) == 1 and int(done[0][0]) == two[-1], out


def test_an_unported_torchrun_script_ends_the_job_saying_what_to_change(jobs):
    """Review s63 rvU finding 6: the "before" of docs/torchrun.md, unchanged, ends in one line that points to the port."""
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:2", sys.executable, "examples/ddp_torchrun.py"])
    assert job.finish() == 1, job.output()
    assert job.lines[-1].endswith("environment variable RANK expected, but not set (a torchrun script? cloud-elastic "
                                  "sets no RANK or WORLD_SIZE: port it to cloud_elastic.torch, docs/torchrun.md)"), \
        job.output()


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
                     "broadcast_parameters", "broadcast_to_receivers", "broadcast_state_sizes", "broadcast_state_refused",
                     "gather_rows", "sync_facts_alone", "heal_buffers_from_rank0"):
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
