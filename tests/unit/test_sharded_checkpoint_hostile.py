"""Sharded checkpoints (``hvd.shard``, torch DCP) from storage an attacker or a bad disk changed.

One worker in one process, as in ``test_sharded_checkpoint.py``, over real files. The malicious
pickles are real: unpickled by a full unpickler, their ``__reduce__`` creates a marker file,
which must never appear. Several workers of a host agreeing to fall back are
``tests/integration/test_sharded_checkpoint_hostile.py``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
from pathlib import Path

import pytest
import torch

from cloud_elastic.errors import CheckpointError
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx, _job_store, _state, _train, _values

pytestmark = pytest.mark.timeout(90)


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _two_checkpoints(tmp_path: Path):
    """Checkpoints of steps 2 and 4; (the values at step 2, the newest folder)."""
    state, ctx = _state(), _ctx()
    durable = _checkpoints(tmp_path, ctx)
    _train(state, 2)
    ctx.ledger.commit_seq = 2
    assert durable.finish(state) is None
    at_2 = _values(state)
    _train(state, 2)
    ctx.ledger.commit_seq = 4
    assert durable.finish(state) is None
    newest = sorted(p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-"))[-1]
    return at_2, newest, _values(state)


def _item(folder: Path, fqn: str):
    """(file, offset, length) of a DCP item, read from DCP's own metadata while it is still the one we wrote."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(folder / "dcp")).read_metadata()
    [(index, info)] = [(i, s) for i, s in metadata.storage_data.items() if i.fqn == fqn]
    return folder / "dcp" / info.relative_path, info.offset, info.length


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    size = len(raw)
    raw[offset:offset + len(data)] = data
    assert len(raw) == size
    path.write_bytes(bytes(raw))


def _padded(archive: bytes, length: int) -> bytes:
    """A zip ``archive`` made ``length`` bytes long by its comment, to take an item's place in a shard exactly."""
    import zipfile

    def commented(comment: bytes) -> bytes:  # zipfile rewrites the directory as it adds it
        out = io.BytesIO(archive)
        with zipfile.ZipFile(out, "a") as zf:
            zf.comment = comment
        return out.getvalue()

    padded = commented(b" " * (length - len(commented(b"-"))) + b"-")
    assert len(padded) == length
    return padded


def _load(tmp_path: Path, caplog) -> tuple[object, list[torch.Tensor], list[str]]:
    other = _state(seed=9)
    _train(other, 1)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        loaded = _checkpoints(tmp_path, _ctx()).load_latest(other)
    return loaded, _values(other), [r.getMessage() for r in caplog.records
                                    if r.levelno >= logging.WARNING and r.name.startswith("cloud_elastic")]


def test_a_pickle_put_in_place_of_dcp_metadata_never_runs(tmp_path, caplog):
    """Before: resuming unpickled dcp/.metadata, and the command ran. Its size (and digest) fixed in the manifest, as
    the issue's attacker did: nothing reads .metadata any more, so the checkpoint loads from its JSON metadata."""
    _, newest, at_4 = _two_checkpoints(tmp_path)
    marker = tmp_path / "ran"
    evil = pickle.dumps(_RunsCode(marker))
    (newest / "dcp" / ".metadata").write_bytes(evil)
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["shards"]["files"][".metadata"] = len(evil)
    if "sha256" in manifest["shards"]:
        manifest["shards"]["sha256"][".metadata"] = hashlib.sha256(evil).hexdigest()
    (newest / "manifest.json").write_text(json.dumps(manifest))
    try:
        loaded, values, _ = _load(tmp_path, caplog)
    finally:
        assert not marker.exists(), "the pickle in .metadata ran"
    assert loaded.step == 4 and all(torch.equal(a, b) for a, b in zip(values, at_4))


def test_a_pickle_written_over_an_optimizer_item_in_a_shard_never_runs_and_the_previous_checkpoint_loads(
        tmp_path, caplog):
    """Before: DCP's planner read optimizer.param_groups.0.lr with torch.load(weights_only=False), and the command
    ran; the manifest, which checked sizes only, was left alone."""
    at_2, newest, _ = _two_checkpoints(tmp_path)
    marker = tmp_path / "ran"
    path, offset, length = _item(newest, "optimizer.param_groups.0.lr")
    evil = pickle.dumps(_RunsCode(marker))
    assert len(evil) <= length
    _overwrite(path, offset, evil)
    try:
        loaded, values, warnings = _load(tmp_path, caplog)
    finally:
        assert not marker.exists(), "the pickle in the shard ran"
    assert loaded.step == 2 and all(torch.equal(a, b) for a, b in zip(values, at_2))
    warning = next(w for w in warnings if newest.name in w)
    assert "does not match the size and SHA-256 digest in its manifest" in warning and "falling back" in warning


@pytest.mark.parametrize("fqn", ["optimizer.param_groups.0.lr", "model.0.weight"])
def test_a_pickle_in_an_item_with_the_manifest_rewritten_to_match_is_refused_by_weights_only(tmp_path, caplog, fqn):
    """An attacker who also rewrites manifest.json passes the digests; the item is still read with
    torch.load(weights_only=True), so it is refused, and the previous checkpoint loads. A tensor item is read by
    DCP itself: its refusal stopped the job ("could not load the shards", with torch's advice to load it with
    weights_only=False) though step 2 was intact (review h33)."""
    at_2, newest, _ = _two_checkpoints(tmp_path)
    marker = tmp_path / "ran"
    path, offset, length = _item(newest, fqn)
    evil = io.BytesIO()
    torch.save(_RunsCode(marker), evil)  # an archive: a bare pickle is refused before it reaches torch.load
    _overwrite(path, offset, _padded(evil.getvalue(), length))
    manifest = json.loads((newest / "manifest.json").read_text())
    if "sha256" in manifest["shards"]:
        manifest["shards"]["sha256"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (newest / "manifest.json").write_text(json.dumps(manifest))
    try:
        loaded, values, warnings = _load(tmp_path, caplog)
    finally:
        assert not marker.exists(), "the pickle in the shard ran"
    assert loaded.step == 2 and all(torch.equal(a, b) for a, b in zip(values, at_2))
    warning = next(w for w in warnings if newest.name in w)
    assert "weights_only=True" in warning and "weights_only=False" not in warning and "\n" not in warning


@pytest.mark.parametrize("damage", ["tensor data", "record header"])
def test_flipped_bytes_in_a_shard_fall_back_to_the_previous_checkpoint(tmp_path, caplog, damage):
    """Same size, manifest untouched. Before: flipped tensor data loaded "successfully" with the corrupted weights,
    and a damaged record (which DCP does detect) failed the load outright though step 2 was intact."""
    at_2, newest, at_4 = _two_checkpoints(tmp_path)
    shard = newest / "dcp" / "__0_0.distcp"
    raw = shard.read_bytes()
    if damage == "tensor data":
        offset = raw.index(at_4[0].detach().numpy().tobytes())  # the first weight shard's bytes as written
    else:
        _, offset, _ = _item(newest, "model.0.weight")  # the start of its torch.save archive: "PK\x03\x04"
    _overwrite(shard, offset, bytes(b ^ 0xFF for b in raw[offset:offset + 8]))
    loaded, values, warnings = _load(tmp_path, caplog)
    assert loaded.step == 2 and all(torch.equal(a, b) for a, b in zip(values, at_2))
    assert any(newest.name in w and "falling back to the previous one" in w for w in warnings), warnings


def test_a_compressed_tensor_item_with_the_manifest_rewritten_to_match_is_refused_unloaded(tmp_path, caplog):
    """A torch.save archive in a shard whose records are compressed (which torch.load inflates in memory: a small item
    could take gigabytes), padded to the item's length. Before: it loaded."""
    from tests.unit.test_checkpoint_hostile import deflated

    at_2, newest, at_4 = _two_checkpoints(tmp_path)
    path, offset, length = _item(newest, "model.0.weight")
    _overwrite(path, offset, _padded(deflated(at_4[0].detach().clone()), length))
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["shards"]["sha256"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (newest / "manifest.json").write_text(json.dumps(manifest))
    loaded, values, warnings = _load(tmp_path, caplog)
    assert loaded.step == 2 and all(torch.equal(a, b) for a, b in zip(values, at_2))
    warning = next(w for w in warnings if newest.name in w)
    assert f"of {path.name} holds a compressed record" in warning and "falling back" in warning, warning


def test_a_newest_checkpoint_whose_manifest_is_torn_is_passed_over_with_one_warning(tmp_path, caplog):
    """Found in review: a truncated manifest made the load pass over the newest checkpoint without a word, where a
    replica's load (``store.latest``) says so."""
    at_2, newest, _ = _two_checkpoints(tmp_path)
    manifest = newest / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    loaded, values, warnings = _load(tmp_path, caplog)
    assert loaded.step == 2 and all(torch.equal(a, b) for a, b in zip(values, at_2))
    [warning] = [w for w in warnings if newest.name in w]  # before the fix: none
    assert "unreadable manifest" in warning and "falling back to the previous one" in warning, warning


def test_when_every_sharded_checkpoint_is_corrupt_the_worker_refuses_to_train_from_initial_weights(tmp_path):
    _, newest, _ = _two_checkpoints(tmp_path)
    for folder in (tmp_path / "ckpt").glob("ckpt-*"):
        shard = folder / "dcp" / "__0_0.distcp"
        _overwrite(shard, 100, bytes(b ^ 0xFF for b in shard.read_bytes()[100:108]))
    other = _state(seed=9)
    with pytest.raises(CheckpointError, match=r"^no usable checkpoint in .*: its 2 sharded checkpoint\(s\) are "
                                              r"unusable$"):
        _checkpoints(tmp_path, _ctx()).load_latest(other)


def test_a_sharded_checkpoint_without_digests_is_never_loaded(tmp_path, caplog):
    """A manifest from before the digests: its shards would load only by unpickling .metadata."""
    _, newest, _ = _two_checkpoints(tmp_path)
    for folder in (tmp_path / "ckpt").glob("ckpt-*"):
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["shards"].pop("sha256", None)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        _load(tmp_path, caplog)
    assert any("no SHA-256 digests of its shard files" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("tamper,reason", [
    (lambda md: md["storage"][0].update(file="../../state.pt"), "is not DCP metadata: '../../state.pt' is not a plain"),
    (lambda md: md["storage"][0].update(file="__9_0.distcp"), "its shard file '__9_0.distcp' is not listed"),
    (lambda md: next(i for i in md["items"].values() if i["kind"] == "tensor").update(dtype="object"),
     "is not DCP metadata: item"),
    (lambda md: md.update(items=[]), "is not DCP metadata: expected an object"),
])
def test_dcp_metadata_json_rewritten_with_its_manifest_is_parsed_strictly_and_falls_back(tmp_path, caplog, tamper,
                                                                                         reason):
    """The JSON metadata that replaced DCP's pickle, tampered with and its digest fixed in the manifest: file names
    outside the listed ones and unknown dtypes are refused, and the previous checkpoint loads."""
    at_2, newest, _ = _two_checkpoints(tmp_path)
    tamper_metadata(newest, tamper)
    loaded, values, warnings = _load(tmp_path, caplog)
    assert loaded.step == 2 and all(torch.equal(a, b) for a, b in zip(values, at_2))
    warning = next(w for w in warnings if newest.name in w)
    assert reason in warning and "falling back to the previous one" in warning, warning


def test_over_fsspec_every_shard_file_is_digested_as_written_and_checked_before_reading(tmp_path, caplog):
    """The same writer and reader over an fsspec URL (fsspec's in-memory file system, as s3:// or gs:// would be)."""
    import uuid

    import fsspec

    from cloud_elastic.worker.durable.sharded import ShardedCheckpoints
    from cloud_elastic.worker.durable.rank_zero import DurableSettings

    url = f"memory://ce-{uuid.uuid4().hex}/ckpt"
    state, ctx = _state(), _ctx()
    durable = ShardedCheckpoints(DurableSettings(_job_store(url), keep=3), ctx)
    for step in (2, 4):
        _train(state, 2)
        ctx.ledger.commit_seq = step
        assert durable.finish(state) is None
        if step == 2:
            at_2 = _values(state)
    fs = fsspec.filesystem("memory")
    newest = sorted(p for p in fs.ls(url.removeprefix("memory:/"), detail=False) if "/ckpt-" in p)[-1]
    manifest = json.loads(fs.cat_file(f"{newest}/manifest.json"))
    shard = f"{newest}/dcp/__0_0.distcp"
    raw = bytearray(fs.cat_file(shard))
    assert manifest["shards"]["sha256"]["__0_0.distcp"] == hashlib.sha256(raw).hexdigest()
    raw[len(raw) // 2] ^= 0xFF
    fs.pipe_file(shard, bytes(raw))
    other = _state(seed=9)
    _train(other, 1)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        assert ShardedCheckpoints(DurableSettings(url), _ctx()).load_latest(other).step == 2
    assert all(torch.equal(a, b) for a, b in zip(_values(other), at_2))
    assert any("__0_0.distcp does not match" in r.getMessage() for r in caplog.records)


def tamper_metadata(checkpoint, tamper) -> None:
    """``tamper`` (called with the parsed ``dcp/metadata.json``) rewrites a sharded checkpoint's metadata, and its
    size and digest are fixed in the manifest: a tampering only a load's own checks can catch."""
    path = checkpoint / "dcp" / "metadata.json"
    metadata = json.loads(path.read_text())
    tamper(metadata)
    path.write_text(json.dumps(metadata))
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["shards"]["files"]["metadata.json"] = path.stat().st_size
    manifest["shards"]["sha256"]["metadata.json"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
