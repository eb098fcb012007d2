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


def _tensors(seed: int, kind: str = "mixed") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if kind == "moments":  # Adam's: a parameter and its two moments, one message; each holder's piece spans two
        return [torch.nn.Parameter(torch.randn(100_003, generator=g)), torch.randn(100_003, generator=g),
                torch.rand(100_003, generator=g)]
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


def _shares(buf: torch.Tensor, tensors: list[torch.Tensor]) -> bool:
    return any(buf.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in tensors)


def _in_threads(monkeypatch, size: int, member, hung: str) -> None:
    """``member(rank, ctx)`` for each rank of a real Gloo group of ``size``, one thread each; fails if one raised."""
    for module in (heal_module, collectives):
        monkeypatch.setattr(module, "get_context", lambda: _CONTEXTS[threading.get_ident()])
    store, errors = dist.HashStore(), []

    def run(rank: int) -> None:
        try:
            group = dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=20))
            ctx = SimpleNamespace(info=SimpleNamespace(rank=rank, size=size), device=torch.device("cpu"),
                                  point_to_point=lambda what, start: start(group), wait=lambda work, what, **how: work.wait())
            _CONTEXTS[threading.get_ident()] = ctx
            member(rank, ctx)
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert not any(t.is_alive() for t in threads), hung
    assert not errors, errors


@pytest.mark.parametrize("kind", ["mixed", "moments"])
def test_pieces_posted_land_only_when_landed_bit_equal_and_without_a_version_bump(monkeypatch, kind):
    # ranks 0 and 1 hold the commit, rank 2 needs it
    states = {0: _tensors(0, kind), 1: _tensors(0, kind), 2: _tensors(1, kind)}
    before = [t.detach().clone() for t in states[2]]
    versions = [t._version for t in states[2]]
    seen: dict = {}
    sent = threading.Barrier(3)

    def member(rank: int, ctx) -> None:
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
            seen[f"copied by {rank}"] = sum(not _shares(buf, states[rank]) for buf in flight.kept)
            flight.land(ctx)  # the sends are done: its tensors may change now
            sent.wait(20)

    _in_threads(monkeypatch, 3, member, "the post or its landing hung")
    assert seen["untouched"], "a receive wrote into the receiver's tensors before it landed them"
    for got, want in zip(states[2], states[0]):
        assert torch.equal(got.detach().view(-1).view(torch.uint8), want.detach().view(-1).view(torch.uint8))
    assert [t._version for t in states[2]] == versions
    assert seen["bytes"] == sum(t.numel() * t.element_size() for t in states[0])
    # A holder sends its own memory where it can: the packed small tensors are one copy (rank 0's piece), a piece
    # spanning big parts of several tensors (a parameter's and its moment's) goes as those parts, copying nothing.
    assert (seen["copied by 0"], seen["copied by 1"]) == ((1, 0) if kind == "mixed" else (0, 0))


def test_a_whole_sync_of_pieces_spanning_several_tensors_lands_bit_equal(monkeypatch):
    # ranks 0 and 1 hold the commit; rank 2 needs the big tensors, rank 3 the small ones packed together
    states = {rank: _tensors(0 if rank < 2 else 1, "moments") for rank in range(3)}
    states[3] = _tensors(2, "mixed")
    mixed = {rank: _tensors(0, "mixed") for rank in range(2)}
    moved = {}

    def member(rank: int, ctx) -> None:
        heal = Heal([2, 3], 4, 5)
        heal.tensors(states[rank] if rank != 3 else _tensors(3, "moments"), "the commit")
        heal.tensors(mixed[rank] if rank < 2 else (states[3] if rank == 3 else _tensors(4, "mixed")), "more")
        moved[rank] = heal.bytes

    _in_threads(monkeypatch, 4, member, "the sync hung")
    for got, want in zip(states[2], states[0]):
        assert torch.equal(got.detach().view(torch.uint8), want.detach().view(torch.uint8))
    for got, want in zip(states[3], mixed[0]):
        assert torch.equal(got.detach().view(-1).view(torch.uint8), want.detach().reshape(-1).view(torch.uint8))
    total = sum(t.numel() * t.element_size() for t in states[0] + mixed[0])
    assert moved[2] == moved[3] == total and moved[0] + moved[1] == 2 * total
