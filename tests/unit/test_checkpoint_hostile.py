"""Checkpoint folders the store does not own, and a tampered ``state.pt``: never followed, deleted or run.

Real files in a temporary directory; the malicious pickle is a real one whose ``__reduce__`` would
create a marker file, which must never appear.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from cloud_elastic.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(30)


class _RunsCode:
    """Unpickled by a full unpickler, this would create ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("ckpt-"))


@pytest.mark.parametrize("name", ["ckpt-99991231T235959999999Z-step000000000001",  # the end of time
                                  "ckpt-20261399T250000000000Z-step000000000001"])  # month 13: not a date
def test_a_folder_named_at_an_impossible_time_is_left_alone_and_saves_go_on(tmp_path: Path, name: str,
                                                                            caplog) -> None:
    """Before: every later save failed with "date value out of range" (or "unconverted data"), naming no folder."""
    (tmp_path / name).mkdir()
    store = CheckpointStore(str(tmp_path), keep=1)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint.store"):
        for step in (1, 2, 3):
            assert store.save(step, {"step": step}).step == step
    assert store.latest().payload == {"step": 3}
    assert name in _folders(tmp_path) and len(_folders(tmp_path)) == 2  # kept: not ours to delete
    warned = [r.getMessage() for r in caplog.records if "impossible time" in r.getMessage()]
    assert len(warned) == 1 and str(tmp_path / name) in warned[0], warned


def test_pruning_never_follows_a_symlink_named_like_a_checkpoint(tmp_path: Path) -> None:
    """Before: pruning deleted manifest.json inside the link's target."""
    other = CheckpointStore(str(tmp_path / "other"))
    theirs = other.save(7, {"step": 7})
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    link = store_dir / "ckpt-20000101T000000000000Z-step000000000007"
    link.symlink_to(tmp_path / "other" / theirs.name, target_is_directory=True)
    store = CheckpointStore(str(store_dir), keep=1)
    for step in (1, 2):
        store.save(step, {"step": step})
    assert (tmp_path / "other" / theirs.name / "manifest.json").exists()
    assert store.latest().payload == {"step": 2}
    os.unlink(tmp_path / "store" / store.list()[0].name / "manifest.json")
    assert store.list() == [] and store.latest() is None  # not loaded through the link either
    assert other.latest().payload == {"step": 7}
    assert link.is_symlink()  # left alone


def test_a_tampered_state_pt_is_refused_in_one_line_without_running_code_or_advising_weights_only_false(
        tmp_path: Path, caplog) -> None:
    """Its manifest rewritten to match, as an attacker who can write the storage would. Before: torch's text cut
    off at 160 characters, which read as advice to load it with weights_only=False."""
    store = CheckpointStore(str(tmp_path), keep=2)
    store.save(1, {"step": 1})
    newest = store.save(2, {"step": 2})
    marker = tmp_path / "marker"
    evil = tmp_path / newest.name / "state.pt"
    torch.save({"step": _RunsCode(marker)}, evil)
    manifest_path = tmp_path / newest.name / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    data = evil.read_bytes()
    manifest["data"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest_path.write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint.store"):
        latest = store.latest()
    assert latest.payload == {"step": 1}  # the previous checkpoint
    assert not marker.exists()
    [line] = [r.getMessage() for r in caplog.records if newest.name in r.getMessage()]
    assert "holds something other than tensors and plain data" in line and "refused it without running it" in line
    assert "posix.system" in line, line  # what was refused
    assert "weights_only` set to `False`" not in line and "weights_only=False" not in line, line
    assert "can still be loaded" not in line and "\n" not in line, line


def deflated(obj: object) -> bytes:
    """``obj`` as torch.save writes it, then its records compressed, which torch.load reads too."""
    import io
    import zipfile

    saved, out = io.BytesIO(), io.BytesIO()
    torch.save(obj, saved)
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(out, "w") as dst:
        for record in src.infolist():
            dst.writestr(record.filename, src.read(record), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return out.getvalue()


@pytest.mark.parametrize("archive", ["deflated", "legacy format"])
def test_a_state_pt_that_would_take_more_memory_than_its_size_is_passed_over_unloaded(tmp_path: Path, caplog,
                                                                                       archive: str) -> None:
    """Its manifest rewritten to match. Before: a 64 KiB deflated state.pt took 64 MiB to load (1,000 times its size:
    a 1 MB file took 1 GiB), and the legacy format allocates the sizes its header gives."""
    import io

    store, newest = _two_checkpoints(tmp_path)
    if archive == "deflated":
        data = deflated({"step": torch.zeros(64 << 20, dtype=torch.uint8)})
        assert len(data) < 1 << 20
    else:
        buf = io.BytesIO()
        torch.save({"step": 2}, buf, _use_new_zipfile_serialization=False)
        data = buf.getvalue()
    (newest / "state.pt").write_bytes(data)
    body = json.loads((newest / "manifest.json").read_text())
    body["data"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (newest / "manifest.json").write_text(json.dumps(body))
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint.store"):
        assert store.latest().payload == {"step": 1}
    [line] = [r.getMessage() for r in caplog.records if newest.name in r.getMessage()]
    reason = "holds a compressed record" if archive == "deflated" else "is not a zip archive (torch.save's format)"
    assert f"its state.pt {reason}" in line and "not loaded" in line and "\n" not in line, line


_BOUNDED_READER = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
from cloud_elastic.checkpoint import CheckpointStore
from cloud_elastic.checkpoint.alive import read_driver_alive
from cloud_elastic.checkpoint.store import read_job_record
from cloud_elastic.errors import CloudElasticError
store = CheckpointStore(sys.argv[1])
print("latest", store.latest().payload)
for read in (read_job_record, read_driver_alive):
    try:
        read(store)
    except CloudElasticError as exc:
        print("refused", exc)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("grown", ["manifest.json", "state.pt"])
def test_files_grown_huge_in_storage_are_refused_without_reading_them_into_memory(tmp_path: Path, grown: str) -> None:
    """A manifest, state.pt, job.json or driver-alive.json made 4 GiB (sparse) is never read whole.

    Before: each was read whole, so a reader under a 1.5 GiB address-space limit failed with MemoryError
    instead of falling back to the previous checkpoint.
    """
    import subprocess
    import sys

    store = CheckpointStore(str(tmp_path), keep=3)
    store.save(1, {"step": 1})
    newest = store.save(2, {"step": 2})
    for path in (tmp_path / newest.name / grown, tmp_path / "job.json", tmp_path / "driver-alive.json"):
        with open(path, "ab") as f:
            f.truncate(4 << 30)
    proc = subprocess.run([sys.executable, "-c", _BOUNDED_READER, str(tmp_path)], capture_output=True, text=True,
                          timeout=50)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "latest {'step': 1}"  # the grown checkpoint is skipped, the previous one loads
    assert len(lines) == 3 and all(line.startswith("refused ") and "more than 4,194,304 bytes" in line
                                   for line in lines[1:]), lines


def _two_checkpoints(tmp_path: Path) -> tuple[CheckpointStore, Path]:
    store = CheckpointStore(str(tmp_path), keep=3)
    store.save(1, {"step": 1})
    return store, tmp_path / store.save(2, {"step": 2}).name


@pytest.mark.timeout(30)
@pytest.mark.parametrize("tamper", ["manifest a FIFO", "data a link to /dev/zero", "step Infinity", "size 1e400",
                                    "format_version Infinity", "nested 100k deep"])
def test_a_newest_checkpoint_tampered_in_storage_is_passed_over_for_the_one_before(tmp_path: Path, tamper: str,
                                                                                   caplog) -> None:
    # Each once escaped as an exception (OverflowError, RecursionError), blocked the reader for good (a FIFO)
    # or read gigabytes (a link to /dev/zero whose manifest claims 3 GiB).
    store, newest = _two_checkpoints(tmp_path)
    manifest = newest / "manifest.json"
    body = json.loads(manifest.read_text())
    if tamper == "manifest a FIFO":
        manifest.unlink()
        os.mkfifo(manifest)
    elif tamper == "data a link to /dev/zero":
        (newest / "state.pt").unlink()
        (newest / "state.pt").symlink_to("/dev/zero")
        body["data"]["size"] = 3 << 30
        manifest.write_text(json.dumps(body))
    elif tamper == "nested 100k deep":
        manifest.write_text('{"format": "cloud-elastic-checkpoint", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        key, value = tamper.split(" ")
        (body["data"] if key == "size" else body)[key] = float("inf") if value == "Infinity" else 10**400
        manifest.write_text(json.dumps(body))
    with caplog.at_level(logging.WARNING):
        assert store.latest().payload == {"step": 1}
    if tamper != "data a link to /dev/zero":  # a listing reads manifests only
        assert [c.step for c in store.list()] == [1]
    assert "is unusable" in caplog.text and "falling back to the previous one" in caplog.text


def test_a_job_record_nested_beyond_pythons_limit_is_unreadable_in_one_line(tmp_path: Path) -> None:
    from cloud_elastic.checkpoint.api import CheckpointError
    from cloud_elastic.checkpoint.store import read_job_record

    (tmp_path / "job.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="the job record in .* is unreadable") as refused:
        read_job_record(CheckpointStore(str(tmp_path)))
    assert "\n" not in str(refused.value)
