"""A sharded checkpoint whose ``dcp/metadata.json`` claims what its shard files do not hold, its digest fixed in the
manifest (whoever writes the storage can do both).

Before: the metadata's sizes were believed, so a load allocated each optimizer tensor at whatever size it claimed
(a 1 GiB claim took 1 GiB on every worker; 2**40 elements tried to allocate 4 TB), and the load then failed as
"could not load the shards", which ends the job as "training state lost" although the previous checkpoint was
intact. Now ``checkpoint.dcp_layout`` checks the claims at parse time and the load falls back in one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cloud_elastic.checkpoint import dcp, dcp_layout
from cloud_elastic.checkpoint.dcp_layout import MAX_DIMS, MAX_NAME, MAX_NAME_PARTS, Region, Tensor, check_layout
from cloud_elastic.worker.durable.failure import CheckpointFailed
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx, _state, _train, _values
from tests.unit.test_sharded_checkpoint_hostile import _two_checkpoints

pytestmark = pytest.mark.timeout(90)

_STEP = "optimizer.state.0.bias.step"  # a scalar, read into a tensor the load allocates at the size claimed
_EXP_AVG = "optimizer.state.0.bias.exp_avg"  # 16 elements, one chunk
_LAST = "optimizer.state.2.bias.exp_avg_sq"  # the last item of __0_0.distcp


def _forge(newest: Path, tamper, files: dict[str, int] | None = None) -> None:
    """``tamper`` applied to ``newest``'s metadata.json, its size and digest fixed in the manifest (and the sizes
    ``files`` listed there for the shard files)."""
    path = newest / "dcp" / "metadata.json"
    metadata = json.loads(path.read_text())
    tamper(metadata)
    path.write_text(json.dumps(metadata))
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["shards"]["files"].update(files or {}, **{"metadata.json": path.stat().st_size})
    manifest["shards"]["sha256"]["metadata.json"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (newest / "manifest.json").write_text(json.dumps(manifest))


def _claim(fqn: str, size: list[int], chunks: list, length: int | None = None):
    def tamper(md):
        md["items"][fqn].update(size=size, chunks=chunks)
        for entry in md["storage"]:
            if entry["fqn"] == fqn:
                entry["offset"] = chunks[0][0]
                if length is not None:
                    entry["length"] = length
    return tamper


def _many_dims(n: int):
    """Review rvG's forgery: the scalar Adam step claims ``n`` dimensions, size [2, 1, 1, ...], in two one-element
    chunks (the second in the bytes after the first's storage entry)."""
    def tamper(md):
        md["items"][_STEP].update(size=[2] + [1] * (n - 1), chunks=[[[0] * n, [1] * n], [[1] + [0] * (n - 1), [1] * n]])
        entry = _entry(md, _STEP)
        md["storage"].append(dict(entry, offset=[1] + [0] * (n - 1), at=entry["at"] + 8, length=8))
        entry.update(offset=[0] * n, length=8)
    return tamper


class _TooMuchWork(BaseException):  # not an Exception: no handler of the loader's may take it for a bad checkpoint
    pass


class _Meter:
    """The lines of ``checkpoint.dcp_layout`` (and of the other ``modules``) run inside the ``with`` (its work as a
    count, the same on any machine). Past ``cap`` it raises _TooMuchWork at once, so a check that would run for
    minutes fails the test in a second."""

    def __init__(self, cap: int, modules=(dcp_layout,)) -> None:
        self.cap, self.lines, self._before = cap, 0, None
        self._files = {m.__file__ for m in modules}

    def __enter__(self) -> "_Meter":
        self._before = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc) -> None:
        sys.settrace(self._before)

    def _call(self, frame, event, arg):
        return self._line if frame.f_code.co_filename in self._files else None

    def _line(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            if self.lines > self.cap:
                raise _TooMuchWork(f"the code measured ran more than {self.cap:,} lines")
        return self._line


def _entry(md, fqn: str) -> dict:
    return next(e for e in md["storage"] if e["fqn"] == fqn)


def _last_entry_longer(md) -> None:
    max(md["storage"], key=lambda e: e["at"])["length"] += 10 ** 12


def _second_entry_over_the_first(md) -> None:
    _entry(md, _EXP_AVG)["at"] = _entry(md, _STEP)["at"]


def _item_named(name: str):
    """One more item, a non-tensor one without a storage entry, named ``name``: review rvH2's forgery."""
    def tamper(md):
        md["items"][name] = {"kind": "bytes"}
    return tamper


@pytest.mark.parametrize("tamper,files,reason", [
    (_claim(_STEP, [2 ** 40], [[[0], [2 ** 40]]]), None,
     f"item '{_STEP}': its chunk at [0] holds 4,398,046,511,104 bytes, its storage entry only 1,577"),
    (_claim(_EXP_AVG, [16], [[[0], [12]], [[4], [4]]]), None, f"item '{_EXP_AVG}': its chunks overlap"),
    (_claim(_EXP_AVG, [16], [[[8], [16]]]), None, f"item '{_EXP_AVG}': its chunk at [8] of [16] is outside its size"),
    (_claim(_EXP_AVG, [16], [[[0], [8]]]), None, f"item '{_EXP_AVG}': its chunks hold 8 elements, its size [16] 16"),
    (_second_entry_over_the_first, None, f"storage entries of '{_EXP_AVG}' and '{_STEP}' overlap in '__0_0.distcp'"),
    (_last_entry_longer, None, "places items up to byte 1,000,000,041,964 of __0_0.distcp, which holds 41,964"),
    (_many_dims(MAX_DIMS + 1), None, f"item '{_STEP}': its size has 65 dimensions, over the 64 a tensor may have"),
    (_item_named("model" + ".a" * MAX_NAME_PARTS), None, "its name has 257 parts, over the 256 an item's may have"),
    (_item_named("model.0." + "a" * (MAX_NAME - 7)), None,
     "its name has 4,097 characters, over the 4,096 an item's may have"),
    # Before: "does not fit this training state" (another model), and the job stopped.
    (_item_named("model.extra"), None, "item 'model.extra': a non-tensor item without a storage entry"),
    # The manifest lies about the shard file's size too: the store compares it with the storage's first.
    (_claim(_LAST, [2 ** 40], [[[0], [2 ** 40]]], length=2 ** 42), {"__0_0.distcp": 2 ** 43},
     "its shard files __0_0.distcp are missing or not the size its manifest says"),
], ids=["claims 4 TB", "overlap", "outside", "gap", "entries overlap", "entry past the end", "65 dimensions",
         "257 name parts", "4,097-character name", "an item without bytes", "manifest lies too"])
def test_forged_dcp_metadata_falls_back_to_the_previous_checkpoint_in_one_line_without_allocating_it(
        tmp_path, caplog, tamper, files, reason):
    at_2, newest, _ = _two_checkpoints(tmp_path)
    assert (newest / "dcp" / "__0_0.distcp").stat().st_size == 41_964  # the figures the reasons quote
    _forge(newest, tamper, files)
    other = _state(seed=9)
    _train(other, 1)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic"):
        assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 2
    assert all(torch.equal(a, b) for a, b in zip(_values(other), at_2))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(
        "cloud_elastic")]
    assert len(warnings) == 1 and "\n" not in warnings[0] and len(warnings[0]) < 600, warnings
    assert newest.name in warnings[0] and reason in warnings[0] and "falling back to the previous one" in warnings[0]


_PEAK = r"""
import json, resource, sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx, _state, _train
from tests.unit.test_sharded_checkpoint_hostile import _two_checkpoints
from tests.unit.test_sharded_metadata_forged import _STEP, _claim, _forge

tmp = Path(sys.argv[1])
_, newest, _ = _two_checkpoints(tmp)
n = 1 << 28  # float32: 1 GiB
_forge(newest, _claim(_STEP, [n], [[[0], [n]]]))
other = _state(seed=9)
_train(other, 1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
step = _checkpoints(tmp, _ctx()).load_latest(other).step
print(json.dumps({"step": step, "grew_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}))
"""


def test_a_metadata_claiming_a_1_gib_optimizer_tensor_costs_no_memory_to_refuse(tmp_path):
    """Measured in a fresh process, whose peak memory is this load's. Before: its peak grew by 1 GiB."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _PEAK, str(tmp_path)], cwd=root, capture_output=True, text=True,
                          timeout=80)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["step"] == 2 and found["grew_kib"] < 64 * 1024, found


def test_the_chunks_of_a_tensor_sharded_on_a_grid_pass_and_any_one_moved_onto_another_is_refused():
    """A 2 x 4 mesh sharding both dimensions (uneven: the last column is narrower, one row empty on a third
    worker), as DCP writes a DTensor's chunks; then each chunk in turn moved onto its neighbour's place."""
    chunks = [((r * 4, c * 3), (4, 3 if c < 3 else 1)) for r in range(2) for c in range(4)] + [((8, 0), (0, 10))]
    regions = [Region("w", o, "__0_0.distcp", i * 100, 100) for i, (o, _) in enumerate(chunks)]
    check_layout({"w": Tensor(4, (8, 10), tuple(chunks))}, regions)
    for i in (0, 1, 2, 4, 5, 6):  # onto the chunk of the same size in the other row
        (r, c), sizes = chunks[i]
        moved = chunks[:i] + [((4 - r, c), sizes)] + chunks[i + 1:]
        with pytest.raises(ValueError, match=r"^item 'w': its chunks overlap$"):
            check_layout({"w": Tensor(4, (8, 10), tuple(moved))}, regions)


def test_chunks_far_from_a_grid_are_checked_within_a_budget_then_refused_in_one_line():
    """Rows of bricks whose joints all differ: no grid, so a forged file could make each load compare every
    chunk with many others. Before the budget: 96 s for 300,000 chunks here."""
    rows, width = 400, 400
    chunks = []
    for r in range(rows):  # row r: a brick of r + 1 columns, then bricks of ``width``, then the rest
        start = 0
        for w in [r + 1] + [width] * (rows - 1):
            chunks.append(((r, start), (1, w)))
            start += w
        chunks.append(((r, start), (1, width * rows - start)))
    regions = [Region("w", o, "__0_0.distcp", i * 10 ** 6, 10 ** 6) for i, (o, _) in enumerate(chunks)]
    with pytest.raises(ValueError, match=r"^item 'w': its chunks are too many, and too far from a grid, to check "
                                         r"\(160,400 in one item\)$"):
        check_layout({"w": Tensor(1, (rows, width * rows), tuple(chunks))}, regions)
    few = [c for c in chunks if c[0][0] < 20]  # 20 rows of the same: checked, and they cover their part exactly
    check_layout({"w": Tensor(1, (20, width * rows), tuple(few))}, regions)


def test_a_metadata_claiming_20000_dimensions_is_refused_for_less_work_than_checking_an_honest_one(tmp_path, caplog):
    """Review rvG's forgery at 20,000 dimensions (a 0.4 MB file). Before: the overlap check's strides cost the
    square of the dimensions claimed, on every worker of the loading host: 7.6 s of CPU here, 77 s for 64,000
    (1.35 MB), days near the 64 MiB a load reads. Its work is counted in lines run, not timed."""
    at_2, newest, _ = _two_checkpoints(tmp_path)
    other = _state(seed=9)
    _train(other, 1)
    with _Meter(cap=10 ** 6) as honest:
        assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 4
    assert honest.lines > 100  # the meter sees the check (it runs on this thread)
    _forge(newest, _many_dims(20_000))
    # Refused at its first look at that item, then step 2's metadata is checked in full: two honest checks at most.
    with caplog.at_level(logging.WARNING, logger="cloud_elastic"), _Meter(cap=2 * honest.lines):
        assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 2
    assert all(torch.equal(a, b) for a, b in zip(_values(other), at_2))
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "its size has 20,000 dimensions, over the 64 a tensor may have" in warning and len(warning) < 600, warning


def _rows_of_bricks(rows: int, ndim: int = 2) -> tuple[dict[str, Tensor], list[Region]]:
    """Rows of bricks whose joints all differ (no grid), the rows along the last of ``ndim`` dimensions, so that
    two chunks compared agree on every dimension but the first and the last."""
    width, pad, chunks = rows, (0,) * (ndim - 2), []
    for r in range(rows):  # row r: a brick of r + 1 columns, then bricks of ``width``, then the rest
        start = 0
        for w in [r + 1] + [width] * (rows - 1):
            chunks.append(((start, *pad, r), (w, *(1,) * (ndim - 2), 1)))
            start += w
        chunks.append(((start, *pad, r), (width * rows - start, *(1,) * (ndim - 2), 1)))
    regions = [Region("w", o, "__0_0.distcp", i * 10 ** 6, 10 ** 6) for i, (o, _) in enumerate(chunks)]
    return {"w": Tensor(1, (width * rows, *(1,) * (ndim - 2), rows), tuple(chunks))}, regions


@pytest.mark.parametrize("ndim", [2, MAX_DIMS])
def test_the_sweep_budget_counts_coordinates_so_its_work_does_not_grow_with_the_dimensions_claimed(ndim):
    """What twice the budget buys: about one line of work per unit, at 2 dimensions or 64. Before: the budget
    counted pairs of chunks, each up to 64 coordinates (at the default budget, 13.8 s of CPU against 1.8 s)."""
    tensors, regions = _rows_of_bricks(30, ndim)
    spent = {}
    for budget in (20_000, 40_000):
        with _Meter(cap=10 ** 7) as meter, pytest.raises(ValueError, match=r"^item 'w': its chunks are too many, "
                                                                             r"and too far from a grid, to check"):
            check_layout(tensors, regions, budget=budget)
        spent[budget] = meter.lines
    assert 0 < spent[40_000] - spent[20_000] <= 3 * 20_000, spent


def _rvg_shape(n: int) -> tuple[dict[str, Tensor], list[Region]]:
    """Review rvG's forged item as the check sees it: size [2, 1, 1, ...] of ``n`` dimensions, in two chunks."""
    size, chunks = (2, *(1,) * (n - 1)), (((0,) * n, (1,) * n), ((1, *(0,) * (n - 1)), (1,) * n))
    return {"s": Tensor(4, size, chunks)}, [Region("s", o, "__0_0.distcp", 8 * i, 8) for i, (o, _) in enumerate(chunks)]


def test_an_item_may_claim_as_many_dimensions_as_a_tensor_may_have_and_no_more():
    """Torch reduces over at most 64 dimensions; review rvG's shape passes the check at 64 and is refused at 65."""
    check_layout(*_rvg_shape(MAX_DIMS))
    with pytest.raises(ValueError, match=r"^item 's': its size has 65 dimensions, over the 64 a tensor may have$"):
        check_layout(*_rvg_shape(MAX_DIMS + 1))
    with pytest.raises(RuntimeError, match="only tensors with up to 64 dims are supported"):
        torch.zeros([1] * (MAX_DIMS + 1)).sum(dim=0)


def test_the_work_to_check_an_item_grows_in_proportion_to_its_dimensions():
    """Lines run for 16, 32 and 64 dimensions: each doubling adds twice what the one before added (in proportion),
    not four times (the square). Before: the strides, a product per dimension: 3.3 times."""
    lines = {}
    for n in (16, 32, MAX_DIMS):
        with _Meter(cap=10 ** 6) as meter:
            check_layout(*_rvg_shape(n))
        lines[n] = meter.lines
    assert lines[64] - lines[32] <= 2.5 * (lines[32] - lines[16]), lines


def test_an_item_named_with_300000_dots_is_refused_for_less_work_than_loading_an_honest_checkpoint(tmp_path, caplog):
    """Review rvH2's finding A (a 0.6 MB metadata.json). Before: the name was looked up in the live state's keys
    one prefix at a time, each prefix joined again, the square of its parts: 70 s of CPU at 160,000 dots on every
    worker of the loading host, no fallback; days near the 64 MiB a load reads. Counted in lines run, not timed."""
    at_2, newest, _ = _two_checkpoints(tmp_path)
    other = _state(seed=9)
    _train(other, 1)
    with _Meter(cap=10 ** 6, modules=(dcp_layout, dcp)) as honest:
        assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 4
    _forge(newest, _item_named("model" + ".a" * 300_000))
    with caplog.at_level(logging.WARNING, logger="cloud_elastic"), _Meter(2 * honest.lines, (dcp_layout, dcp)):
        assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 2
    assert all(torch.equal(a, b) for a, b in zip(_values(other), at_2))
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "its name has 600,005 characters, over the 4,096 an item's may have" in warning and len(warning) < 600, warning


@pytest.mark.parametrize("part", ["model", "optimizer"])
def test_looking_an_item_up_in_the_live_state_takes_the_same_work_whatever_the_length_of_its_name(part):
    """``dcp.unexpected_items`` (run by every load before DCP reads a byte) with names far past the bound a load's
    metadata may hold: 1,000 and 100,000 parts below a key the state has (a nested value: held), or below one it
    lacks. Before: lines run in proportion to the parts, each over a prefix joined again (the square)."""
    weight = torch.zeros(2)
    tensors = {"model": {"0.weight": weight}, "optimizer": {"state": {"0.weight": {"exp_avg": weight}}}}
    prefix = "model." if part == "model" else "optimizer.state."
    lines = {}
    for parts in (1_000, 100_000):
        tail = ".a" * parts
        metadata = SimpleNamespace(state_dict_metadata={f"{prefix}0.weight{tail}": None, f"{prefix}1.bias{tail}": None})
        with _Meter(cap=1_000, modules=(dcp,)) as meter:
            assert dcp.unexpected_items(tensors, {"optimizer": "model"}, metadata) == [f"{prefix}1.bias{tail}"]
        lines[parts] = meter.lines
    assert lines[100_000] == lines[1_000], lines


def _item_renamed(name: str, new: str):
    """The item ``name`` and its storage entry renamed ``new``: an item with bytes of its own in a shard file, which
    no check of the layout can tell from another model's (fixQ left it: the job stopped, "does not fit")."""
    def tamper(md):
        md["items"][new] = md["items"].pop(name)
        _entry(md, name)["fqn"] = new
    return tamper


@pytest.mark.parametrize("forged", [[4], [2, 4]], ids=["the newest", "every one"])
def test_a_checkpoint_that_does_not_fit_while_an_older_one_does_is_passed_over(tmp_path, caplog, forged):
    """Forged in the newest only: the job resumes from the one before, which fits, saying which it passed over and
    why (before: it stopped with "resume with the same model, or use a fresh --checkpoint-dir", whose fresh start
    would have trained from initial weights). Forged in every one (as a changed model is): the stop is as before,
    naming the newest."""
    at_2, newest, _ = _two_checkpoints(tmp_path)
    folders = sorted(p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-"))
    for folder in folders[-len(forged):]:
        _forge(folder, _item_renamed("optimizer.param_groups.0.maximize", "model.extra"))
    other = _state(seed=9)
    _train(other, 1)
    if forged == [2, 4]:
        with pytest.raises(CheckpointFailed) as stopped:
            _checkpoints(tmp_path, _ctx()).load_latest(other)
        assert stopped.value.failure == "mismatch" and str(stopped.value).startswith(
            f"the checkpoint in {tmp_path / 'ckpt'} (commit #4) does not fit this training state (Unexpected key in "
            "checkpoint: model.extra): resume with the same model"), str(stopped.value)
        return
    with caplog.at_level(logging.WARNING, logger="cloud_elastic"):
        assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 2
    assert all(torch.equal(a, b) for a, b in zip(_values(other), at_2))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert f"the checkpoint in {tmp_path / 'ckpt'} (commit #4) does not fit this training state (Unexpected key in " \
           "checkpoint: model.extra), but the one of step 2 before it does: resuming from it" in warnings[0], warnings
