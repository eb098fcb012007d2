"""worker/comm/statecodec.py: what sync() receives can build values, never run code."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from cloud_elastic.errors import CloudElasticError
from cloud_elastic.worker.comm import statecodec
pytestmark = pytest.mark.timeout(30)


class _Custom:
    pass


def _round_trip(obj):
    return statecodec.decode(statecodec.encode(obj, "state"), "state")


def test_plain_state_round_trips():
    obj = {"epoch": 3, "lr": 0.1, "name": "x", "seen": {1, 2}, "frozen": frozenset({3}), "pair": (1, None),
           "raw": b"\x00", "order": OrderedDict(a=1), "t": torch.arange(4), "dtype": torch.float16}
    out = _round_trip(obj)
    assert {k: v for k, v in out.items() if k != "t"} == {k: v for k, v in obj.items() if k != "t"}
    assert torch.equal(out["t"], obj["t"])


def test_an_object_only_pickle_can_carry_is_refused_before_sending_with_a_remedy():
    with pytest.raises(statecodec.StateSyncError, match=r"_Custom.*add_safe_globals") as info:
        statecodec.encode({"x": _Custom()}, "ObjectState attributes")
    assert isinstance(info.value, CloudElasticError)
    assert "ObjectState attributes" in str(info.value)


def test_parts_sent_as_one_name_the_part_that_cannot_be_synced():
    parts = statecodec.Parts({"sampler state": {"epoch": 1}, "ObjectState attributes": {"x": _Custom()}})
    with pytest.raises(statecodec.StateSyncError, match=r"^ObjectState attributes cannot be synced safely.*_Custom"):
        statecodec.encode(parts, "state attributes")
    ok = statecodec.Parts({"sampler state": {"epoch": 1}, "ObjectState attributes": {"x": 2}})
    assert statecodec.decode(statecodec.encode(ok, "state attributes"), "state attributes") == dict(ok)


def test_rank_0s_check_of_its_own_aliased_attribute_blames_the_state_not_the_network():
    # ``[row] * n`` pickles once and costs n copies when a receiver loads it: every receiver refuses it, and rank 0,
    # checking the same bytes, says it is its own state (review s66 rvT F4: "corrupt or forged" blamed the network).
    row = list(range(2000))
    parts = statecodec.Parts({"ObjectState attributes": {"table": [row] * 4000}})
    data = statecodec.encode(parts, "state attributes", check=False)
    with pytest.raises(statecodec.StateSyncError, match="corrupt or forged"):
        statecodec.decode(data, "state attributes")  # a receiver cannot tell
    refused = statecodec.refusal(parts, data, "state attributes")
    assert refused is not None and "forged" not in str(refused), refused
    assert re.search(r"rank 0's own state.*referenced over and over.*\['table'\]", str(refused)), refused


def test_a_crafted_payload_does_not_run_code(tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for payload in (pickle.dumps(Exploit()), _torch_saved(Exploit())):
        with pytest.raises(statecodec.StateSyncError):
            statecodec.decode(payload, "sampler state")
    assert not marker.exists()


def _torch_saved(obj) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# --- the torch floor: weights_only loading is only trusted on a torch without known bypasses ---


@pytest.mark.parametrize("version", ["2.1.0", "2.5.1+cu121", "2.9.1", "1.13.1", "garbage"])
def test_a_torch_whose_weights_only_can_be_bypassed_is_refused(version):
    with pytest.raises(ImportError, match=rf"needs torch >= 2\.10, .*this is torch {re.escape(version)}"):
        statecodec.check_torch_version(version)


@pytest.mark.parametrize("version", ["2.10.0", "2.11.0+cu130", "2.13.0+cpu", "2.14.0a0+git1234", "3.0.0"])
def test_a_torch_at_or_above_the_floor_is_accepted(version):
    statecodec.check_torch_version(version)


def test_the_package_requires_the_same_torch_floor():
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    floor = ".".join(map(str, statecodec.MIN_TORCH))
    # The run-time check compares the release's first two numbers, so 2.10's pre-releases (NVIDIA's images) pass.
    assert f'"torch>={floor}"' in pyproject or f'"torch>={floor}.0a0"' in pyproject


@pytest.mark.timeout(90)  # a fresh interpreter importing torch: over 30 s twice in loaded clean-clone runs (load 14-25)
def test_a_worker_refuses_to_start_on_an_old_torch():
    # A real interpreter whose torch reports an old release imports the worker API.
    code = "import torch; torch.__version__ = '2.5.1'; import cloud_elastic.torch"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=80)
    assert proc.returncode != 0
    assert "ImportError: cloud-elastic needs torch >= 2.10" in proc.stderr
    assert "this is torch 2.5.1" in proc.stderr
