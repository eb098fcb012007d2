"""Durable checkpoints of a sharded model (``checkpoint.sharded``) in one process: one host of one worker.

The worker is standalone (``hvd.init()`` without a driver), so the host's group is torch's
default group of size 1 and the writing and loading code runs as it does on host 0 of a job,
minus the other workers. Several workers a host, the job's schedule and the 2 -> 1 reshard are
``tests/integration/test_sharded_checkpoint.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.durable.sharded import ShardedCheckpoints
from cloud_elastic.checkpoint import DurableJobRecord
from cloud_elastic.checkpoint.store import CheckpointStore, write_job_record
from cloud_elastic.worker.durable.rank_zero import DurableSettings, RankZeroCheckpoints
from cloud_elastic.errors import CheckpointError
from cloud_elastic.worker import sharded

pytestmark = pytest.mark.timeout(90)


def _state(seed: int = 0):
    hvd.init()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    hvd.shard(model, modules=[model[0], model[2]])
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1))
    return hvd.elastic.TorchState(model, opt, step=0, note="x")


def _train(state, steps: int, commit: bool = True) -> None:
    for _ in range(steps):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(state.step))
        state.optimizer.zero_grad()
        F.mse_loss(state.model(x), x.sum(1, keepdim=True)).backward()
        state.optimizer.step()
        state.step += 1
        if commit:
            state.commit()


def _values(state) -> list[torch.Tensor]:
    out = [p.to_local().clone() for p in state.model.parameters()]
    for p in state.model.parameters():
        out += [sharded.local(v).clone() for _, v in sorted(state.optimizer.state[p].items())]
    return out


def _ctx() -> SimpleNamespace:
    reports: list[tuple[str, dict]] = []
    ctx = SimpleNamespace(
        info=SimpleNamespace(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1),
        device=torch.device("cpu"), job_id="job-1", worker_id="127.0.0.1[0]#1", hostname="127.0.0.1", driver_lost=False,
        reports=reports, ledger=SimpleNamespace(commit_seq=0, held=[]),
    )
    # "writing" (the commit a write is about to publish: test_checkpoint_heard_before_written) apart, with the count
    # of the other reports sent before it: each of those comes before that write's "saved".
    ctx.writing = []
    ctx.report_checkpoint = lambda event, **fields: (ctx.writing.append((len(reports), fields)) if event == "writing"
                                                     else reports.append((event, fields)))
    ctx.ledger.hold_commit = ctx.ledger.held.append
    return ctx


def _job_store(url: str) -> str:
    """``url``, holding the record of :func:`_ctx`'s job, as the driver writes it before any worker starts."""
    write_job_record(CheckpointStore(url), DurableJobRecord("job-1", ("python",), 0.0), only_if_absent=True)
    return url


def _checkpoints(tmp_path: Path, ctx, interval_s: float = 300.0) -> ShardedCheckpoints:
    return ShardedCheckpoints(DurableSettings(_job_store(str(tmp_path / "ckpt")), interval_s=interval_s, keep=2), ctx)


@pytest.mark.commit_mode("snapshot")  # a rollback after an update, which in-place commits say they cannot undo
def test_host_0_writes_dcp_shards_and_a_manifest_listing_them_and_a_fresh_worker_loads_them_bitwise(tmp_path):
    state, ctx = _state(), _ctx()
    durable = _checkpoints(tmp_path, ctx)
    _train(state, 3)
    ctx.ledger.commit_seq = 3
    assert durable.finish(state) is None
    written = _values(state)
    [(event, fields)] = ctx.reports
    assert event == "saved" and fields["step"] == 3 and fields["bytes"] > 0
    [folder] = [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-")]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format_version"] == 2 and manifest["shards"]["count"] == 1
    assert ".metadata" in manifest["shards"]["files"]
    assert {p.name: p.stat().st_size for p in (folder / "dcp").iterdir()} == manifest["shards"]["files"]

    other = _state(seed=7)  # another worker's initial weights, no optimizer state yet
    _train(other, 1)
    loaded = _checkpoints(tmp_path, (octx := _ctx())).load_latest(other)
    assert loaded.step == 3 and other.step == 3 and other.note == "x"
    assert all(torch.equal(a, b) for a, b in zip(_values(other), written))
    assert octx.ledger.held == [3] and octx.reports[0][0] == "loaded"
    assert octx.loaded_commit == 3  # held by a load: no say in the job's layout (sharded.check_hosts)
    # The load is the state's last commit: a rollback now returns to the checkpoint.
    _train(other, 1, commit=False)
    other.restore()
    assert other.step == 3 and all(torch.equal(a, b) for a, b in zip(_values(other), written))


def test_host_0_writes_at_its_first_commit_then_every_interval_and_not_on_another_host(tmp_path):
    state, ctx = _state(), _ctx()
    now = [100.0]
    durable = ShardedCheckpoints(DurableSettings(_job_store(str(tmp_path / "ckpt")), interval_s=10.0, keep=5), ctx,
                                 clock=lambda: now[0])
    for step, t in ((1, 100.0), (2, 105.0), (3, 110.5), (4, 111.0)):
        state.step, now[0] = step, t
        durable.after_commit(state)
        assert durable.stop_writing(timeout=30)  # written in the background: wait for it before the next commit
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [1, 3]
    ctx.info.cross_rank = 1  # another host is host 0 now: this one writes nothing
    state.step = 5
    durable.after_commit(state)
    assert durable.stop_writing(timeout=30) and len(ctx.reports) == 2
    ctx.info.cross_rank = 0  # host 0 again: it writes at once
    state.step, ctx.ledger.commit_seq = 6, 6
    durable.after_commit(state)
    assert durable.stop_writing(timeout=30)
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [1, 3, 6]
    assert durable.finish(state) is None  # the last commit is stored: no second write of it
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [1, 3, 6]
    state.step, ctx.ledger.commit_seq = 7, 7
    assert durable.finish(state) is None
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [1, 3, 6, 7]
    ctx.driver_lost = True  # the driver is away: every commit is written, whatever the interval
    for step in (8, 9):
        state.step, ctx.ledger.commit_seq = step, step
        durable.after_commit(state)
        assert durable.stop_writing(timeout=30)
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [1, 3, 6, 7, 8, 9]


def test_a_checkpoint_is_written_in_the_background_from_a_copy_made_at_its_commit(tmp_path, monkeypatch):
    import threading

    from cloud_elastic.worker.durable import sharded as sharded_checkpoints
    state, ctx = _state(), _ctx()
    durable = _checkpoints(tmp_path, ctx)
    real_save, release, writing = sharded_checkpoints._save, threading.Event(), threading.Event()

    def held_save(*args):  # the real DCP write, held until the training below has changed the live state
        assert threading.current_thread() is not threading.main_thread()
        writing.set()
        assert release.wait(30)
        real_save(*args)

    monkeypatch.setattr(sharded_checkpoints, "_save", held_save)
    state.seen = torch.zeros(3)  # a plain tensor of the state (state.pt), changed in place below
    _train(state, 2)
    ctx.ledger.commit_seq = 2
    durable.after_commit(state)  # returns while the write waits
    committed = _values(state)
    assert writing.wait(30) and not ctx.reports
    state.seen.add_(1)
    _train(state, 2)  # training goes on, and changes every value the checkpoint holds
    ctx.ledger.commit_seq = 4
    durable.after_commit(state)  # this worker's write is still running: no second one now
    assert not all(torch.equal(a, b) for a, b in zip(_values(state), committed))
    release.set()
    assert durable.stop_writing(timeout=30)
    assert [(e, f["step"]) for e, f in ctx.reports] == [("saved", 2)]
    assert ctx.writing == [(0, {"step": 2, "commit_seq": 2})]  # heard of before its "saved"
    other = _state(seed=5)
    other.seen = torch.full((3,), 9.0)
    assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 2
    assert all(torch.equal(a, b) for a, b in zip(_values(other), committed))  # the values of the commit, not later
    assert torch.equal(other.seen, torch.zeros(3))


def test_each_background_checkpoint_holds_its_own_commit_when_the_copy_is_refilled(tmp_path):
    state, ctx = _state(), _ctx()
    now = [0.0]
    durable = ShardedCheckpoints(DurableSettings(_job_store(str(tmp_path / "ckpt")), interval_s=1.0, keep=5), ctx,
                                 clock=lambda: now[0])
    commits = {}
    for step in (2, 4, 6):
        _train(state, 2)
        ctx.ledger.commit_seq, now[0] = step, float(step)
        durable.after_commit(state)
        commits[step] = _values(state)
        assert durable.stop_writing(timeout=30)
    assert [f["step"] for e, f in ctx.reports if e == "saved"] == [2, 4, 6]
    for step in (6, 4, 2):  # every checkpoint, newest first: each holds its own commit's values
        other = _state(seed=11)
        _train(other, 1)
        assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == step
        assert all(torch.equal(a, b) for a, b in zip(_values(other), commits[step])), step
        shutil.rmtree(sorted(p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-"))[-1])


def test_with_sync_writes_the_checkpoint_is_stored_on_the_training_thread_before_the_commit_returns(tmp_path,
                                                                                                    monkeypatch):
    import threading

    from cloud_elastic.worker.durable import sharded as sharded_checkpoints
    state, ctx = _state(), _ctx()
    real_save, threads = sharded_checkpoints._save, []
    monkeypatch.setattr(sharded_checkpoints, "_save",
                        lambda *args: (threads.append(threading.current_thread()), real_save(*args)))
    durable = ShardedCheckpoints(DurableSettings(_job_store(str(tmp_path / "ckpt")), background=False), ctx)
    _train(state, 1)
    durable.after_commit(state)
    assert threads == [threading.current_thread()] and [(e, f["step"]) for e, f in ctx.reports] == [("saved", 1)]


def test_a_torn_sharded_checkpoint_is_skipped_for_the_previous_one(tmp_path):
    state, ctx = _state(), _ctx()
    durable = _checkpoints(tmp_path, ctx)
    _train(state, 2)
    ctx.ledger.commit_seq = 2
    assert durable.finish(state) is None
    good = _values(state)
    _train(state, 2)
    ctx.ledger.commit_seq = 4
    assert durable.finish(state) is None
    newest = sorted(p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-"))[-1]
    shard = next(p for p in (newest / "dcp").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-10])  # cut short
    other = _state(seed=3)
    assert _checkpoints(tmp_path, _ctx()).load_latest(other).step == 2
    assert all(torch.equal(a, b) for a, b in zip(_values(other), good))


def test_a_sharded_job_refuses_a_replicas_checkpoint_and_a_replica_job_a_sharded_one_each_in_one_line(tmp_path):
    state = _state()
    _train(state, 1)
    store = CheckpointStore(str(tmp_path / "replica"))
    store.save(1, {"model": {}, "step": 1})
    with pytest.raises(CheckpointError, match=r"holds a whole model, not shards") as refused:
        ShardedCheckpoints(DurableSettings(_job_store(str(tmp_path / "replica"))), _ctx()).load_latest(state)
    assert "\n" not in str(refused.value)
    assert _checkpoints(tmp_path, _ctx()).finish(state) is None
    with pytest.raises(CheckpointError, match=r"holds the shards of a model trained with hvd.shard"):
        RankZeroCheckpoints(DurableSettings(str(tmp_path / "ckpt")), _ctx()).load_latest(state)
    with pytest.raises(CheckpointError, match=r"^no usable checkpoint in "):
        _checkpoints(tmp_path / "empty", _ctx()).load_latest(state)


def test_a_write_the_storage_refuses_is_reported_and_training_goes_on(tmp_path):
    state, ctx = _state(), _ctx()
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    durable = ShardedCheckpoints(DurableSettings(str(blocked / "ckpt")), ctx)
    _train(state, 1)
    why = durable.finish(state)
    assert why is not None and why.startswith("the final checkpoint (step 1) was not written: ") and "\n" not in why
    assert not ctx.reports


def test_a_write_queued_behind_a_running_one_runs_after_it_and_the_waits_see_both():
    """A host-mate whose previous write still runs queues the next (local rank 0 decided for the host): the
    writer thread runs them in order, and stop_writing's wait covers the queued one too."""
    import threading

    from cloud_elastic.worker.durable.sharded import _Writes

    writes, order, release = _Writes(), [], threading.Event()
    writes.put(lambda: (release.wait(30), order.append("first")))
    writes.put(lambda: order.append("second"))
    assert not writes.idle and not writes.wait(0.2) and order == []  # the first holds the thread
    release.set()
    assert writes.wait(30) and writes.idle and order == ["first", "second"]
    writes.put(lambda: (_ for _ in ()).throw(CheckpointError("storage refused")))  # a failed write: logged
    writes.put(lambda: order.append("third"))  # and the thread goes on with the next
    assert writes.wait(30) and order == ["first", "second", "third"]
