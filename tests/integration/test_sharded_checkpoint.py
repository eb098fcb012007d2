"""Durable checkpoints of a sharded model (``hvd.shard`` with ``--checkpoint-dir``): torch DCP, resharded on load.

Two jobs over one checkpoint folder, with ``tests/integration/shard_probe.py --full-checksum``
(a checksum of the whole model and AdamW state, which does not depend on how it is sharded):

1. 127.0.0.1 and 127.0.0.2 with two slots each: the workers of host 0 write sharded
   checkpoints (one DCP file per worker, and a manifest). Every worker is killed at once
   and discovery offers two new hosts: every replica of every shard is gone, and the job
   resumes from the newest checkpoint. The new hosts' state on entry is exactly the one
   the old workers committed at that step, and the job completes, writing a final one.
2. A new job on the same folder with one slot a host: it resumes from the first job's
   final checkpoint, resharded from 2 workers a host to 1, bitwise the state the first job
   finished with, and trains on.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.integration.harness import REPO, HostsFile, kill_job_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PROBE = REPO / "tests" / "integration" / "shard_probe.py"


def _host(event) -> str:
    return event["worker"].split("[")[0]


def test_a_sharded_job_that_lost_every_host_resumes_from_its_dcp_checkpoint_and_a_job_of_one_slot_reshards_it(
        jobs, tmp_path):
    ckpt = tmp_path / "ckpt"
    hosts = HostsFile(tmp_path, ["127.0.0.1:2", "127.0.0.2:2"])
    first = jobs(["run", "-np", "4", "--min-np", "4", "--max-np", "4", "--slots-per-host", "2", "--whole-hosts",
                  "--host-discovery-script", str(hosts.script), "--discovery-interval", "0.2",
                  "--host-missing-grace", "0.5", "--blacklist-cooldown-range", "300", "300", "--elastic-timeout", "60",
                  "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "1",
                  sys.executable, str(PROBE), "--steps", "14", "--step-sleep", "0.1", "--full-checksum"])
    first.wait_for(lambda j: "checkpoint of step" in j.output() and any(e["step"] >= 5 for e in j.of("commit")),
                   timeout=120, what="a sharded checkpoint and some steps")
    hosts.set(["127.0.0.3:2", "127.0.0.4:2"])
    kill_job_workers(first.job_id())
    assert first.finish(timeout=150) == 0, first.output()
    out = first.output()
    assert "resumed from the checkpoint of step" in out, out
    new = [e for e in first.of("entered") if _host(e) in ("127.0.0.3", "127.0.0.4")]
    assert len(new) == 4 and len({e["step"] for e in new}) == 1, new
    resumed_at = new[0]["step"]
    assert resumed_at >= 1, "the new hosts started from step 0"
    # The state the new hosts start from is the whole state the old workers committed at that step.
    old = {e["full"] for e in first.of("commit") if e["step"] == resumed_at and _host(e) in ("127.0.0.1", "127.0.0.2")}
    assert len(old) == 1 and {e["full"] for e in new} == old, (new, old)
    done = first.of("done")
    assert sorted(_host(e) for e in done) == ["127.0.0.3"] * 2 + ["127.0.0.4"] * 2, done
    assert len({e["full"] for e in done}) == 1 and {e["step"] for e in done} == {14}, done
    # The final checkpoint: one DCP file per worker of the host that wrote it, listed in its manifest.
    newest = sorted(p for p in ckpt.iterdir() if p.name.startswith("ckpt-"))[-1]
    manifest = json.loads((newest / "manifest.json").read_text())
    assert manifest["step"] == 14 and manifest["shards"]["count"] == 2, manifest
    assert sorted(f for f in manifest["shards"]["files"] if f.endswith(".distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    # The same folder, one slot a host: the shards of 2 workers are loaded by 1.
    second = jobs(["run", "-np", "2", "--min-np", "2", "--slots-per-host", "1", "--whole-hosts",
                   "-H", "127.0.0.1:1,127.0.0.2:1", "--checkpoint-dir", str(ckpt),
                   sys.executable, str(PROBE), "--steps", "17", "--step-sleep", "0.05", "--full-checksum"])
    assert second.finish(timeout=150) == 0, second.output()
    assert "resuming from" in second.output() and "the latest checkpoint is of step 14" in second.output()
    entered = second.of("entered")
    assert len(entered) == 2 and {(e["step"], e["full"]) for e in entered} == {(14, done[0]["full"])}, entered
    hello = second.of("hello")
    assert all(e["held"] == e["full"] for e in hello), hello  # one worker a host holds the whole model
    finished = second.of("done")
    assert {e["step"] for e in finished} == {17} and len({e["full"] for e in finished}) == 1, finished
