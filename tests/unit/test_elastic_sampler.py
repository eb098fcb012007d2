"""ElasticSampler bookkeeping across shrink and grow, worker by worker, in one process.

Each "worker" is a sampler whose view of its rank and the worker count comes
from a small context object (the sampler only reads ``ctx.info.rank/size``);
the real multi-process path is covered by
tests/integration/test_membership.py. Here the arithmetic is checked over
many shapes: every index processed exactly once per epoch, padding never
recorded, committed progress restored exactly.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloud_elastic.worker import sampler as sampler_module
from cloud_elastic.worker.comm import statecodec
from cloud_elastic.worker.sampler import ElasticSampler

pytestmark = pytest.mark.timeout(60)


class _Workers:
    """Samplers of ``size`` lockstep workers; ``resize`` is a reset to another size."""

    def __init__(self, monkeypatch, dataset_len: int, size: int, **kwargs) -> None:
        self._current = SimpleNamespace(info=SimpleNamespace(rank=0, size=size))
        monkeypatch.setattr(sampler_module, "get_context", lambda: self._current)
        self.dataset = list(range(dataset_len))
        self.kwargs = kwargs
        self.samplers: list[ElasticSampler] = []
        #: ``state.batch``, the index a script may pass to record_batch: counted over the whole epoch,
        #: set back to its committed value on a restore (``commit``/``restore``), never by a reset.
        self.epoch_batch = self._committed_batch = 0
        self.resize(size, base=None)

    def _as(self, rank: int, size: int):
        self._current = SimpleNamespace(info=SimpleNamespace(rank=rank, size=size))

    def resize(self, size: int, base: ElasticSampler | None) -> None:
        """A reset: every new worker loads the state of ``base`` (rank 0's, as sync does)."""
        # As sync() carries it: torch.save, then weights_only loading.
        state = statecodec.decode(statecodec.encode(base.state_dict(), "s"), "s") if base is not None else None
        self.samplers = []
        self.next_batch = 0  # each worker's loader starts over on its new shard
        for rank in range(size):
            self._as(rank, size)
            s = ElasticSampler(self.dataset, **self.kwargs)
            if state is not None:
                s.load_state_dict(state)
            self.samplers.append(s)

    def run_batches(self, n: int, batch_size: int, seen: list[int], index: str = "loader") -> None:
        """Every worker takes its next ``n`` batches (real samples go to ``seen``) and records them, naming each
        by its index in this round's loader (``index="loader"``, Horovod's examples) or by ``state.batch``."""
        for _ in range(n):
            b = self.next_batch
            for rank, s in enumerate(self.samplers):
                self._as(rank, len(self.samplers))
                seen.extend(s.get_indices(b, batch_size))
            for rank, s in enumerate(self.samplers):
                self._as(rank, len(self.samplers))
                s.record_batch(b if index == "loader" else self.epoch_batch, batch_size)
            self.next_batch += 1
            self.epoch_batch += 1

    def commit(self) -> dict:
        self._committed_batch = self.epoch_batch
        return self.samplers[0].state_dict()

    def restore(self, committed: dict) -> None:
        """A failure: every survivor restores its own commit, ``state.batch`` with it."""
        for s in self.samplers:
            s.load_state_dict(committed)
        self.epoch_batch, self.next_batch = self._committed_batch, 0


@pytest.mark.parametrize("dataset_len,batch_size", [(103, 4), (64, 8), (10, 3)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_index_is_processed_once_across_shrink_and_grow(monkeypatch, dataset_len, batch_size, shuffle):
    workers = _Workers(monkeypatch, dataset_len, 3, shuffle=shuffle, seed=5)
    seen: list[int] = []
    workers.run_batches(2, batch_size, seen)
    workers.resize(2, base=workers.samplers[0])  # shrink
    workers.run_batches(1, batch_size, seen)
    workers.resize(4, base=workers.samplers[0])  # grow
    while len(workers.samplers[0]) > 0:
        batches = -(-len(workers.samplers[0]) // batch_size)
        workers.run_batches(batches, batch_size, seen)
        workers.resize(4, base=workers.samplers[0])
    assert sorted(seen) == list(range(dataset_len))
    assert workers.samplers[0].processed_indices == set(range(dataset_len))


def test_restoring_a_commit_forgets_later_batches_only(monkeypatch):
    workers = _Workers(monkeypatch, 50, 2, seed=1)
    s = workers.samplers[0]
    s.record_batch(0, 5)
    committed = s.state_dict()
    done = s.processed_indices
    assert len(done) == 10  # batch 0 of both workers
    s.record_batch(1, 5)
    s.record_batch(2, 5)
    assert len(s.processed_indices) == 30
    s.load_state_dict(committed)
    assert s.processed_indices == done
    assert not done & set(s)  # the remaining shard excludes what was committed


def test_commits_do_not_copy_progress_proportional_to_the_dataset(monkeypatch):
    workers = _Workers(monkeypatch, 100_000, 1, seed=1)
    s = workers.samplers[0]
    for b in range(50):
        s.record_batch(b, 32)
    assert s.state_dict()["done"] == [[0, 1600]]
    assert len(s.processed_indices) == 1600


def test_sync_carries_a_few_hundred_bytes_for_a_million_samples(monkeypatch):
    # The state sync after a failure used to pickle the processed set: 5 MB at this size.
    workers = _Workers(monkeypatch, 1_000_000, 4, seed=1)
    for _ in range(3):
        workers.run_batches(40, 64, [])
        workers.resize(3, base=workers.samplers[0])
    encoded = statecodec.encode(workers.samplers[0].state_dict(), "sampler")
    assert len(encoded) < 4096
    assert len(workers.samplers[0].processed_indices) == 3 * 40 * 64 * 4 - 2 * 40 * 64  # 4, then 3 workers


class _Huge:
    """A dataset of a trillion samples: anything proportional to it never finishes."""

    def __len__(self) -> int:
        return 10**12


def test_reset_commit_restore_and_sync_do_not_walk_the_dataset(monkeypatch):
    workers = _Workers(monkeypatch, 1, 3, shuffle=False)
    workers.dataset = _Huge()
    workers.resize(3, base=None)
    seen: list[int] = []
    workers.run_batches(2, 5, seen)
    committed = workers.samplers[0].state_dict()
    workers.run_batches(3, 5, seen)
    workers.samplers[0].load_state_dict(committed)  # a restore
    workers.resize(2, base=workers.samplers[0])  # a failure: sync from rank 0, reset
    assert workers.samplers[0].state_dict()["done"] == [[0, 30]]
    first = workers.samplers[0].get_indices(0, 5) + workers.samplers[1].get_indices(0, 5)
    assert sorted(first) == list(range(30, 40))
    assert len(workers.samplers[0]) == (10**12 - 30) // 2


@pytest.mark.parametrize("index", ["loader", "state.batch"])
def test_exactly_once_across_a_failure_that_loses_uncommitted_batches(monkeypatch, index):
    # A kill -9: batches after the last commit are lost and redone by the survivors. The index passed to
    # record_batch is ignored: an epoch-wide counter (state.batch) names batches the new shards never had.
    workers = _Workers(monkeypatch, 211, 4, seed=9)
    seen: list[int] = []
    workers.run_batches(3, 4, seen, index)
    committed = workers.commit()
    lost: list[int] = []
    workers.run_batches(2, 4, lost, index)  # processed, never committed
    workers.restore(committed)
    workers.resize(3, base=workers.samplers[0])
    workers.run_batches(2, 4, seen, index)
    workers.resize(2, base=workers.samplers[0])  # a graceful shrink
    for _ in range(10):  # rounds until the epoch is done (bounded: a sampler that loses count never ends)
        if len(workers.samplers[0]) == 0:
            break
        workers.run_batches(-(-len(workers.samplers[0]) // 4), 4, seen, index)
        workers.resize(2, base=workers.samplers[0])
    assert sorted(seen) == list(range(211))
    assert set(lost) <= set(seen)


def test_state_for_another_dataset_is_refused(monkeypatch):
    workers = _Workers(monkeypatch, 10, 1)
    state = workers.samplers[0].state_dict()
    other = _Workers(monkeypatch, 11, 1).samplers[0]
    with pytest.raises(ValueError, match="size, seed, shuffle"):
        other.load_state_dict(state)


def test_horovod_state_dict_form_loads_and_a_new_epoch_starts_empty(monkeypatch):
    workers = _Workers(monkeypatch, 20, 1, shuffle=False)
    s = workers.samplers[0]
    s.load_state_dict({"epoch": 0, "processed_indices": {0, 1, 2, 19}})
    assert list(s)[:2] == [3, 4] and 19 not in list(s)
    s.record_indices([3])
    s.set_epoch(0)  # re-entered after a reset: progress kept
    assert s.processed_indices == {0, 1, 2, 3, 19}
    s.set_epoch(1)
    assert s.processed_indices == set() and len(s) == 20


def test_padding_is_never_recorded(monkeypatch):
    # 7 samples over 3 workers: shards of 3, the last two slots pad with the first samples.
    workers = _Workers(monkeypatch, 7, 3, shuffle=False)
    last = [s.get_indices(2, 1) for s in workers.samplers]
    assert last == [[6], [], []]
    s = workers.samplers[0]
    for b in range(2):
        s.record_batch(b, 1)
    assert s.processed_indices == set(range(6))
    s.record_batch(2, 1)  # the batch holding the padding
    assert s.processed_indices == set(range(7)) and s.state_dict()["done"] == [[0, 7]]


def _one_pass(s: ElasticSampler, batch_size: int) -> list[int]:
    seen = list(s)
    for _ in range(-(-len(s) // batch_size)):
        s.record_batch(0, batch_size)
    return seen


@pytest.mark.parametrize("first_set_epoch", [True, False])
def test_a_script_that_reuses_one_epoch_number_trains_every_pass(monkeypatch, first_set_epoch):
    s = _Workers(monkeypatch, 10, 1, seed=3).samplers[0]
    if first_set_epoch:
        s.set_epoch(0)
    first = _one_pass(s, 4)
    s.set_epoch(0)  # the epoch is finished: a new pass over the same order
    assert len(s) == 10 and s.processed_indices == set()
    assert _one_pass(s, 4) == first


def test_set_epoch_again_keeps_an_unfinished_epoch_and_a_finished_one_reentered_after_a_reset(monkeypatch):
    workers = _Workers(monkeypatch, 12, 2, shuffle=False)
    workers.samplers[0].set_epoch(0)
    workers.run_batches(1, 2, [])
    workers.resize(3, base=workers.samplers[0])  # re-entered mid-epoch
    s = workers.samplers[0]
    s.set_epoch(0)
    assert s.processed_indices == {0, 1, 2, 3} and len(s) == 3
    workers.run_batches(3, 1, [])  # the epoch's last batches (8 left over 3 workers)
    workers.resize(3, base=s)  # a reset between the last batch and state.epoch += 1
    s = workers.samplers[0]
    s.set_epoch(0)  # the re-entered function finds the epoch done, not to be trained again
    assert len(s) == 0
    s.set_epoch(0)  # called once more in this round: a new pass
    assert len(s) == 4 and s.processed_indices == set()


@pytest.mark.parametrize("shuffle", [True, False])
def test_horovod_024_state_dict_form_resumes_after_horovods_own_prefix(monkeypatch, shuffle):
    import random

    s = _Workers(monkeypatch, 30, 2, shuffle=shuffle, seed=4).samplers[0]
    s.load_state_dict({"epoch": 2, "processed_num": 12})  # Horovod >= 0.24's ElasticSampler.state_dict()
    horovods = list(range(30))
    if shuffle:
        random.Random(4 + 2).shuffle(horovods)  # Horovod's order of epoch 2: its first 12 were processed
    assert s.epoch == 2 and s.processed_indices == set(horovods[:12])
    assert len(s) == 9 and not set(s) & set(horovods[:12])
    s.load_state_dict({"epoch": 2, "processed_num": 40})  # past the end (padding counted): the epoch is done
    assert len(s) == 0
