"""statecodec: numpy numbers and numeric arrays travel in a sync (as Horovod's pickling carries them), rebuilt
from bytes and a dtype string, never from numpy's pickle reconstructors; what stays unsupported is refused at
``commit()``, naming the attribute, not at the first failure."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic.worker.comm import statecodec

pytestmark = pytest.mark.timeout(30)


def _round_trip(obj):
    return statecodec.decode(statecodec.encode(obj, "state"), "state")


@pytest.mark.parametrize("value", [
    np.float64(1.5), np.float32(-0.25), np.float16(3.0), np.int64(-3), np.longlong(7), np.int8(-1), np.uint8(255),
    np.uint64(2**64 - 1), np.bool_(True), np.complex128(1 - 2j), np.float64("nan"), np.longdouble(1) / 3,
], ids=repr)
def test_a_numpy_number_comes_back_of_the_same_type_and_value(value):
    out = _round_trip({"loss": value})["loss"]
    assert type(out) is type(value)
    assert out.tobytes() == value.tobytes()


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float32).reshape(2, 3), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    np.arange(4, dtype=">i4"), np.array(2.5), np.zeros((0, 3), dtype=np.int16), np.array([True, False]),
    np.arange(3, dtype=np.complex64),
], ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_a_numeric_array_comes_back_equal_with_its_dtype_and_shape_and_writable(array):
    out = _round_trip([array])[0]
    assert type(out) is np.ndarray
    assert (out.dtype, out.shape) == (array.dtype, array.shape)
    assert np.array_equal(out, array)
    out[...] = 0  # the receiver's own copy, not a view of the message


def test_numpy_values_inside_containers_and_as_keys_and_a_lookalike_tuple_round_trip():
    lookalike = (statecodec._TAG, "numpy", "O", None, "x")  # the user's own tuple that happens to start with the tag
    obj = {"counts": {np.int64(3): 2}, "history": [np.float32(0.5), (np.int32(1), "x")], "odd": lookalike,
           "plain": 1.0}
    out = _round_trip(obj)
    assert out == obj
    assert type(next(iter(out["counts"]))) is np.int64
    assert type(out["history"][1][0]) is np.int32
    assert out["odd"] == lookalike


def test_numpys_own_pickle_is_still_refused_on_receipt():
    buf = io.BytesIO()
    torch.save({"x": np.float64(1.0), "a": np.arange(2)}, buf)  # what a sender without the tagging would send
    with pytest.raises(statecodec.StateSyncError, match=r"cannot be synced safely \(Unsupported global: GLOBAL numpy"):
        statecodec.decode(buf.getvalue(), "state")


@pytest.mark.parametrize("tag", [
    ("numpy", "O", None, torch.zeros(8, dtype=torch.uint8)),  # an object dtype: would build objects
    ("numpy", "i4,f8", None, torch.zeros(12, dtype=torch.uint8)),  # a record
    ("numpy", "d", (2,), torch.zeros(8, dtype=torch.uint8)),  # bytes for one element, shape says two
    ("numpy", "d", (-1,), torch.zeros(8, dtype=torch.uint8)),
    ("numpy", "d", [1], torch.zeros(8, dtype=torch.uint8)),  # not a shape the sender writes
    ("numpy", "d", None, torch.zeros(8, dtype=torch.int8)),
    ("numpy", 5, None, torch.zeros(0, dtype=torch.uint8)),
    ("bogus",),
], ids=str)
def test_a_forged_tag_is_refused_in_one_line(tag):
    data = _saved({"x": (statecodec._TAG, *tag)})
    with pytest.raises(statecodec.StateSyncError, match=r"^state: received state has a malformed"):
        statecodec.decode(data, "state")


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# --- at commit ---


class _Opaque:
    pass


@pytest.mark.parametrize("value, where", [
    (_Opaque(), r"state\.extra holds a .*_Opaque, which"),
    ({"a": [1, np.datetime64("2020-01-01")]}, r"state\.extra holds a numpy\.datetime64 \(at state\.extra\['a'\]\[1\]\)"),
    (np.array([object()]), r"state\.extra holds a numpy\.ndarray"),
    (torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), r"state\.extra holds a torch\.optim\.sgd\.SGD"),
])
def test_an_attribute_a_sync_cannot_carry_is_refused_at_commit_naming_it(value, where):
    hvd.init()
    state = hvd.elastic.ObjectState(epoch=0, extra=None)
    state.extra = value
    with pytest.raises(hvd.StateSyncError, match=rf"^{where}.*add_safe_globals") as info:
        state.commit()
    assert "\n" not in str(info.value)
    assert state.extra is value and not state._saved_state["extra"]  # nothing committed of it
    with pytest.raises(hvd.StateSyncError, match=rf"^{where}"):
        hvd.elastic.ObjectState(extra=value)


def test_supported_attributes_commit_and_an_allowlisted_class_is_the_users_call():
    hvd.init()
    state = hvd.elastic.ObjectState(loss=np.float64(0.5), stats=[np.arange(3), torch.ones(2), {1, 2}],
                                    dtype=torch.float16, size=torch.Size([2]), device=torch.device("cpu"))
    state.loss = np.mean([1.0, 2.0])
    state.commit()
    torch.serialization.add_safe_globals([_Opaque])
    try:
        state.stats.append(_Opaque())
        state.commit()
    finally:
        torch.serialization.clear_safe_globals()


def test_a_worker_alone_in_its_round_syncs_without_encoding():
    hvd.init()
    assert hvd.size() == 1
    state = hvd.elastic.ObjectState(epoch=0)
    state.commit()
    state.__dict__["extra"] = _Opaque()  # past the commit-time check: the sync alone must not trip over it
    state._saved_state["extra"] = state.extra
    state.sync()
    assert isinstance(state.extra, _Opaque) and state.epoch == 0
