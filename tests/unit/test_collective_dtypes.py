"""Every dtype Horovod reduces works in every collective, on two real processes in a Gloo group.

Gloo carries no int16 ("Invalid scalar type", raised in the wait, where it looked like a lost peer's failure:
the round rolled back and re-formed forever). int16 (and uint16) travel widened in a reduction, as their bits
in a copy; the results are exact and keep the caller's dtype. What no collective can carry is a one-line
TypeError in the calling worker before anything is launched, after which the group still works.

The collectives run on a small stand-in for the worker's context (the round's group is the default group), as
in ``test_horovod_collective_inputs.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.unit.gloo_pair import run_pair

pytestmark = pytest.mark.timeout(120)


def _outcome(call):
    try:
        value = call()
        values = value if isinstance(value, (list, tuple)) else [value]
        return ("ok", [(str(v.dtype), v.tolist()) for v in values])
    except Exception as exc:  # what the script would see
        return (type(exc).__name__, str(exc))


def _member(rank: int) -> dict:
    import torch
    import torch.distributed as dist

    from cloud_elastic.worker.comm import collectives, partitioned, shapes

    pg = dist.distributed_c10d._get_default_group()
    ctx = SimpleNamespace(info=SimpleNamespace(rank=rank, size=2, cross_rank=0, cross_size=1),
                          device=torch.device("cpu"), pg=pg, group=lambda what: pg, wait=lambda work, what, **how: work.wait())
    collectives.get_context = shapes.get_context = partitioned.get_context = lambda: ctx
    hvd = collectives
    got = {}
    i16 = torch.tensor([32767 - rank, -3 - rank, 7 + rank, rank], dtype=torch.int16)
    for op in ("sum", "min", "max", "product"):
        got[f"allreduce {op}"] = _outcome(lambda: hvd.allreduce(i16, op=op))
    got["allreduce uint16"] = _outcome(lambda: hvd.allreduce(torch.tensor([65535, rank], dtype=torch.uint16),
                                                             op=hvd.Sum))
    in_place = i16.clone()
    got["allreduce_"] = _outcome(lambda: [hvd.allreduce_(in_place, op=hvd.Sum), in_place])
    got["grouped"] = _outcome(lambda: hvd.grouped_allreduce([torch.ones(2), i16, i16[:2]], op=hvd.Sum))
    got["broadcast"] = _outcome(lambda: hvd.broadcast(i16, root_rank=1))
    got["broadcast_object"] = ("ok", hvd.broadcast_object(i16, root_rank=1).tolist())
    got["allgather"] = _outcome(lambda: hvd.allgather(i16[: 1 + rank]))
    got["allgather uint64"] = _outcome(lambda: hvd.allgather(torch.tensor([2**63 + rank], dtype=torch.uint64)))
    got["allgather complex"] = _outcome(lambda: hvd.allgather(torch.tensor([1 + 1j * rank], dtype=torch.complex64)))
    got["alltoall"] = _outcome(lambda: partitioned.alltoall(i16, splits=[1, 3]))
    got["reducescatter"] = _outcome(lambda: partitioned.reducescatter(i16, op=hvd.Sum))
    for bits in (16, 32):
        unsigned = torch.tensor(_unsigned(rank, bits), dtype=getattr(torch, f"uint{bits}"))
        for op in ("sum", "min", "max", "product"):
            got[f"reducescatter uint{bits} {op}"] = _outcome(lambda: partitioned.reducescatter(unsigned, op=op))

    got["refused sum uint64"] = _outcome(lambda: hvd.allreduce(torch.ones(2, dtype=torch.uint64), op=hvd.Sum))
    got["refused min complex"] = _outcome(lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64), op=hvd.Min))
    got["refused float8"] = _outcome(lambda: partitioned.reducescatter(torch.zeros(2, dtype=torch.float8_e4m3fn),
                                                                       op=hvd.Sum))
    got["refused grouped"] = _outcome(lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(2, dtype=torch.uint64)],
                                                                    op=hvd.Sum))
    # The same width, another dtype on each worker: as bits, rank 0's int16 rows were read as float16 silently.
    mixed = torch.tensor([1, 2], dtype=torch.int16 if rank == 0 else torch.float16)
    got["alltoall mixed"] = _outcome(lambda: partitioned.alltoall(mixed))
    got["alltoall other rows"] = _outcome(lambda: partitioned.alltoall(torch.zeros((2, 2) + (1,) * rank)))
    # reducescatter sizes what it receives from its own tensor: int16 read as float16 (rank 0 got [15361, 16386]),
    # (4, 2) against (2, 4) summed crosswise, 4 rows against 6 aborted both processes in Gloo (EnforceNotMet).
    got["reducescatter mixed"] = _outcome(lambda: partitioned.reducescatter(
        torch.tensor([1, 2, 3, 4], dtype=torch.int16 if rank == 0 else torch.float16), op=hvd.Sum))
    got["reducescatter other shape"] = _outcome(lambda: partitioned.reducescatter(
        torch.arange(8.0).reshape((4, 2) if rank == 0 else (2, 4)), op=hvd.Sum))
    got["reducescatter other rows"] = _outcome(lambda: partitioned.reducescatter(torch.ones(4 + 2 * rank)))
    got["still in step"] = _outcome(lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum))
    return got


@pytest.fixture(scope="module")
def results() -> dict:
    return run_pair(_member)


def _i16(rank: int):
    import torch

    return torch.tensor([32767 - rank, -3 - rank, 7 + rank, rank], dtype=torch.int16)


#: The int16 sum of both workers' ``_i16``: 32767 + 32766 wraps, as an int16 sum does.
_SUMMED = [32767 + 32766 - 65536, -7, 15, 1]


def _unsigned(rank: int, bits: int) -> list[int]:
    """Values whose sum and product wrap modulo 2**bits."""
    return [2**bits - 1 - rank, 3 + rank, 2 ** (bits // 2) + rank, rank]


def _both(results, key):
    assert results[0][key] == results[1][key], key
    return results[0][key]


@pytest.mark.parametrize("op", ["sum", "min", "max", "product"])
def test_an_int16_allreduce_is_exact_and_stays_int16(results, op):
    import torch

    stack = torch.stack([_i16(0), _i16(1)])
    # What the narrow type itself computes: a sum or product wraps modulo 2**16, as Horovod's int16 does.
    expected = {"sum": stack.sum(0, dtype=torch.int16), "min": stack.amin(0), "max": stack.amax(0),
                "product": stack.prod(0, dtype=torch.int16)}[op]
    assert _both(results, f"allreduce {op}") == ("ok", [("torch.int16", expected.tolist())])


def test_int16_in_place_grouped_and_uint16_allreduces_are_exact(results):
    summed = _SUMMED
    assert _both(results, "allreduce_") == ("ok", [("torch.int16", summed)] * 2)
    assert _both(results, "grouped") == ("ok", [("torch.float32", [2.0, 2.0]), ("torch.int16", summed),
                                                ("torch.int16", summed[:2])])
    assert _both(results, "allreduce uint16") == ("ok", [("torch.uint16", [65534, 1])])


def test_int16_copies_move_the_values_exactly(results):
    assert _both(results, "broadcast") == ("ok", [("torch.int16", _i16(1).tolist())])
    assert _both(results, "broadcast_object") == ("ok", _i16(1).tolist())
    assert _both(results, "allgather") == ("ok", [("torch.int16", _i16(0)[:1].tolist() + _i16(1)[:2].tolist())])
    # alltoall: rank r gets row 0 from every peer (splits [1, 3]) if r == 0, else rows 1-3.
    assert results[0]["alltoall"] == ("ok", [("torch.int16", [_i16(0)[0].item(), _i16(1)[0].item()]),
                                             ("torch.int32", [1, 1])])
    assert results[1]["alltoall"] == ("ok", [("torch.int16", _i16(0)[1:].tolist() + _i16(1)[1:].tolist()),
                                             ("torch.int32", [3, 3])])
    assert results[0]["reducescatter"] == ("ok", [("torch.int16", _SUMMED[:2])])
    assert results[1]["reducescatter"] == ("ok", [("torch.int16", _SUMMED[2:])])


def test_dtypes_gloo_cannot_gather_travel_as_their_bits(results):
    assert _both(results, "allgather uint64")[0] == "ok"
    assert results[0]["allgather uint64"][1][0][0] == "torch.uint64"
    assert _both(results, "allgather complex") == ("ok", [("torch.complex64", [1 + 0j, 1 + 1j])])


@pytest.mark.parametrize("case, words", [
    ("refused sum uint64", "hvd.allreduce: cannot reduce a torch.uint64 tensor"),
    ("refused min complex", "hvd.allreduce: cannot reduce a torch.complex64 tensor"),
    ("refused float8", "hvd.reducescatter: cannot reduce a torch.float8_e4m3fn tensor"),
    ("refused grouped", "hvd.grouped_allreduce: cannot reduce a torch.uint64 tensor"),
])
def test_what_no_collective_carries_is_a_one_line_type_error_before_anything_is_launched(results, case, words):
    kind, message = _both(results, case)
    assert kind == "TypeError" and message.startswith(words) and "\n" not in message, message
    assert "int16" in message  # it names what to cast to
    # Nothing was launched: the next collective of the group is the peer's next one.
    assert _both(results, "still in step") == ("ok", [("torch.float32", [2.0, 2.0, 2.0])])


@pytest.mark.parametrize("bits", [16, 32])
@pytest.mark.parametrize("op", ["sum", "min", "max", "product"])
def test_a_uint16_or_uint32_reducescatter_is_exact_and_keeps_its_dtype(results, op, bits):
    # torch sums and compares neither on the CPU ('"sum_cpu" not implemented for 'UInt16''): reduced widened.
    combine = {"sum": lambda a, b: a + b, "min": min, "max": max, "product": lambda a, b: a * b}[op]
    expected = [combine(a, b) % 2**bits for a, b in zip(_unsigned(0, bits), _unsigned(1, bits))]
    assert results[0][f"reducescatter uint{bits} {op}"] == ("ok", [(f"torch.uint{bits}", expected[:2])])
    assert results[1][f"reducescatter uint{bits} {op}"] == ("ok", [(f"torch.uint{bits}", expected[2:])])


@pytest.mark.parametrize("case, told", [
    ("alltoall mixed", "(rank 0: int16 (*,); rank 1: float16 (*,))"),
    ("alltoall other rows", "(rank 0: float32 (*, 2); rank 1: float32 (*, 2, 1))"),
])
def test_an_alltoall_of_other_dtypes_or_rows_on_each_worker_is_a_value_error_on_every_worker(results, case, told):
    kind, message = _both(results, case)
    assert kind == "ValueError" and message == (f"hvd.alltoall: mismatched tensors across workers {told}: every "
                                                "worker must pass the same dtype and the same shape past dimension 0")
    assert _both(results, "still in step") == ("ok", [("torch.float32", [2.0, 2.0, 2.0])])


@pytest.mark.parametrize("case, told", [
    ("reducescatter mixed", "(rank 0: int16 (4,); rank 1: float16 (4,))"),
    ("reducescatter other shape", "(rank 0: float32 (4, 2); rank 1: float32 (2, 4))"),
    ("reducescatter other rows", "(rank 0: float32 (4,); rank 1: float32 (6,))"),
])
def test_a_reducescatter_of_other_dtypes_or_shapes_on_each_worker_is_a_value_error_on_every_worker(results, case,
                                                                                                      told):
    kind, message = _both(results, case)
    assert kind == "ValueError" and message == (f"hvd.reducescatter: mismatched tensors across workers {told}: "
                                                "every worker must pass the same dtype and the same shape")
    assert _both(results, "still in step") == ("ok", [("torch.float32", [2.0, 2.0, 2.0])])
