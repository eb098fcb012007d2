"""CheckpointStore on a local directory: round trip, manifest, keep-K, torn checkpoints, refusals, job record."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from cloud_elastic.checkpoint import (
    CheckpointError,
    CheckpointStore,
    DurableJobRecord,
    check_payload,
    read_job_record,
    write_job_record,
)
from cloud_elastic.errors import CloudElasticError, ConfigError

pytestmark = pytest.mark.timeout(60)


def _payload(step: int) -> dict:
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    return {"model": model.state_dict(), "epoch": step // 10, "name": f"run-{step}", "lr": 0.1, "tags": {"a", "b"}}


def _folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("ckpt-"))


def test_save_then_latest_round_trips_the_payload_and_records_the_manifest(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    assert store.latest() is None
    payload = _payload(7)
    info = store.save(7, payload, {"epoch": 0, "world_size": 4, "job_id": "job-1", "loss": 0.25})

    latest = store.latest()
    assert latest is not None and latest.info == info
    assert latest.payload.keys() == payload.keys()
    for key, value in payload["model"].items():
        assert torch.equal(latest.payload["model"][key], value)
    assert latest.payload["model"]._metadata == payload["model"]._metadata  # module versions survive
    assert {k: latest.payload[k] for k in ("epoch", "name", "lr", "tags")} == {
        k: payload[k] for k in ("epoch", "name", "lr", "tags")}

    data = (tmp_path / info.name / "state.pt").read_bytes()
    manifest = json.loads((tmp_path / info.name / "manifest.json").read_text())
    assert manifest["step"] == 7 and manifest["epoch"] == 0 and manifest["world_size"] == 4
    assert manifest["job_id"] == "job-1" and manifest["extra"] == {"loss": 0.25}
    assert manifest["format_version"] == 1 and manifest["created_utc"].endswith("Z")
    assert manifest["data"] == {"name": "state.pt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    # The data is plain torch.save output: loadable by torch alone, without running code.
    assert torch.equal(torch.load(tmp_path / info.name / "state.pt", weights_only=True)["model"]["0.weight"],
                       payload["model"]["0.weight"])
    assert not [p for p in (tmp_path / info.name).iterdir() if p.name.startswith(".")], "temporary files left"


def test_a_missing_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert CheckpointStore(str(tmp_path / "not" / "yet")).latest() is None


def test_keeps_the_newest_k_and_deletes_older_ones(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path), keep=2)
    for step in range(5):
        store.save(step * 100, _payload(step))
    assert len(_folders(tmp_path)) == 2
    assert [info.step for info in store.list()] == [400, 300]
    assert store.latest().info.step == 400

    one = CheckpointStore(str(tmp_path / "one"), keep=1)
    for step in range(3):
        one.save(step, _payload(step))
    assert [info.step for info in one.list()] == [2]


def test_keep_counts_complete_checkpoints_and_clears_interrupted_writes(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path), keep=2)
    store.save(1, _payload(1))
    second = store.save(2, _payload(2))
    (tmp_path / second.name / "manifest.json").unlink()  # its writer died before the manifest, or is still at it
    store.save(3, _payload(3))
    # The folder without a manifest does not count as one of the two kept; while a writer (another host's: no
    # lock tells) could still be between its data and its manifest, it stays.
    assert [info.step for info in store.list()] == [3, 1]
    assert second.name in _folders(tmp_path)
    # Nothing in it changed for longer than any write takes (by the files' times): an interrupted write, which
    # the next save deletes.
    folder = tmp_path / second.name
    for path in [*folder.iterdir(), folder]:
        os.utime(path, (0, 0))
    store.save(4, _payload(4))
    assert [info.step for info in store.list()] == [4, 3]
    assert second.name not in _folders(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_data", "garbage_manifest", "newer_format"])
def test_a_torn_or_corrupt_latest_falls_back_to_the_previous_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    store = CheckpointStore(str(tmp_path), keep=3)
    store.save(10, _payload(10))
    newest = store.save(20, _payload(20))
    folder = tmp_path / newest.name
    data = folder / "state.pt"
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:100])
    elif damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "delete_data":
        data.unlink()
    elif damage == "garbage_manifest":
        (folder / "manifest.json").write_text('{"format": "cloud-elastic-checkpoint", "step": ')
    else:
        manifest = json.loads((folder / "manifest.json").read_text())
        (folder / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))

    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        latest = store.latest()
    assert latest is not None and latest.info.step == 10
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and newest.name in warnings[0] and "falling back" in warnings[0]
    assert "\n" not in warnings[0]


def test_a_checkpoint_without_manifest_is_skipped_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(str(tmp_path))
    store.save(1, _payload(1))
    partial = store.save(2, _payload(2))
    (tmp_path / partial.name / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        assert store.latest().info.step == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_every_checkpoint_unusable_means_none(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    info = store.save(1, _payload(1))
    (tmp_path / info.name / "state.pt").write_bytes(b"not a checkpoint")
    assert store.latest() is None


class _Boom:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_weights_only_refuses_a_checkpoint_that_would_run_code(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(str(tmp_path), keep=3)
    store.save(1, _payload(1))
    newest = store.save(2, _payload(2))
    # Replace the newest data by a pickle with code and fix up the digest, as an attacker with write access would.
    marker = tmp_path / "code-ran"
    evil = pickle.dumps({"model": _Boom(str(marker))}, protocol=2)
    evil_path = tmp_path / "evil.pt"
    torch.save({"model": _Boom(str(marker))}, evil_path)
    # A bare pickle is refused before torch.load (not a torch.save archive), an archive by weights_only.
    for raw, reason in ((evil, "not a zip archive"), (evil_path.read_bytes(), "weights_only")):
        (tmp_path / newest.name / "state.pt").write_bytes(raw)
        manifest = json.loads((tmp_path / newest.name / "manifest.json").read_text())
        manifest["data"].update(size=len(raw), sha256=hashlib.sha256(raw).hexdigest())
        (tmp_path / newest.name / "manifest.json").write_text(json.dumps(manifest))
        with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
            assert store.latest().info.step == 1
        assert reason in caplog.records[-1].getMessage()
        with pytest.raises(CheckpointError, match=reason):
            store.load(store.list()[0])
        assert not marker.exists()


@pytest.mark.parametrize("bad,where", [
    (np.float64(0.5), "payload['loss']"),
    (object(), "payload['loss']"),
    (frozenset({1}), "payload['loss']"),
    ({"nested": [1, lambda: 0]}, "payload['loss']['nested'][1]"),
])
def test_a_payload_that_could_not_be_loaded_safely_is_refused_before_writing(
    tmp_path: Path, bad: object, where: str
) -> None:
    store = CheckpointStore(str(tmp_path))
    store.save(1, _payload(1))
    with pytest.raises(CheckpointError) as caught:
        store.save(2, {"model": _payload(2)["model"], "loss": bad})
    message = str(caught.value)
    assert where in message and "plain data" in message and "\n" not in message
    assert isinstance(caught.value, CloudElasticError)
    assert [info.step for info in store.list()] == [1]
    with pytest.raises(CheckpointError):
        check_payload({"loss": bad})


def test_a_new_checkpoint_sorts_after_one_written_by_a_clock_ahead(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path), keep=5)
    first = store.save(1, _payload(1))
    ahead = first.name.replace(first.name[5:9], "2099")  # written by a host whose clock is far ahead
    os.rename(tmp_path / first.name, tmp_path / ahead)
    CheckpointStore(str(tmp_path), keep=5).save(2, _payload(2))
    assert [info.step for info in CheckpointStore(str(tmp_path)).list()] == [2, 1]


def test_storage_failure_is_one_clear_error_and_keeps_the_previous(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    store.save(1, _payload(1))
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(CheckpointError, match="could not write checkpoint") as caught:
        CheckpointStore(str(blocker)).save(2, _payload(2))
    assert "\n" not in str(caught.value)
    assert store.latest().info.step == 1


def test_invalid_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="keeps at least 1"):
        CheckpointStore(str(tmp_path), keep=0)
    with pytest.raises(CheckpointError, match="storage options"):
        CheckpointStore(str(tmp_path), storage_options={"anon": True})
    with pytest.raises(CheckpointError, match="JSON"):
        CheckpointStore(str(tmp_path)).save(1, _payload(1), {"when": object()})


def test_job_record_round_trips_and_never_holds_the_secret(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    assert read_job_record(store) is None
    record = DurableJobRecord(job_id="job-42", command=("python", "train.py", "--lr", "0.1"), created=1700000000.5,
                       extra={"min_np": 2, "driver_address": "10.0.0.4:29400"})
    write_job_record(store, record)
    assert read_job_record(store) == record
    assert store.latest() is None  # the record is not a checkpoint

    with pytest.raises(CheckpointError, match="in clear"):
        write_job_record(store, DurableJobRecord("job-42", ("python",), 1.0, extra={"job_secret": "abc"}))
    assert read_job_record(store) == record

    (tmp_path / "job.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        read_job_record(store)


@pytest.mark.parametrize("url,package,extra", [
    ("s3://bucket/jobs/a", "s3fs", "aws"),
    ("gs://bucket/jobs/a", "gcsfs", "gcp"),
    ("az://container/jobs/a", "adlfs", "azure"),
    ("abfs://container/jobs/a", "adlfs", "azure"),
])
def test_a_missing_fsspec_implementation_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, url: str, package: str, extra: str
) -> None:
    import importlib.util
    import sys

    if importlib.util.find_spec(package) is not None:
        monkeypatch.setitem(sys.modules, package, None)  # how Python spells "not installed"
    with pytest.raises(CheckpointError) as caught:
        CheckpointStore(url)
    assert str(caught.value) == (
        f"checkpoint URL {url!r} needs the {package!r} package; install it with: pip install 'cloud-elastic[{extra}]'"
    )
    assert isinstance(caught.value, ConfigError)  # a bad --checkpoint-dir is a configuration error (exit code 2)
