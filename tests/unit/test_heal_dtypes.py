"""A state with int16, uint16, uint32, uint64 or complex tensors heals from peers, bit for bit, sending only
dtypes that NCCL's send and recv carry.

torch's ProcessGroupNCCL maps int8, uint8, int32, int64, float16, bfloat16, float32, float64, bool and float8 to
an NCCL type and refuses every other dtype ("Input tensor data type is not supported for NCCL process group");
Gloo's send and recv carry any. So a model with an int16 buffer healed on Gloo and failed on NCCL. Here two
ranks of a real Gloo group (one thread each, in this process) heal a model's parameters, buffers and an
optimizer-like state, and every tensor handed to ``send``/``recv`` is recorded.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from cloud_elastic.worker.comm import collectives, heal as heal_module
from cloud_elastic.worker.comm.heal import Heal

pytestmark = pytest.mark.timeout(60)

#: The dtypes torch's ProcessGroupNCCL sends and receives (its ncclDataType map).
NCCL_DTYPES = {torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
               torch.float64, torch.bool, torch.float8_e5m2, torch.float8_e4m3fn}


class _Recording:
    """A process group's send and recv, recording the dtype of every tensor they carry."""

    def __init__(self, group, sent: list) -> None:
        self._group, self._sent = group, sent

    def send(self, tensors, rank, tag):
        self._sent.extend(t.dtype for t in tensors)
        return self._group.send(tensors, rank, tag)

    def recv(self, tensors, rank, tag):
        self._sent.extend(t.dtype for t in tensors)
        return self._group.recv(tensors, rank, tag)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Linear(6, 3)
    g = torch.Generator().manual_seed(seed)
    # Every bit pattern matters: int16 -1 and 0x7C01 are NaNs as float16 bits (the carrier of a 2-byte copy).
    model.register_buffer("counts16", torch.randint(-2 ** 15, 2 ** 15, (257,), generator=g, dtype=torch.int16))
    model.counts16[:2] = torch.tensor([-1, 0x7C01], dtype=torch.int16)
    model.register_buffer("ids16", torch.randint(0, 2 ** 16, (5, 3), generator=g).to(torch.uint16))
    model.register_buffer("ids32", torch.randint(0, 2 ** 32, (7,), generator=g).to(torch.uint32))
    model.register_buffer("ids64", torch.randint(0, 2 ** 62, (3,), generator=g).to(torch.uint64))
    model.register_buffer("phase", torch.randn(4, generator=g, dtype=torch.complex64))
    model.register_buffer("phase128", torch.randn(2, 2, generator=g, dtype=torch.complex128))
    model.register_buffer("scalar16", torch.tensor(-3, dtype=torch.int16))  # 0-dim
    return model


def _heal(rank: int, store, model: torch.nn.Module, state: list[torch.Tensor], sent: list, errors: list) -> None:
    try:
        group = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=20))
        ctx = SimpleNamespace(info=SimpleNamespace(rank=rank, size=2), device=torch.device("cpu"),
                              point_to_point=lambda what, start: start(_Recording(group, sent)),
                              wait=lambda work, what, **how: work.wait())
        _CONTEXTS[threading.get_ident()] = ctx
        heal = Heal([1], 2, 7)  # rank 0 holds commit 7, rank 1 needs it
        heal.parameters(dict(model.named_parameters()))
        heal.buffers(dict(model.named_buffers()))
        heal.tensors(state, "optimizer state")
    except BaseException as exc:  # handed to the test
        errors.append(exc)


_CONTEXTS: dict[int, SimpleNamespace] = {}


def test_a_model_with_int16_uint16_uint32_uint64_and_complex_state_heals_bitwise_in_nccl_dtypes(monkeypatch):
    for module in (heal_module, collectives):
        monkeypatch.setattr(module, "get_context", lambda: _CONTEXTS[threading.get_ident()])
    holder, receiver = _model(0), _model(1)
    held = [torch.arange(-40, 40, dtype=torch.int16), torch.arange(9, dtype=torch.float16)]  # packed together
    received = [torch.zeros(80, dtype=torch.int16), torch.zeros(9, dtype=torch.float16)]
    store = dist.HashStore()
    sent: list = []
    errors: list = []
    threads = [threading.Thread(target=_heal, args=(rank, store, model, state, sent, errors), daemon=True)
               for rank, model, state in ((0, holder, held), (1, receiver, received))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert not any(t.is_alive() for t in threads), "the heal hung"
    assert not errors, errors
    want, got = holder.state_dict(), receiver.state_dict()
    for key in want:
        bits = want[key].reshape(-1).view(torch.uint8)
        assert got[key].dtype == want[key].dtype and torch.equal(got[key].reshape(-1).view(torch.uint8), bits), key
    assert all(torch.equal(a, b) for a, b in zip(received, held))
    assert sent and set(sent) <= NCCL_DTYPES, sorted(map(str, set(sent) - NCCL_DTYPES))
