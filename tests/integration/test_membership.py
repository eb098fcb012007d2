"""Graceful membership changes driven by a discovery script, under an ElasticSampler.

Scale-up and scale-in alone (newcomer rank, no rollback, the leaver leaving at a commit) are
asserted on one job in test_events.py, beside what its events file records.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.integration.harness import HostsFile, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _run_args(hosts: HostsFile, *extra: str) -> list[str]:
    return [
        "run", "-np", "2", "--min-np", "1", "--max-np", "4", "--host-discovery-script", str(hosts.script),
        "--discovery-interval", "0.2", "--host-missing-grace", "0.5", *extra,
    ]


def _sizes_after_shrink(job) -> list[int]:
    """World sizes of rank 0's batches from its first batch at size 2 on."""
    sizes = [e["size"] for e in job.of("batch", rank=0)]
    return sizes[sizes.index(2):] if 2 in sizes else []


def test_elastic_sampler_processes_every_index_once_across_shrink_and_grow(jobs, tmp_path):
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    n = 240
    job = jobs(_run_args(hosts, "-np", "3", *probe_cmd("--sampler", str(n), "--epochs", "2", "--min-resets", "2", "--step-sleep", "0.05")))
    job.wait_event("batch", rank=0, epoch=0, step=3)
    hosts.set(["127.0.0.1", "127.0.0.2"])  # shrink mid-epoch 0
    job.wait_for(lambda j: any(e["size"] == 2 and e["step"] >= 8 for e in j.of("batch")), what="shrunk")
    # Batches of size 3 from before the shrink (it takes effect at a commit, steps later) must not count
    # as the growth: only a size-3 batch after the first size-2 one does (CI once saw that race).
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.4"])  # grow again
    job.wait_for(lambda j: _sizes_after_shrink(j).count(3), what="grown")
    assert job.finish() == 0, job.output()
    sizes = [e["size"] for e in job.of("batch", rank=0)]
    assert 2 in sizes and sizes[0] == 3 and sizes[-1] == 3, f"{sizes}\n{job.output()}"
    epochs = sorted({e["epoch"] for e in job.of("batch")})
    assert epochs == list(range(len(epochs))) and len(epochs) >= 2
    for epoch in epochs:
        seen = Counter(i for e in job.of("batch", epoch=epoch) for i in e["indices"])
        assert set(seen) == set(range(n)), f"epoch {epoch}: missing {sorted(set(range(n)) - set(seen))[:10]}"
        assert max(seen.values()) == 1, f"epoch {epoch}: processed twice: {[i for i, c in seen.items() if c > 1]}"
