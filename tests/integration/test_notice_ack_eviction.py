"""Azure evicts a VM as soon as its scheduled event is acknowledged: the host's watcher must not
acknowledge while another worker of the host is still on its way out (rank 0 writing the last
checkpoint). One host with two slots holds all the state, so its rank 0 checkpoints as it leaves."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time

import pytest

from tests.emulator.fake_metadata import FakeAzureMetadata
from tests.integration.harness import HostsFile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Slot 0 registers late, so slot 1's worker becomes the host's watcher while slot 0's is rank 0; a buffer of
# 100 MB makes rank 0's checkpoint take a moment.
TRAIN = textwrap.dedent("""
    import json, os, time
    import torch
    if "[0]" in os.environ.get("CLOUD_ELASTIC_WORKER_ID", ""):
        time.sleep(3)
    import cloud_elastic.torch as hvd
    hvd.init()
    def ev(kind, **f):
        print("EVENT " + json.dumps(dict(f, kind=kind, pid=os.getpid())), flush=True)
    model = torch.nn.Linear(8, 1)
    model.register_buffer("big", torch.zeros(25_000_000))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    state = hvd.elastic.TorchState(model, opt, step=0)
    ev("hello", rank=hvd.rank())
    @hvd.elastic.run
    def train(state):
        while True:
            opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()
            state.step += 1
            if state.step % 10 == 0:
                state.commit()
                ev("commit", rank=hvd.rank(), step=state.step)
            time.sleep(0.02)
    train(state)
""")


class EvictingAzure(FakeAzureMetadata):
    """Does what Azure does after ``StartRequests``: evicts the VM (kills the host's workers) at once."""

    pids: set[int] = set()

    def handle(self, req):
        resp = super().handle(req)
        if req.method == "POST":
            for pid in self.pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return resp


def test_azure_is_acknowledged_only_after_rank_0_wrote_the_last_checkpoint(jobs, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    hosts = HostsFile(tmp_path, ["127.0.0.1:2"])
    with EvictingAzure("127.0.0.1", 0) as fake:
        fake.pids = set()
        job = jobs(["run", "-np", "2", "--min-np", "1", "--host-discovery-script", str(hosts.script),
                    "--notice-watcher", "azure", "--discovery-interval", "0.3",
                    "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "3600",
                    sys.executable, str(script)],
                   env={"CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT": f"http://{{host}}:{fake.port}"})
        fake.pids.update(job.wait_event("hello", rank=r, timeout=90)["pid"] for r in (0, 1))
        job.wait_event("commit", rank=0, step=30, timeout=90)
        # The last holders leave three safety margins (15 s) before the deadline: at once here.
        event_id = fake.add_event("Preempt", not_before=time.time() + 16)
        job.wait_for(lambda j: any("drained" in line for line in j.lines), timeout=60, what="the drain's log line")
        assert fake.wait_for(lambda: fake.acks == [event_id], timeout=30), job.output()
        job.kill()
    drained = next(line for line in job.lines if "drained" in line)
    assert "0 step(s) lost" in drained or "0 steps lost" in drained or "no step" in drained, drained
    assert "killed by signal" not in job.output(), job.output()
