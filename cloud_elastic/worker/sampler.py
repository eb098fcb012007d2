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

Progress is kept compactly so a commit costs the same for any dataset size:
the ``b``-th batch of every worker is one contiguous span of the shuffled
order, so recorded batches are a few ``[start, end)`` spans of it (usually
one), on top of an immutable set of what earlier rounds of the epoch
processed. The spans are folded into that set only at a reset. (Horovod's
sampler deep-copies its whole processed set at every commit.)
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
        #: Indices processed in earlier rounds of this epoch; replaced, never mutated.
        self._done_before: frozenset[int] = frozenset()
        #: Sorted, disjoint ``[start, end)`` spans of ``_order`` processed in this round.
        self._done_spans: list[tuple[int, int]] = []
        #: Indices marked with ``record_indices``.
        self._extra: set[int] = set()
        self.reset()

    @property
    def processed_indices(self) -> set[int]:
        """Every index processed in this epoch (built on demand)."""
        return set(self._fold())

    @processed_indices.setter
    def processed_indices(self, indices: Any) -> None:
        self._done_before, self._done_spans, self._extra = frozenset(int(i) for i in indices), [], set()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: nothing processed yet.

        Calling it again with the current epoch (as training functions do when
        ``elastic.run`` re-enters them after a reset) keeps the progress made.
        """
        if epoch != self.epoch:
            self.processed_indices = ()
        self.epoch = epoch
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark the ``batch_idx``-th batch of every worker as processed (padding excluded)."""
        width = batch_size * self.num_replicas
        start, end = batch_idx * width, min((batch_idx + 1) * width, len(self.remaining_indices))
        if start < end:
            self._done_spans = _merge(self._done_spans, (start, end))

    def record_indices(self, indices: Any) -> None:
        """Mark specific indices as processed (this worker's view only)."""
        self._extra.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This worker's real (non-padding) indices of batch ``batch_idx``."""
        start = batch_idx * batch_size
        out = []
        for pos in range(start, min(start + batch_size, self.num_samples)):
            if pos * self.num_replicas + self.rank < len(self.remaining_indices):
                out.append(self._order[pos * self.num_replicas + self.rank])
        return out

    def state_dict(self) -> dict[str, Any]:
        # O(number of spans): the set and the order are shared, as neither is ever mutated.
        return {"epoch": self.epoch, "done_before": self._done_before, "order": self._order,
                "done_spans": list(self._done_spans), "extra": set(self._extra)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()``, or Horovod's form ``{"epoch", "processed_indices"}``."""
        self.epoch = state_dict["epoch"]
        if "processed_indices" in state_dict:
            self.processed_indices = state_dict["processed_indices"]
        else:
            self._done_before = _fold(state_dict["done_before"], state_dict["order"], state_dict["done_spans"],
                                      state_dict["extra"])
            self._done_spans, self._extra = [], set()
        self.reset()

    def reset(self) -> None:
        """Re-shard the unprocessed samples over the current workers."""
        if self._done_spans or self._extra:
            self._done_before = self._fold()
            self._done_spans, self._extra = [], set()
        ctx = get_context()
        self.num_replicas = ctx.info.size
        self.rank = ctx.info.rank
        self.remaining_indices = [i for i in range(len(self.dataset)) if i not in self._done_before]
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

    def _fold(self) -> frozenset[int]:
        return _fold(self._done_before, self._order, self._done_spans, self._extra)

    def __iter__(self) -> Iterator[int]:
        return iter(self._order[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


def _fold(before: frozenset[int], order: list[int], spans: list[tuple[int, int]], extra: set[int]) -> frozenset[int]:
    if not spans and not extra:
        return frozenset(before)
    done = set(before)
    done.update(extra)
    for start, end in spans:
        done.update(order[start:end])
    return frozenset(done)


def _merge(spans: list[tuple[int, int]], new: tuple[int, int]) -> list[tuple[int, int]]:
    """Add ``new`` to sorted disjoint spans, merging overlapping or touching ones."""
    if spans and spans[-1][1] == new[0]:  # the usual case: the next batch
        return spans[:-1] + [(spans[-1][0], new[1])]
    out: list[tuple[int, int]] = []
    start, end = new
    for a, b in spans:
        if b < start or a > end:
            out.append((a, b))
        else:
            start, end = min(a, start), max(b, end)
    out.append((start, end))
    return sorted(out)
