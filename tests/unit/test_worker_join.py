"""A worker that joins a running job joins at its first call that needs the round (``WorkerContext.join_if_pending``).

The rendezvous itself is a real job's (tests/integration/test_join_after_setup.py); here a
context whose first rendezvous the test holds open shows what other threads and calls see meanwhile.
"""

from __future__ import annotations

import threading

import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic.worker import context
from cloud_elastic.worker.rounds.groups import RoundInfo
from cloud_elastic.worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(60)


class HeldJoin(context.WorkerContext):
    """A context registered while the job ran: its first rendezvous waits for the test's ``let_in``."""

    def __init__(self) -> None:
        super().__init__(WorkerSettings.from_environ({"CLOUD_ELASTIC_SLOT": "3"}))
        self.join_pending = True
        self.joining = threading.Event()
        self.let_in = threading.Event()
        self.rendezvous_calls = 0

    def _first_rendezvous(self) -> None:
        self.rendezvous_calls += 1
        self.joining.set()
        assert self.let_in.wait(30)
        self.info = RoundInfo(1, 2, 3, 4, 1, 2, round=2, needs_sync=True, update_gen=0)


@pytest.fixture
def pending(monkeypatch):
    ctx = HeldJoin()
    monkeypatch.setattr(context, "_CONTEXT", ctx)
    return ctx


def test_another_thread_asking_while_the_worker_joins_waits_for_the_round_and_local_rank_is_known(pending):
    assert hvd.local_rank() == 3 and pending.rendezvous_calls == 0  # the slot: no join for it
    main = threading.Thread(target=hvd.rank)
    main.start()
    assert pending.joining.wait(10)
    assert hvd.local_rank() == 3  # still known while the main thread joins
    seen: list[object] = []
    other = threading.Thread(target=lambda: seen.append((hvd.rank(), hvd.size())))
    other.start()
    other.join(0.3)
    assert other.is_alive() and seen == []  # it waits for the round rather than failing
    pending.let_in.set()
    main.join(10)
    other.join(10)
    assert seen == [(1, 2)] and pending.rendezvous_calls == 1


def test_shutdown_before_the_first_call_that_needs_the_round_does_not_join_one(pending):
    hvd.shutdown()
    assert pending.rendezvous_calls == 0 and pending.join_pending


def test_the_warm_up_step_before_joining_leaves_the_scripts_random_stream_and_autograd_as_they_were():
    """``context._warm_up_a_step`` runs in ``hvd.init()`` on the script's thread: a seeded script draws the same
    numbers after it as without it (its model's initial weights, its data order), and grad mode is unchanged."""
    torch.manual_seed(1234)
    expected = torch.rand(5)
    torch.manual_seed(1234)
    with torch.no_grad():
        context._warm_up_a_step()
        assert not torch.is_grad_enabled()
    context._warm_up_a_step()
    assert torch.is_grad_enabled()
    assert torch.equal(torch.rand(5), expected)
