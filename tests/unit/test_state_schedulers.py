"""An LR scheduler or GradScaler in a ``TorchState`` is the user's own object, committed, restored and synced
through its ``state_dict()`` in place: a copy would step a copy of the optimizer, and the live learning rate
would never change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic.worker.comm import collectives, statecodec
from cloud_elastic.worker.commit import state as state_module

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def standalone():
    hvd.init()


def _opt(lr: float = 1.0):
    model = torch.nn.Linear(4, 1)
    return model, hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                           named_parameters=model.named_parameters())


def _step(model, opt) -> None:
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()


def test_the_state_keeps_the_users_scheduler_and_its_step_changes_the_live_learning_rate():
    model, opt = _opt()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model, opt, scheduler=sched, epoch=0)
    assert state.scheduler is sched and state.scheduler.optimizer is opt
    _step(model, opt)
    state.scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("mode", [pytest.param("snapshot", marks=pytest.mark.commit_mode("snapshot")), "auto"])
def test_restore_brings_scheduler_and_learning_rate_back_to_the_commit_together(mode):
    model, opt = _opt()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model, opt, scheduler=sched)
    for _ in range(2):
        _step(model, opt)
        sched.step()
        state.commit()
    for _ in range(3):  # lost steps
        _step(model, opt)
        sched.step()
    state.restore()
    assert (sched.last_epoch, sched.get_last_lr(), opt.param_groups[0]["lr"]) == (2, [0.25], 0.25)
    _step(model, opt)
    sched.step()  # training goes on from the commit
    assert (sched.last_epoch, opt.param_groups[0]["lr"]) == (3, 0.125)


def test_a_grad_scaler_is_committed_and_restored_in_place():
    model, opt = _opt()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    state = hvd.elastic.TorchState(model, opt, scaler=scaler)
    assert state.scaler is scaler
    scaler.scale(torch.ones(1))  # a first scaled loss: the scale now lives in a tensor
    scaler.update(new_scale=64.0)
    state.commit()
    scaler.update(new_scale=2.0)
    state.restore()
    assert scaler.get_scale() == 64.0


def _ctx(monkeypatch, rank: int, facts):
    ledger = SimpleNamespace(window=SimpleNamespace(learn=lambda *a, **k: None, discard=lambda: None),
                             sync_begun=True, sync_known=False, sync_pending=facts, live_commit_seq=3,
                             holds_commit=rank == 0)
    ctx = SimpleNamespace(info=SimpleNamespace(rank=rank, size=2, cross_rank=0, cross_size=1, round=1),
                          ledger=ledger, standalone=False, device=torch.device("cpu"))
    for module in (state_module, collectives):
        monkeypatch.setattr(module, "get_context", lambda: ctx)
    return ctx


def test_a_sync_gives_a_receiver_rank_0s_scheduler_and_scaler_in_its_own_objects(monkeypatch):
    sent = []

    def broadcast_state(obj, root_rank, name, **kwargs):  # over the wire: the real codec, both ways
        if obj is not None:
            sent.append(statecodec.decode(statecodec.encode(obj, name), name))
        return sent[-1]

    monkeypatch.setattr(collectives, "broadcast_state", broadcast_state)
    states = []
    for rank, steps in ((0, 3), (1, 0)):
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** (10 - steps))
        scaler.scale(torch.ones(1))
        for _ in range(steps):
            opt.step()
            sched.step()
        states.append((hvd.elastic.TorchState(scheduler=sched, scaler=scaler, epoch=steps), sched, scaler, opt))
    facts = {"root_seq": 3, "has_collectives": False, "confirmed": True, "receivers": [1]}
    for rank, (state, *_) in enumerate(states):
        _ctx(monkeypatch, rank, facts if rank == 0 else None)
        state.sync()
    state, sched, scaler, opt = states[1]
    assert (state.scheduler, state.scaler) == (sched, scaler)
    assert (state.epoch, sched.last_epoch, sched.get_last_lr(), scaler.get_scale()) == (3, 3, [0.125], 128.0)
    assert sched.optimizer is opt  # the receiver's own optimizer, whose learning rate its steps now set
    sched.step()  # (a real state holds the optimizer too, whose learning rate the same sync gives)
    assert (sched.last_epoch, opt.param_groups[0]["lr"]) == (4, 0.5)
