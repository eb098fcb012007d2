"""What a state shares, a resume from the background writer's checkpoint shares too, as a rollback to the commit does.

The writer copies the payload before it returns (``stage_payload``). It used to copy every reference to a tensor into
a buffer of its own: ``state.pair = [t, t]`` came back from a resume as two tensors (a rollback keeps one), and
``[buf[:3], buf[3:], buf]`` as three unrelated ones, so the resumed job's in-place updates no longer reached the other
names: a silent difference from the job that never stopped. A tied embedding was written twice. Real checkpoints in a
temporary directory, written by a real ``CheckpointWriter`` and loaded by ``load_state_payload``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic.checkpoint import CheckpointStore, CheckpointWriter, load_state_payload, state_payload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(4096, 64)  # 1 MiB
        self.head = torch.nn.Linear(64, 4096, bias=False)
        self.head.weight = self.embed.weight


def _state(seed: int) -> hvd.elastic.TorchState:
    torch.manual_seed(seed)
    buf, t = torch.randn(6), torch.randn(3)
    return hvd.elastic.TorchState(_Tied(), pair=[t, t], views=[buf[:3], buf[3:], buf], step=0)


def _written(tmp_path: Path, states: list) -> list[Path]:
    """The state.pt of each of ``states``, submitted one after the other to one writer (each copy after the first
    reuses the buffers of the one before)."""
    store = CheckpointStore(str(tmp_path), keep=len(states))
    with CheckpointWriter(store) as writer:
        for step, state in enumerate(states, 1):
            assert writer.submit(step, state_payload(state))
            assert writer.wait(30)
    return [tmp_path / info.name / "state.pt" for info in reversed(store.list())]


def _resumed(path: Path) -> hvd.elastic.TorchState:
    resumed = _state(seed=99)
    load_state_payload(resumed, torch.load(path, weights_only=True))
    return resumed


def test_a_resume_shares_what_the_state_shared_and_a_tied_embedding_is_written_once(tmp_path: Path) -> None:
    state = _state(seed=0)
    state.commit()
    first, second = _written(tmp_path, [state, state])
    for path in (first, second):
        resumed = _resumed(path)
        assert resumed.pair[0] is resumed.pair[1]
        assert all(v.untyped_storage().data_ptr() == resumed.views[2].untyped_storage().data_ptr()
                   for v in resumed.views)
        for got, want in zip(resumed.pair + resumed.views, state.pair + state.views):
            assert torch.equal(got, want)
        resumed.pair[0].add_(1)  # the script updates one name in place: the other follows, as in the live state
        resumed.views[2].mul_(2)
        assert torch.equal(resumed.pair[1], state.pair[0] + 1)
        assert torch.equal(torch.cat(resumed.views[:2]), resumed.views[2])
        assert resumed.model.head.weight is resumed.model.embed.weight
        assert torch.equal(resumed.model.embed.weight, state.model.embed.weight)
        # The 1 MiB embedding under its two keys, once: before, 2 MiB.
        assert path.stat().st_size < 1.5 * state.model.embed.weight.numel() * 4, path.stat().st_size


def test_buffers_shared_in_the_previous_copy_are_not_written_twice_over_when_the_state_stops_sharing(tmp_path):
    """The second copy reuses the first's buffers, one of which the first's views shared: each is reused once."""
    state = _state(seed=0)
    state.commit()
    shared = _state(seed=1)
    apart = _state(seed=2)
    apart.views = [torch.randn(3), torch.randn(3), torch.randn(6)]  # same shapes, no storage shared now
    apart.pair = [torch.randn(3), torch.randn(3)]
    _, second = _written(tmp_path, [shared, apart])
    resumed = _resumed(second)
    for got, want in zip(resumed.pair + resumed.views, apart.pair + apart.views):
        assert torch.equal(got, want)
    assert resumed.pair[0] is not resumed.pair[1]


def test_two_small_views_of_a_big_buffer_are_written_each_on_its_own(tmp_path: Path) -> None:
    """Tying them would write the 16 MiB between them, which their own copies never held."""
    state = _state(seed=0)
    big = torch.zeros(4 << 20)
    state.views = [big[:3], big[-3:], torch.zeros(6)]
    (path,) = _written(tmp_path, [state])
    assert path.stat().st_size < 4 << 20, path.stat().st_size
    resumed = _resumed(path)
    assert torch.equal(resumed.views[1], big[-3:])


def test_a_view_that_repeats_one_buffer_is_written_whole_beside_the_buffer(tmp_path: Path) -> None:
    """``base[:1].expand(1000)`` shares ``base``'s storage, but a checkpoint holding it as a view of stride 0 would
    be refused by every load (and by the save's own check): it is copied on its own, as before."""
    state = _state(seed=0)
    base = torch.arange(4.0)
    state.views = [base, base[:1].expand(1000), base[1:]]
    (path,) = _written(tmp_path, [state])
    resumed = _resumed(path)
    assert torch.equal(resumed.views[1], torch.zeros(1000)) and resumed.views[1].stride() == (1,)
    assert resumed.views[2].untyped_storage().data_ptr() == resumed.views[0].untyped_storage().data_ptr()
