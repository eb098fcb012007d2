"""``hvd.elastic.run`` after ``hvd.shutdown()`` raises ValueError until ``hvd.init()``, as every call that needs the
job does (the docstring of ``shutdown`` and docs/porting.md say so): it used to call ``init()`` itself, which
silently undid the shutdown and trained."""

from __future__ import annotations

import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic.worker import elastic

pytestmark = pytest.mark.timeout(60)


def test_elastic_run_after_shutdown_raises_until_init_again(monkeypatch):
    monkeypatch.setattr(elastic, "_completed", False)  # restored after: a run below completes in this process
    hvd.init()
    model = torch.nn.Linear(2, 1)
    state = hvd.elastic.TorchState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), epoch=0)
    calls = []

    @hvd.elastic.run
    def train(state):
        calls.append(state.epoch)
        return "trained"

    hvd.shutdown()
    try:
        with pytest.raises(ValueError, match=r"^cloud_elastic.torch was shut down \(hvd.shutdown\(\)\); call "
                                             r"hvd.init\(\) to use it again$"):
            train(state)
        assert calls == [] and hvd.is_initialized() is False
    finally:
        hvd.init()  # the other tests of this process need it
    assert train(state) == "trained" and calls == [0]
