"""``hvd.elastic``: the elastic loop, state objects and sampler (Horovod's names)."""

from __future__ import annotations

from cloud_elastic.worker.elastic import run
from cloud_elastic.worker.sampler import ElasticSampler
from cloud_elastic.worker.commit.state import ObjectState, State, TorchState

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler"]
