"""``ElasticSampler``: shards the not-yet-processed samples of an epoch over the current workers.

Each epoch has one fixed order of the dataset: a permutation seeded by
``seed + epoch`` (the identity without shuffling), the same on every worker.
After every reset, the positions of that order not yet processed are split
over the new number of workers, in order: position ``j`` of what remains
goes to worker ``j % size``. Each ``record_batch(batch_idx, batch_size)``
marks the next batch of *every* worker as processed, counted from the round's
start (``batch_idx`` is ignored, as by Horovod >= 0.24, which adds
``batch_size * size`` to a processed count): workers step in lockstep, so
each one can account for all of them without any exchange, and the work a
failed worker had committed is not redone by the survivors.

To keep the number of steps equal on every worker (collectives must match),
the shard is padded to a multiple of the worker count with samples from the
start of what remains, as ``DistributedSampler`` and Horovod do: at most
``size - 1`` samples per reset are seen twice by the model. Padding is never
recorded as processed, so the processed set covers each index exactly once.

Progress is kept as sorted, disjoint ``[start, end)`` spans of positions of
the epoch's order: batch ``b`` of every worker is one contiguous span of
what remains, so a round adds about one span, and a reset, a commit, a
restore and a state sync each cost O(spans), whatever the dataset size.
(Horovod's sampler rebuilds and re-shuffles the list of remaining indices at
every reset, and deep-copies its processed set at every commit.) Only a new
epoch touches every index, once, to draw its permutation.
"""

from __future__ import annotations

import bisect
import math
import random
from typing import Any, Iterable, Iterator, Sized

import torch
from torch.utils.data import Sampler

from cloud_elastic.checkpoint.api import StateDictMismatch
from cloud_elastic.worker.comm.ops import UnsupportedError
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.comm import followers

__all__ = ["ElasticSampler"]

Spans = list[tuple[int, int]]


class ElasticSampler(Sampler):
    """Horovod's ``ElasticSampler``: ``ElasticSampler(dataset, shuffle=True, seed=0)``."""

    #: A durable checkpoint holds it as its ``state_dict()`` (``cloud_elastic.checkpoint.payload.SavedByStateDict``).
    saved_by_state_dict = True

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._n = len(dataset)
        self._perm: torch.Tensor | None = None  # the epoch's order; None = identity
        self._perm_key: tuple[int, int] | None = None
        self._inverse: torch.Tensor | None = None  # position of each index; built only when asked
        #: Positions of the epoch's order processed before this round (folded at each reset).
        self._done: Spans = []
        #: Spans of *this round's* positions (0 .. remaining) recorded by ``record_batch``.
        self._round_spans: Spans = []
        #: Dataset indices marked with ``record_indices`` since the last reset.
        self._extra: set[int] = set()
        #: This round's positions that ``record_batch`` has recorded (its calls since the last reset).
        self._recorded = 0
        #: ``set_epoch`` was called since the last reset (see there).
        self._same_round = False
        self.reset()

    # ------------------------------------------------------------ progress
    @property
    def processed_indices(self) -> set[int]:
        """Every index processed in this epoch (built on demand, O(processed))."""
        return {int(i) for a, b in self._all_done() for i in self._order_slice(a, b)}

    @processed_indices.setter
    def processed_indices(self, indices: Iterable[int]) -> None:
        self._done, self._round_spans, self._extra = self._spans_of_indices(indices), [], set()

    @property
    def remaining_indices(self) -> list[int]:
        """The indices still to process this epoch, in this round's order (built on demand, O(remaining))."""
        return [int(i) for a, b in self._remaining for i in self._order_slice(a, b)]

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: nothing processed yet.

        Calling it again with the current epoch keeps the progress made while
        the epoch is unfinished: a training function that ``elastic.run``
        re-enters after a reset calls ``set_epoch(state.epoch)`` again. Once
        every sample of the epoch is processed, it starts a new pass (a script
        that reuses one epoch number), unless nothing happened in this round
        but the reset (no batch recorded, no ``set_epoch`` since): a function
        re-entered between the epoch's last batch and its next epoch finds the
        epoch finished, not to be trained again.
        """
        this_round = self._same_round or self._recorded > 0 or bool(self._extra)
        if epoch != self.epoch or this_round and self._finished():
            self._done, self._round_spans, self._extra = [], [], set()
        self.epoch = epoch
        self.reset()
        self._same_round = True

    def _finished(self) -> bool:
        return self._done_with_extra() == ([(0, self._n)] if self._n else [])

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark the next batch of every worker as processed (padding excluded): the batches recorded since the
        round began are this round's first ones. ``batch_idx`` is ignored (Horovod >= 0.24 ignores it too):
        an epoch-wide counter (``state.batch``) would name a batch the re-sharded order never had."""
        width = batch_size * self.num_replicas
        start, end = self._recorded, min(self._recorded + width, self._remaining_len)
        self._recorded += width
        if start < end:
            self._round_spans = _merge(self._round_spans, (start, end))

    def record_indices(self, indices: Iterable[int]) -> None:
        """Mark specific indices as processed: in a plain ``python`` run (one process) only.

        In a job it raises UnsupportedError: indices one worker records are known to no other (Horovod 0.20-0.23
        merged them across workers at each commit, a collective at every commit), so after a reset the workers
        would re-shard different remaining samples, into shards of different lengths whose collectives no longer
        match. ``record_batch`` counts every worker's batch with no exchange.
        """
        if not getattr(get_context(), "standalone", True):
            raise UnsupportedError("ElasticSampler.record_indices is not supported in a cloud-elastic job (the "
                                   "indices one worker records are unknown to the others, whose shards would then "
                                   "differ after a reset): call record_batch(batch_idx, batch_size) after each batch")
        self._extra.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This worker's real (non-padding) indices of batch ``batch_idx``."""
        out = []
        for pos in range(batch_idx * batch_size, min((batch_idx + 1) * batch_size, self.num_samples)):
            j = pos * self.num_replicas + self.rank
            if j < self._remaining_len:
                out.append(self._index_at(j))
        return out

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Plain values only (ints and lists), O(spans): cheap to commit, safe to sync."""
        done = self._all_done() if not self._extra else self._done_with_extra()
        return {"epoch": self.epoch, "size": self._n, "seed": self.seed, "shuffle": self.shuffle,
                "done": [list(s) for s in done]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()``, or Horovod's forms: ``{"epoch", "processed_indices"}`` (before 0.24) and
        ``{"epoch", "processed_num"}`` (0.24 on: the first ``processed_num`` of Horovod's own order of the epoch,
        ``random.Random(seed + epoch)`` shuffling, rebuilt here once: O(dataset), as Horovod's every reset).

        StateDictMismatch (a ValueError), before anything changes, when a ``state_dict()`` is of another dataset
        size, seed or shuffling: a checkpoint's load reports it as a checkpoint that does not fit this state."""
        if "processed_indices" not in state_dict and "processed_num" not in state_dict:
            theirs = (state_dict["size"], state_dict["seed"], state_dict["shuffle"])
            if theirs != (self._n, self.seed, self.shuffle):
                raise StateDictMismatch(
                    f"ElasticSampler state is for (size, seed, shuffle) = {theirs}, this sampler has "
                    f"{(self._n, self.seed, self.shuffle)}"
                )
        self.epoch = int(state_dict["epoch"])
        if "processed_indices" in state_dict:
            self.processed_indices = state_dict["processed_indices"]
        elif "processed_num" in state_dict:
            order = list(range(self._n))
            if self.shuffle:
                random.Random(self.seed + self.epoch).shuffle(order)
            self.processed_indices = order[:max(0, int(state_dict["processed_num"]))]
        else:
            self._done = [(int(a), int(b)) for a, b in state_dict["done"]]
            self._round_spans, self._extra = [], set()
        self.reset()

    def reset(self) -> None:
        """Re-shard the unprocessed samples over the current workers: O(spans)."""
        if self._round_spans or self._extra:
            self._done = self._done_with_extra()
            self._round_spans, self._extra = [], set()
        self._recorded, self._same_round = 0, False
        ctx = get_context()
        self.num_replicas, self.rank = followers.data_shard(ctx)  # a follower copies an active member's shard
        self._ensure_perm()
        self._remaining = _complement(self._done, self._n)
        self._starts = []  # round position where each remaining span begins
        total = 0
        for a, b in self._remaining:
            self._starts.append(total)
            total += b - a
        self._remaining_len = total
        self.num_samples = math.ceil(total / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        if self._remaining_len == 0:
            return iter(())
        j = torch.arange(self.rank, self.total_size, self.num_replicas, dtype=torch.int64) % self._remaining_len
        starts = torch.tensor(self._starts, dtype=torch.int64)
        firsts = torch.tensor([a for a, _ in self._remaining], dtype=torch.int64)
        span = torch.searchsorted(starts, j, right=True) - 1
        positions = firsts[span] + (j - starts[span])
        indices = positions if self._perm is None else self._perm[positions]
        return iter(indices.tolist())

    def __len__(self) -> int:
        return self.num_samples

    # -------------------------------------------------------------- helpers
    def _ensure_perm(self) -> None:
        key = (self.seed + self.epoch, self._n)
        if not self.shuffle or self._perm_key == key:
            return
        g = torch.Generator()
        g.manual_seed(key[0])
        self._perm, self._perm_key, self._inverse = torch.randperm(self._n, generator=g), key, None

    def _order_slice(self, a: int, b: int) -> list[int]:
        return list(range(a, b)) if self._perm is None or not self.shuffle else self._perm[a:b].tolist()

    def _position_of(self, round_pos: int) -> int:
        """The epoch-order position of this round's position ``round_pos`` (< remaining)."""
        k = bisect.bisect_right(self._starts, round_pos) - 1
        return self._remaining[k][0] + round_pos - self._starts[k]

    def _index_at(self, round_pos: int) -> int:
        pos = self._position_of(round_pos)
        return pos if self._perm is None or not self.shuffle else int(self._perm[pos])

    def _all_done(self) -> Spans:
        """Earlier rounds' spans plus this round's, in epoch-order positions."""
        out = self._done
        for start, end in self._round_spans:
            while start < end:  # a round span may cross gaps of what earlier rounds processed
                k = bisect.bisect_right(self._starts, start) - 1
                a, b = self._remaining[k]
                first = a + start - self._starts[k]
                last = min(b, first + end - start)
                out = _merge(out, (first, last))
                start += last - first
        return out

    def _done_with_extra(self) -> Spans:
        done = self._all_done()
        if self._extra:
            positions = self._positions_of(self._extra)
            for p in positions:
                done = _merge(done, (p, p + 1))
        return done

    def _positions_of(self, indices: Iterable[int]) -> list[int]:
        idx = [int(i) for i in indices if 0 <= int(i) < self._n]
        if self._perm is None or not self.shuffle:
            return sorted(idx)
        if self._inverse is None:  # O(dataset), only for record_indices and Horovod's state form
            self._inverse = torch.empty_like(self._perm)
            self._inverse[self._perm] = torch.arange(self._n, dtype=self._perm.dtype)
        return sorted(self._inverse[torch.tensor(idx, dtype=torch.int64)].tolist()) if idx else []

    def _spans_of_indices(self, indices: Iterable[int]) -> Spans:
        self._ensure_perm()
        spans: Spans = []
        for p in self._positions_of(indices):
            if spans and spans[-1][1] == p:
                spans[-1] = (spans[-1][0], p + 1)
            elif not spans or spans[-1][1] < p:
                spans.append((p, p + 1))
        return spans


def _complement(spans: Spans, n: int) -> Spans:
    out: Spans = []
    at = 0
    for a, b in spans:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < n:
        out.append((at, n))
    return out


def _merge(spans: Spans, new: tuple[int, int]) -> Spans:
    """Add ``new`` to sorted disjoint spans, merging overlapping or touching ones."""
    if spans and spans[-1][1] == new[0]:  # the usual case: the next batch
        return spans[:-1] + [(spans[-1][0], new[1])]
    if not spans or spans[-1][1] < new[0]:
        return spans + [new]
    out: Spans = []
    start, end = new
    for a, b in spans:
        if b < start or a > end:
            out.append((a, b))
        else:
            start, end = min(a, start), max(b, end)
    out.append((start, end))
    return sorted(out)
