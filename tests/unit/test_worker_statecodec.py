"""worker/statecodec.py: what sync() receives can build values, never run code."""

from __future__ import annotations

import os
import pickle
from collections import OrderedDict

import pytest
import torch

from cloud_elastic.errors import CloudElasticError
from cloud_elastic.worker import statecodec

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
