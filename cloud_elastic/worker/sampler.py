"""``ElasticSampler``: shards the not-yet-processed samples of an epoch over the current workers.

After every reset the samples still unprocessed in this epoch are reshuffled
(seeded by ``seed + epoch``, so every worker computes the same order) and
split over the new number of workers. ``record_batch(i, batch_size)`` marks
the ``i``-th batch of *every* worker as processed: workers step in lockstep,
so each one can account for all of them without any exchange, and the work
a failed worker had committed is not redone by the survivors.

To keep the number of steps equal on every worker (collectives must match),
the shard is padded to a multiple of the worker count with samples from the
start of the order, as ``DistributedSampler`` and Horovod do: at most
``size - 1`` samples per reset are seen twice by the model. Padding is never
recorded as processed, so the processed set covers each index exactly once.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sized

import torch
from torch.utils.data import Sampler

from cloud_elastic.worker.context import get_context

__all__ = ["ElasticSampler"]


class ElasticSampler(Sampler):
    """Horovod's ``ElasticSampler``: ``ElasticSampler(dataset, shuffle=True, seed=0)``."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: nothing processed yet.

        Calling it again with the current epoch (as training functions do when
        ``elastic.run`` re-enters them after a reset) keeps the progress made.
        """
        if epoch != self.epoch:
            self.processed_indices = set()
        self.epoch = epoch
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark the ``batch_idx``-th batch of every worker as processed."""
        start = batch_idx * batch_size
        for rank in range(self.num_replicas):
            shard = self._order[rank : self.total_size : self.num_replicas]
            for pos, index in enumerate(shard[start : start + batch_size], start=start):
                if pos * self.num_replicas + rank < len(self.remaining_indices):
                    self.processed_indices.add(index)

    def record_indices(self, indices: Any) -> None:
        """Mark specific indices as processed (this worker's view only)."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This worker's real (non-padding) indices of batch ``batch_idx``."""
        start = batch_idx * batch_size
        out = []
        for pos in range(start, min(start + batch_size, self.num_samples)):
            if pos * self.num_replicas + self.rank < len(self.remaining_indices):
                out.append(self._order[pos * self.num_replicas + self.rank])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Re-shard the unprocessed samples over the current workers."""
        ctx = get_context()
        self.num_replicas = ctx.info.size
        self.rank = ctx.info.rank
        self.remaining_indices = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        order = list(self.remaining_indices)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
        pad = self.total_size - len(order)
        if pad and order:
            order += (order * (pad // len(order) + 1))[:pad]
        self._order = order

    def __iter__(self) -> Iterator[int]:
        return iter(self._order[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
