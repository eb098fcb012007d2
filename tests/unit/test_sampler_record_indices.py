"""``ElasticSampler.record_indices`` in a job: refused in one line, pointing to ``record_batch``.

Recorded by one worker only, the indices would make the workers re-shard different remaining samples
after a reset (different shard lengths: collectives that no longer match). In a plain ``python`` run, one
process, it records as before (tests/unit/test_elastic_sampler.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloud_elastic.worker import sampler as sampler_module
from cloud_elastic.worker.comm.ops import UnsupportedError
from cloud_elastic.worker.sampler import ElasticSampler

pytestmark = pytest.mark.timeout(30)


def _sampler(monkeypatch, standalone: bool, rank: int = 0, size: int = 2) -> ElasticSampler:
    ctx = SimpleNamespace(standalone=standalone, info=SimpleNamespace(rank=rank, size=size))
    monkeypatch.setattr(sampler_module, "get_context", lambda: ctx)
    return ElasticSampler(list(range(10)), shuffle=False)


def test_record_indices_in_a_job_is_refused_with_the_remedy(monkeypatch):
    s = _sampler(monkeypatch, standalone=False)
    with pytest.raises(UnsupportedError, match=r"call record_batch\(batch_idx, batch_size\) after each batch") as raised:
        s.record_indices([0, 2])
    assert "\n" not in str(raised.value)
    assert s.processed_indices == set()  # nothing half-recorded on this worker alone


def test_record_indices_in_a_plain_python_run_records(monkeypatch):
    s = _sampler(monkeypatch, standalone=True, size=1)
    s.record_indices([0, 2])
    s.reset()
    assert s.processed_indices == {0, 2} and len(s) == 8
