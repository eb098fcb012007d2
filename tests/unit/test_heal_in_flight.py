"""``Heal.post``: the follow window's pieces travel while the next step computes and land later
(``InFlight.land``). Two holders and a receiver of a real Gloo group (one thread each, in this process).

What a user relies on: nothing is written into the receiver's tensors until it lands them (a receive that a
failed round leaves behind must not write into a state the next sync gave), what lands is the holders' bits,
and landing does not read as the script's own change of a parameter (its version counter stays)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from cloud_elastic.worker.comm import collectives, heal as heal_module
from cloud_elastic.worker.comm.heal import Heal

pytestmark = pytest.mark.timeout(60)

_CONTEXTS: dict[int, SimpleNamespace] = {}


def _tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(301, generator=g))
    return [weight, torch.randn(7, generator=g), torch.randint(0, 100, (5,), generator=g),  # packed together
            torch.randn(50_000, generator=g)[3:]]  # one big tensor, a misaligned view, shared by both holders


def _held(into: torch.Tensor, mine: list[torch.Tensor], held: list[torch.Tensor]) -> torch.Tensor:
    """The holders' values of ``into``, a slice of one of the receiver's tensors ``mine``."""
    for t, h in zip(mine, held):
        if into.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
            at = into.storage_offset() - t.storage_offset()
            return h.detach().reshape(-1)[at: at + into.numel()]
    raise AssertionError("a landing slice of no tensor of the receiver's")


def test_pieces_posted_land_only_when_landed_bit_equal_and_without_a_version_bump(monkeypatch):
    for module in (heal_module, collectives):
        monkeypatch.setattr(module, "get_context", lambda: _CONTEXTS[threading.get_ident()])
    states = {0: _tensors(0), 1: _tensors(0), 2: _tensors(1)}  # ranks 0 and 1 hold the commit, rank 2 needs it
    before = [t.detach().clone() for t in states[2]]
    versions = [t._version for t in states[2]]
    store, errors, seen = dist.HashStore(), [], {}
    sent = threading.Barrier(3)

    def member(rank: int) -> None:
        try:
            group = dist.ProcessGroupGloo(store, rank, 3, timedelta(seconds=20))
            ctx = SimpleNamespace(info=SimpleNamespace(rank=rank, size=3), device=torch.device("cpu"),
                                  point_to_point=lambda what, start: start(group), wait=lambda work, what: work.wait())
            _CONTEXTS[threading.get_ident()] = ctx
            heal = Heal([2], 3, 5)
            flight = heal.post(states[rank], "the commit, following")
            if rank == 2:
                sent.wait(20)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not all(  # every byte is in its landing buffers
                        torch.equal(landed, _held(into, states[2], states[0])) for landed, into in flight.copies):
                    time.sleep(0.01)
                seen["untouched"] = all(torch.equal(t, b) for t, b in zip(states[2], before))
                flight.land(ctx)
                seen["bytes"] = heal.bytes
            else:
                flight.land(ctx)  # the sends are done: its tensors may change now
                sent.wait(20)
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(rank,), daemon=True) for rank in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert not any(t.is_alive() for t in threads), "the post or its landing hung"
    assert not errors, errors
    assert seen["untouched"], "a receive wrote into the receiver's tensors before it landed them"
    for got, want in zip(states[2], states[0]):
        assert torch.equal(got.detach().view(-1).view(torch.uint8), want.detach().view(-1).view(torch.uint8))
    assert [t._version for t in states[2]] == versions
    assert seen["bytes"] == sum(t.numel() * t.element_size() for t in states[0])
