"""Keep-K counts only checkpoints that verify: torn, tampered or newer-format checkpoints never push the last
readable one out, and nothing is pruned while the newest one (just written) or an older one cannot be checked."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from cloud_elastic.checkpoint import CheckpointStore
from cloud_elastic.checkpoint.backend import LocalBackend
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx, _state, _train

pytestmark = pytest.mark.timeout(60)


def _payload(step: int) -> dict:
    return {"w": torch.full((64,), float(step)), "step": step}


def _folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("ckpt-"))


def _damage(folder: Path, how: str) -> None:
    data, manifest = folder / "state.pt", folder / "manifest.json"
    if how == "torn_data":
        data.write_bytes(data.read_bytes()[:100])
    elif how == "missing_data":
        data.unlink()
    elif how == "torn_manifest":
        manifest.write_text('{"format": "cloud-elastic-checkpoint", "step": ')
    else:  # written by a newer cloud-elastic
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format_version": 99}))


@pytest.mark.parametrize("how", ["torn_data", "missing_data", "torn_manifest", "newer_format"])
def test_unreadable_newest_checkpoints_do_not_count_so_the_last_readable_one_is_resumed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str) -> None:
    store = CheckpointStore(str(tmp_path), keep=2)
    readable = store.save(1, _payload(1))
    second = store.save(2, _payload(2))
    _damage(tmp_path / second.name, how)  # a failed write that left a manifest, a tampered one, another version
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        third = store.save(3, _payload(3))
    kept = [r.getMessage() for r in caplog.records if "does not verify" in r.getMessage()]
    assert len(kept) == 1 and second.name in kept[0] and "\n" not in kept[0]
    _damage(tmp_path / third.name, how)  # and the newest is lost too (a crash the storage did not survive)

    # The start of a restarted job: the readable checkpoint of step 1 was never pruned, and is resumed.
    fresh = CheckpointStore(str(tmp_path), keep=2)
    assert readable.name in _folders(tmp_path)
    latest = fresh.latest()
    assert latest is not None and latest.info.name == readable.name
    assert torch.equal(latest.payload["w"], _payload(1)["w"])


def test_damaged_checkpoints_are_warned_about_once_and_go_once_keep_readable_ones_are_newer(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(str(tmp_path), keep=3)
    first = store.save(1, _payload(1))
    damaged = store.save(2, _payload(2))
    _damage(tmp_path / damaged.name, "torn_data")
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        newer = [store.save(step, _payload(step)).name for step in (3, 4)]
    assert _folders(tmp_path) == [first.name, damaged.name, *newer]
    assert len([r for r in caplog.records if "does not verify" in r.getMessage()]) == 1
    newer.append(store.save(5, _payload(5)).name)
    assert _folders(tmp_path) == newer  # the store does not grow without bound
    assert [info.step for info in store.list()] == [5, 4, 3]


class _LosingBackend(LocalBackend):
    """Storage that loses the data of the checkpoint of one step right after its manifest is published."""

    def __init__(self, root: str, lose_step: int) -> None:
        super().__init__(root)
        self.lose = f"-step{lose_step:012d}/manifest.json"

    def write(self, path, produce) -> None:
        super().write(path, produce)
        if path.endswith(self.lose):
            data = Path(self.url(path.rsplit("/", 1)[0])) / "state.pt"
            data.write_bytes(data.read_bytes()[:10])


def test_nothing_is_pruned_while_the_checkpoint_just_written_does_not_verify(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(str(tmp_path), keep=1, backend=_LosingBackend(str(tmp_path), lose_step=2))
    first = store.save(1, _payload(1))
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        lost = store.save(2, _payload(2))
    assert any(lost.name in r.getMessage() and "deleting no older checkpoint" in r.getMessage()
               for r in caplog.records)
    assert _folders(tmp_path) == [first.name, lost.name]
    assert store.latest().info.name == first.name


class _FailingReads(LocalBackend):
    """Storage that refuses to read one checkpoint's manifest (permissions, a network error)."""

    failing: str = ""

    def read(self, path, limit=None):
        if self.failing and path == f"{self.failing}/manifest.json":
            raise PermissionError(13, "Permission denied")
        return super().read(path, limit)


def test_a_checkpoint_the_storage_will_not_let_us_check_stops_the_pruning_there(tmp_path: Path) -> None:
    backend = _FailingReads(str(tmp_path))
    store = CheckpointStore(str(tmp_path), keep=2, backend=backend)
    first = store.save(1, _payload(1))
    second = store.save(2, _payload(2))
    backend.failing = second.name  # whether it would count is unknown: the older one must stay
    third = store.save(3, _payload(3))
    assert _folders(tmp_path) == [first.name, second.name, third.name]
    backend.failing = ""
    fourth = store.save(4, _payload(4))
    assert _folders(tmp_path) == [third.name, fourth.name]


def test_a_sharded_checkpoint_whose_shard_files_are_lost_does_not_count_so_the_last_readable_one_is_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Mutation review: pruning checks a sharded checkpoint's shard files against the sizes its manifest lists,
    and no test noticed when it did not (every damaged-shard test keeps the sizes). Step 4's shard files are lost
    (a torn upload, a bad disk) with its manifest intact: saving step 6 must keep step 2, the last checkpoint that
    loads, and say in one line that step 4 does not verify."""
    state, ctx = _state(), _ctx()
    durable = _checkpoints(tmp_path, ctx)  # keep=2
    root = tmp_path / "ckpt"

    def save(seq: int) -> str:
        _train(state, 2)
        ctx.ledger.commit_seq = seq
        assert durable.finish(state) is None
        return _folders(root)[-1]

    step_2, step_4 = save(2), save(4)
    for shard in (root / step_4 / "dcp").glob("*.distcp"):
        shard.unlink()
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        step_6 = save(6)
    assert _folders(root) == [step_2, step_4, step_6]
    warned = [r.getMessage() for r in caplog.records if "does not verify" in r.getMessage()]
    assert len(warned) == 1 and step_4 in warned[0] and "shard files" in warned[0] and "\n" not in warned[0], warned
