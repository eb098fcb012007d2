"""A durable checkpoint keeps what the in-memory sync keeps: an LR scheduler and a GradScaler in a ``TorchState``
(by their ``state_dict()``, loaded into the user's own objects) and numpy numbers and numeric arrays (in the
sync's tagged plain form, rebuilt with their type and value, never through numpy's pickling). Before, such a
job trained fine in memory and failed at its first durable checkpoint.

Real files in a temporary directory, through ``CheckpointStore``; standalone (rank 0 of 1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic import plain_numpy
from cloud_elastic.checkpoint import CheckpointError, CheckpointStore, load_state_payload, state_payload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def standalone():
    hvd.init()


def _build(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    state = hvd.elastic.TorchState(model, opt, scheduler=sched, scaler=scaler, epoch=0,
                                   loss=np.float32(0), counts={np.int64(0): 0}, history=np.zeros(0), best=float("inf"))
    return state, opt, sched, scaler


def _step(state) -> None:
    """One step with gradient scaling, not committed."""
    state.optimizer.zero_grad()
    loss = state.model(torch.ones(2, 4)).pow(2).mean()
    state.scaler.scale(loss).backward()
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.scheduler.step()
    state.loss = np.float32(loss.item())
    state.counts = {np.int64(state.epoch): np.uint8(state.epoch + 1)}
    state.history = np.append(state.history, np.float64(loss.item())).reshape(1, -1)[:, ::-1].copy()
    state.epoch += 1


def _train(state, steps: int) -> None:
    for _ in range(steps):
        _step(state)
        state.commit()


def _same_numpy(a, b) -> bool:
    return type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b) and a.tobytes() == b.tobytes()


def test_a_state_with_a_scheduler_a_scaler_and_numpy_values_round_trips_into_its_own_objects(tmp_path: Path) -> None:
    state, opt, sched, scaler = _build(0)
    _train(state, 3)
    store = CheckpointStore(str(tmp_path))
    store.save(3, state_payload(state))  # before: CheckpointError (the scheduler, then the numpy scalar)

    fresh, opt2, sched2, scaler2 = _build(1)
    load_state_payload(fresh, store.latest().payload)
    # The user's objects, loaded in place: the scheduler still steps the live optimizer.
    assert (fresh.scheduler, fresh.scaler, fresh.optimizer) == (sched2, scaler2, opt2)
    assert sched2.optimizer is opt2
    assert sched2.state_dict() == sched.state_dict() and sched2.last_epoch == 3
    assert sched2.get_last_lr() == sched.get_last_lr() == [0.125]
    assert [g["lr"] for g in opt2.param_groups] == [0.125]
    assert scaler2.state_dict() == scaler.state_dict() and scaler2.get_scale() == 1024.0 * 2 ** 3
    assert all(torch.equal(a, b) for a, b in zip(fresh.model.state_dict().values(), state.model.state_dict().values()))
    assert _same_numpy(fresh.loss, state.loss) and type(fresh.loss) is np.float32
    [(key, value)] = fresh.counts.items()
    assert (type(key), type(value), key, value) == (np.int64, np.uint8, 2, 3)
    assert _same_numpy(fresh.history, state.history) and fresh.history.shape == (1, 3)
    fresh.history[0, 0] = -1.0  # its own writable copy
    # The checkpoint is the fresh state's commit: a rollback returns to it, scheduler and scaler included.
    _step(fresh)
    assert sched2.last_epoch == 4 and scaler2.get_scale() == 1024.0 * 2 ** 4
    fresh.restore()
    assert sched2.last_epoch == 3 and [g["lr"] for g in opt2.param_groups] == [0.125]
    assert scaler2.get_scale() == 1024.0 * 2 ** 3


def test_schedulers_whose_state_dict_holds_a_counter_or_no_function_checkpoint_too(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    lr = torch.optim.lr_scheduler
    # MultiStepLR keeps its milestones in a Counter; LambdaLR with a plain function stores None for it.
    scheds = {"multistep": lr.MultiStepLR(opt, [1, 2]), "lambda": lr.LambdaLR(opt, lambda e: 0.5 ** e)}
    state = hvd.elastic.TorchState(model, opt, **scheds)
    opt.step()
    for s in scheds.values():
        s.step()
    state.commit()
    store = CheckpointStore(str(tmp_path))
    store.save(1, state_payload(state))
    opt2 = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    fresh = {"multistep": lr.MultiStepLR(opt2, [5]), "lambda": lr.LambdaLR(opt2, lambda e: 0.5 ** e)}
    load_state_payload(hvd.elastic.TorchState(model, opt2, **fresh), store.latest().payload)
    assert fresh["multistep"].milestones == scheds["multistep"].milestones
    assert [s.last_epoch for s in fresh.values()] == [1, 1]


def _forged_raw_view() -> torch.Tensor:
    # One stored byte seen 2**40 times: small in the file, a terabyte once copied out.
    return torch.zeros(1, dtype=torch.uint8).expand(2 ** 40)


def _forged_payload(forged) -> dict:
    state, *_ = _build(0)
    _train(state, 1)
    payload = state_payload(state)
    tag, kind, _code, _shape, raw = payload["loss"]
    assert (tag, kind) == (plain_numpy.TAG, "numpy")
    payload["loss"] = (tag, kind, *forged(raw))
    return payload


@pytest.mark.parametrize("forged", [
    lambda raw: ("O", None, raw),  # an object dtype: would build objects
    lambda raw: ("d", (10 ** 9,), raw),  # shape far bigger than the bytes
    lambda raw: ("d", None, raw.to(torch.int8)),
    lambda raw: ("not a dtype", None, raw),
], ids=["object-dtype", "shape-beyond-bytes", "not-bytes", "bad-dtype"])
def test_a_forged_numpy_tag_is_refused_in_one_line_and_changes_nothing(tmp_path: Path, forged) -> None:
    payload = _forged_payload(forged)
    store = CheckpointStore(str(tmp_path))
    store.save(1, payload)  # plain data as far as the store can tell: as an attacker could write it

    fresh, *_ = _build(1)
    before = [p.clone() for p in fresh.model.parameters()]
    with pytest.raises(CheckpointError, match=r"^the checkpoint holds a malformed numpy value \(.*\): corrupt or "
                                              r"forged$") as caught:
        load_state_payload(fresh, store.latest().payload)
    assert "\n" not in str(caught.value)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.model.parameters()))
    assert type(fresh.loss) is np.float32 and fresh.scheduler.last_epoch == 0


def test_a_numpy_tag_over_a_stride_0_view_is_passed_over_by_the_store_and_refused_by_the_load(tmp_path: Path):
    """Its state.pt holds a tensor with more elements than its storage: the store passes it over
    (``checkpoint.safety.check_loaded``), and ``load_state_payload``, handed the payload itself, refuses it too. The
    store does not write it (review s63 rvX F7): a forger does."""
    from tests.unit.test_checkpoint_loaded_views import _rewrite

    payload = _forged_payload(lambda raw: ("b", (2 ** 40,), _forged_raw_view()))
    store = CheckpointStore(str(tmp_path))
    with pytest.raises(CheckpointError, match=r"every load would refuse it: its state.pt holds a tensor of shape "
                                              r"\[1099511627776\] and strides \[0\]"):
        store.save(1, payload)
    _rewrite(tmp_path / store.save(1, {"placeholder": 0}).name, payload)
    assert store.latest() is None  # its only checkpoint
    with pytest.raises(CheckpointError, match=r"^the checkpoint holds a malformed numpy value \(.*\): corrupt or "
                                              r"forged$"):
        load_state_payload(_build(1)[0], payload)


def test_a_checkpoint_written_before_numpy_values_were_kept_loads_as_it_was(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=4, note=("a", 1))
    payload = {"model": model.state_dict(), "optimizer": state.optimizer.state_dict(), "epoch": 4, "note": ("a", 1)}
    store = CheckpointStore(str(tmp_path))
    store.save(1, payload)  # no tags: what state_payload wrote before
    fresh_model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    fresh = hvd.elastic.TorchState(fresh_model, torch.optim.SGD(fresh_model.parameters(), lr=0.1), epoch=0, note=None)
    loaded = store.latest().payload
    assert loaded["model"]._metadata  # module versions, which load_state_dict reads
    load_state_payload(fresh, loaded)
    assert (fresh.epoch, fresh.note) == (4, ("a", 1))
    assert all(torch.equal(a, b) for a, b in zip(fresh_model.state_dict().values(), model.state_dict().values()))


def test_an_attribute_a_sync_cannot_carry_ends_elastic_run_at_its_commit_in_one_line(capsys) -> None:
    state = hvd.elastic.ObjectState(epoch=0, extra=None)

    @hvd.elastic.run
    def train(state):
        state.extra = np.datetime64("2020-01-01")
        state.commit()

    with pytest.raises(SystemExit) as exited:  # before: the StateSyncError's traceback
        train(state)
    assert exited.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cloud-elastic: state.extra holds a numpy.datetime64"), lines
