"""A job whose script averages gradients itself (``hvd.allreduce_``, as docs/porting.md allows) and steps a plain
torch optimizer shows its optimizer steps per second in ``cloud-elastic status`` and the metrics (review s54,
eaba657: 'steps/s -' and ``cloud_elastic_steps_per_second 0.0``, since only ``DistributedOptimizer`` counted)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request

import pytest

from tests.integration.harness import CLI, REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCRIPT = """\
import time, torch, torch.nn.functional as F
import cloud_elastic.torch as hvd
hvd.init()
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = hvd.elastic.TorchState(model, opt, step=0)
@hvd.elastic.run
def train(state):
    while state.step < 100000:
        x = torch.randn(4, 8)
        opt.zero_grad(); F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        for p in model.parameters():
            hvd.allreduce_(p.grad)
        opt.step()
        state.step += 1
        state.commit()
        time.sleep(0.02)
train(state)
"""


def test_status_and_metrics_show_the_step_rate_of_a_plain_optimizer(jobs, tmp_path):
    script = tmp_path / "manual_allreduce_train.py"
    script.write_text(SCRIPT)
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = {"XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(REPO)}
    job = jobs(["run", "-H", "127.0.0.1:1", "-np", "1", "--metrics-port", "0", "python", str(script)], env=env)
    port = job.wait_for(lambda j: next((m.group(1) for line in j.lines
                                        if (m := re.search(r"Prometheus metrics at http://[\d.]+:(\d+)/", line))), None),
                        what="the metrics address")

    def rates(_job) -> tuple[float, float] | None:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        metric = float(re.search(r"^cloud_elastic_steps_per_second (\S+)$", text, re.M).group(1))
        shown = subprocess.run(CLI + ["status", job.job_id(), "--json"], env={**os.environ, **env}, timeout=60,
                               capture_output=True, text=True, cwd="/")
        status = json.loads(shown.stdout)["steps_per_s"] if shown.returncode == 0 else None
        return (metric, status) if metric > 0 and status else None  # NaN > 0 is False: unknown until counted

    metric, status = job.wait_for(lambda j: j.job_id() and rates(j), timeout=60, what="a step rate above 0")
    assert metric > 0 and status > 0
    text = subprocess.run(CLI + ["status", job.job_id()], env={**os.environ, **env}, timeout=60,
                          capture_output=True, text=True, cwd="/").stdout
    assert re.search(r"^steps/s \d+\.\d\d, last commit #\d+", text, re.M), text
    job.proc.send_signal(signal.SIGINT)
    assert job.finish() == 130, job.output()
