"""The bound on a sharded checkpoint's ``dcp/metadata.json``: read, and written.

Parsing it takes about 9 times its size in memory on every worker of the host that loads (see
``cloud_elastic/checkpoint/dcp.py``), so a larger one is refused before it is read; and a model whose
metadata would be larger is not checkpointed at all, rather than into checkpoints no load reads.
"""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import torch

from cloud_elastic.checkpoint import dcp
from cloud_elastic.checkpoint.store import CheckpointStore
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx, _state, _train, _values
from tests.unit.test_sharded_checkpoint_hostile import _two_checkpoints

pytestmark = pytest.mark.timeout(90)


def test_a_metadata_json_just_over_the_bound_is_refused_in_one_line_unparsed_and_the_previous_one_loads(
        tmp_path, caplog, monkeypatch):
    at_2, newest, _ = _two_checkpoints(tmp_path)
    path = newest / "dcp" / "metadata.json"
    # Still valid metadata (JSON allows the trailing spaces), one byte over 64 MiB, its digest fixed.
    over = (64 << 20) + 1
    path.write_bytes(path.read_bytes().ljust(over))
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["shards"]["files"]["metadata.json"] = over
    manifest["shards"]["sha256"]["metadata.json"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (newest / "manifest.json").write_text(json.dumps(manifest))
    parsed: list[int] = []
    decode = dcp.decode_metadata
    monkeypatch.setattr(dcp, "decode_metadata", lambda body: parsed.append(len(body["storage"])) or decode(body))
    other = _state(seed=9)
    _train(other, 1)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 2
    assert all(torch.equal(a, b) for a, b in zip(_values(other), at_2))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and newest.name in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert "its metadata.json is 67,108,865 bytes, over the 67,108,864 a load reads" in warnings[0]
    assert len(parsed) == 1  # the previous checkpoint's only


def test_a_model_whose_metadata_would_be_over_the_bound_is_not_checkpointed_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(dcp, "_MAX_METADATA_BYTES", 2000)  # this small model's metadata is larger
    state, ctx = _state(), _ctx()
    durable = _checkpoints(tmp_path, ctx)
    _train(state, 1)
    why = durable.finish(state)
    assert why is not None and "\n" not in why, why
    assert why.startswith("the final checkpoint (step 1) was not written: ") and "cannot checkpoint this model: its " \
        "DCP metadata (" in why and "bytes as JSON, over the 2,000 a load reads" in why, why
    assert CheckpointStore(str(tmp_path / "ckpt")).list() == []  # nothing a restart would try and refuse
