"""state_payload / load_state_payload on a real TorchState in standalone mode (rank 0 of 1).

A checkpoint written from one state and loaded into a freshly built one gives
back the model, the optimizer (momentum included), the sampler's progress and
every plain attribute, and becomes that state's commit: a rollback after the
load returns to the checkpoint, never to the initial weights.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.checkpoint import (
    CheckpointError,
    CheckpointStore,
    CheckpointWriter,
    load_state_payload,
    state_payload,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()
    assert (hvd.rank(), hvd.size()) == (0, 1)


def _build(distributed: bool, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(50)), shuffle=True, seed=1)
    return hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0, best_loss=float("inf"))


def _step(state) -> None:
    """One training step, not committed."""
    idx = state.sampler.get_indices(state.batch, 4)
    x = torch.tensor(idx, dtype=torch.float32).unsqueeze(1).repeat(1, 4) / 50
    state.optimizer.zero_grad()
    loss = F.mse_loss(state.model(x), x.sum(1, keepdim=True))
    loss.backward()
    state.optimizer.step()
    state.sampler.record_batch(state.batch, 4)
    state.batch += 1
    state.best_loss = min(state.best_loss, loss.item())


def _train(state, steps: int) -> None:
    for _ in range(steps):
        _step(state)
        state.commit()


def _values(state) -> dict:
    return {
        "model": {k: v.clone() for k, v in state.model.state_dict().items()},
        "momentum": [s["momentum_buffer"].clone() for s in state.optimizer.state_dict()["state"].values()],
        "batch": state.batch, "best_loss": state.best_loss, "epoch": state.epoch,
        "processed": set(state.sampler.processed_indices),
    }


def _assert_same(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert len(a["momentum"]) == len(b["momentum"]) > 0
    assert all(torch.equal(x, y) for x, y in zip(a["momentum"], b["momentum"]))
    assert {k: a[k] for k in ("batch", "best_loss", "epoch", "processed")} == {
        k: b[k] for k in ("batch", "best_loss", "epoch", "processed")}


# Steps past the commit, then a restore: kept commits (a loop whose windows hold steps or collectives
# keeps them; auto mode learns that in its first window, see test_in_place_commit.py).
@pytest.mark.commit_mode("snapshot")
@pytest.mark.parametrize("distributed", [False, True], ids=["plain-sgd", "distributed-optimizer"])
def test_a_checkpoint_restores_a_fresh_state_and_becomes_its_commit(tmp_path: Path, distributed: bool) -> None:
    state = _build(distributed)
    _train(state, 5)
    committed = _values(state)
    store = CheckpointStore(str(tmp_path))
    with CheckpointWriter(store) as writer:
        assert writer.submit(5, state_payload(state), {"epoch": state.epoch})
        _train(state, 3)  # training goes on while (and after) the checkpoint is written
    assert state.batch == 8

    fresh = _build(distributed, seed=123)
    _train(fresh, 1)  # a state with progress of its own (and momentum) that the checkpoint replaces
    load_state_payload(fresh, store.latest().payload)
    _assert_same(_values(fresh), committed)
    # The sampler resumes where the checkpoint was: the next batch holds only unprocessed samples.
    assert not set(fresh.sampler.get_indices(fresh.batch, 4)) & committed["processed"]
    # A failure after the load rolls back to the checkpoint, not to what the process had before.
    _step(fresh)
    fresh.restore()
    _assert_same(_values(fresh), committed)


def test_the_written_checkpoint_holds_the_commit_not_later_steps(tmp_path: Path) -> None:
    state = _build(distributed=True)
    _train(state, 2)
    committed = _values(state)
    store = CheckpointStore(str(tmp_path))
    with CheckpointWriter(store) as writer:
        writer.submit(2, state_payload(state))
        _train(state, 4)  # zero-copy SGD moves parameters between storages from step to step
    payload = store.latest().payload
    for key, value in committed["model"].items():
        assert torch.equal(payload["model"][key], value), key
    assert payload["batch"] == 2


def test_a_checkpoint_of_another_state_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    state = _build(distributed=False)
    _train(state, 2)
    payload = state_payload(state)
    other = _build(distributed=False, seed=5)
    _train(other, 1)
    before = _values(other)

    with pytest.raises(CheckpointError, match="missing: sampler; unexpected: lr"):
        load_state_payload(other, {**{k: v for k, v in payload.items() if k != "sampler"}, "lr": 0.1})
    _assert_same(_values(other), before)

    wrong = dict(payload, model={**payload["model"], "2.weight": torch.zeros(3, 8)})
    with pytest.raises(CheckpointError, match="does not fit this state"):
        load_state_payload(other, wrong)
    _assert_same(_values(other), before)


def test_checkpointing_a_billion_sample_sampler_builds_nothing_per_sample() -> None:
    # A million samples processed of a billion: the checkpoint holds the sampler's spans, not the indices,
    # so what the training thread builds and the writer stores does not grow with the dataset.
    sampler = hvd.elastic.ElasticSampler(range(10**9), shuffle=False)
    sampler.record_batch(0, 10**6)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    state.commit()
    entry = state_payload(state)["sampler"]
    buffer = io.BytesIO()
    torch.save(entry, buffer)
    assert buffer.tell() < 4096, f"the sampler's checkpoint entry is {buffer.tell()} bytes"

    fresh = hvd.elastic.TorchState(sampler=hvd.elastic.ElasticSampler(range(10**9), shuffle=False), epoch=0)
    buffer.seek(0)
    load_state_payload(fresh, {"sampler": torch.load(buffer, weights_only=True), "epoch": 0})
    assert fresh.sampler.get_indices(0, 3) == [10**6, 10**6 + 1, 10**6 + 2]


def test_a_checkpoint_with_the_sampler_as_processed_indices_still_loads() -> None:
    # Checkpoints written before the sampler was stored as spans hold Horovod's form.
    state = _build(distributed=False)
    old = dict(state_payload(state), sampler={"epoch": 0, "processed_indices": torch.tensor([3, 7, 11])})
    load_state_payload(state, old)
    assert state.sampler.processed_indices == {3, 7, 11}
    assert not {3, 7, 11} & set(state.sampler.get_indices(0, 50))


def test_the_sampler_entry_gives_the_processed_indices_with_plain_torch_as_documented() -> None:
    state = _build(distributed=False)
    _train(state, 3)
    entry = state_payload(state)["sampler"]
    generator = torch.Generator().manual_seed(entry["seed"] + entry["epoch"])
    order = torch.randperm(entry["size"], generator=generator) if entry["shuffle"] else torch.arange(entry["size"])
    processed = torch.cat([order[a:b] for a, b in entry["done"]])
    assert set(processed.tolist()) == state.sampler.processed_indices and len(processed) == 12
