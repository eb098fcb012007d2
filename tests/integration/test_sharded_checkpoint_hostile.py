"""A sharded checkpoint (``hvd.shard``, torch DCP) that storage corrupted or an attacker changed, resumed by a real
job whose host holds two workers: they agree to fall back to the previous checkpoint, and no pickle runs.

The first job writes checkpoints (one DCP file per worker). Then, in its final checkpoint, bytes of
worker 1's file are flipped (same size, manifest untouched: only worker 1 reads that file, so
worker 0 learns of it through DCP) and a pickle that would create a marker file replaces DCP's
``.metadata`` (its size fixed in the manifest). The second job resumes: from the checkpoint
before, with the state the first job committed at that step; the marker never appears.
Before: the flipped bytes loaded "successfully" and the pickle ran.
"""

from __future__ import annotations

import json
import pickle
import sys

import pytest

from tests.integration.harness import REPO
from tests.unit.test_sharded_checkpoint_hostile import tamper_metadata

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PROBE = REPO / "tests" / "integration" / "shard_probe.py"


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def _args(ckpt, steps: int) -> list[str]:
    return ["run", "-np", "2", "--min-np", "2", "--slots-per-host", "2", "--whole-hosts", "-H", "127.0.0.1:2",
            "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0.3", "--checkpoint-keep", "2",
            sys.executable, str(PROBE), "--steps", str(steps), "--step-sleep", "0.1", "--full-checksum"]


def test_a_corrupt_shard_of_one_worker_makes_the_whole_host_fall_back_and_no_pickle_runs(jobs, tmp_path):
    ckpt, marker = tmp_path / "ckpt", tmp_path / "ran"
    first = jobs(_args(ckpt, 8))
    assert first.finish(timeout=150) == 0, first.output()
    previous, final = sorted(p for p in ckpt.iterdir() if p.name.startswith("ckpt-"))[-2:]
    at = json.loads((previous / "manifest.json").read_text())["step"]
    assert json.loads((final / "manifest.json").read_text())["step"] == 8 and at < 8
    committed = {e["full"] for e in first.of("commit") if e["step"] == at}
    assert len(committed) == 1

    shard = final / "dcp" / "__1_0.distcp"
    raw = bytearray(shard.read_bytes())
    middle = len(raw) // 2
    raw[middle:middle + 16] = bytes(b ^ 0xFF for b in raw[middle:middle + 16])
    shard.write_bytes(bytes(raw))
    evil = pickle.dumps(_RunsCode(str(marker)))
    (final / "dcp" / ".metadata").write_bytes(evil)
    manifest = json.loads((final / "manifest.json").read_text())
    manifest["shards"]["files"][".metadata"] = len(evil)
    (final / "manifest.json").write_text(json.dumps(manifest))

    second = jobs(_args(ckpt, 10))
    code = second.finish(timeout=150)
    assert not marker.exists(), "a pickle from the checkpoint ran"
    assert code == 0, second.output()
    out = second.output()
    unusable = [line for line in second.lines if final.name in line and "is unusable" in line]
    assert len(unusable) == 2 and all("__1_0.distcp does not match the size and SHA-256 digest" in line
                                      for line in unusable), out  # each worker of the host, the same reason
    entered = second.of("entered")
    assert len(entered) == 2 and {(e["step"], e["full"]) for e in entered} == {(at, committed.pop())}, entered
    assert {e["step"] for e in second.of("done")} == {10}
    assert "Traceback" not in out, out  # one line per worker, not DCP's error reports


def _no_bytes(metadata: dict) -> None:
    metadata["items"]["model.extra"] = {"kind": "bytes"}


def _bytes_of_its_own(metadata: dict) -> None:
    """``optimizer.param_groups.0.maximize`` (AdamW fills it in when a checkpoint lacks it) renamed, its storage
    entry too: an item with bytes of its own, which no check of the layout can tell from another model's."""
    metadata["items"]["model.extra"] = metadata["items"].pop("optimizer.param_groups.0.maximize")
    next(e for e in metadata["storage"] if e["fqn"] == "optimizer.param_groups.0.maximize")["fqn"] = "model.extra"


_FORGED_ITEMS = {  # how each skipped checkpoint is named, on both workers
    "no bytes": (_no_bytes, "is unusable", "item 'model.extra': a non-tensor item without a storage entry"),
    "bytes of its own": (_bytes_of_its_own, "does not fit this training state (Unexpected key in checkpoint: "
                         "model.extra), but the one of step", "resuming from it"),
}


@pytest.mark.parametrize("forged", list(_FORGED_ITEMS), ids=list(_FORGED_ITEMS))
def test_an_item_forged_into_the_metadata_falls_back_and_a_fitting_resume_trains_on(jobs, tmp_path, forged):
    """Review rvH2's side note: one more non-tensor item in ``dcp/metadata.json`` (``{"kind": "bytes"}``, no bytes
    stored for it: DCP never writes one), its digest fixed in the manifest. Before: the job ended as "does not fit
    this training state" (another model), though nothing fit less than the previous, intact checkpoint. The same
    for an item with bytes of its own (fixC3), which looks exactly like another model's: the previous checkpoint
    fits, so the newest was changed after it was written."""
    tamper, skipped, why = _FORGED_ITEMS[forged]
    ckpt = tmp_path / "ckpt"
    first = jobs(_args(ckpt, 6))
    assert first.finish(timeout=150) == 0, first.output()
    previous, final = sorted(p for p in ckpt.iterdir() if p.name.startswith("ckpt-"))[-2:]
    at = json.loads((previous / "manifest.json").read_text())["step"]
    committed = {e["full"] for e in first.of("commit") if e["step"] == at}
    assert len(committed) == 1 and at < 6

    tamper_metadata(final, tamper)

    second = jobs(_args(ckpt, 7))
    code = second.finish(timeout=150)
    out = second.output()
    assert code == 0 and "resume with the same model" not in out, out
    named = [line for line in second.lines if (final.name in line or "(commit #" in line) and skipped in line]
    assert len(named) == 2 and all(why in line for line in named), out
    entered = second.of("entered")
    assert len(entered) == 2 and {(e["step"], e["full"]) for e in entered} == {(at, committed.pop())}, entered
    assert {e["step"] for e in second.of("done")} == {7}
