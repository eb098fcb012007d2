"""Durable checkpoints that cannot be kept end the job in one line, once, instead of training on without them.

* A ``--checkpoint-dir`` this worker sees apart from the driver's (a plain path on a disk of its own, not a
  shared mount): rank 0 finds no record of its job there before its first write or load, and says so.
* A state value a commit accepts is one a checkpoint holds (one definition, ``plain_numpy.LEAVES``); a
  payload the checkpoint still refuses is a checkpoint failure reported to the driver, not a crash that
  re-forms the job forever.

Rank 0's schedule on a fake worker context (its reports recorded); real stores: a directory, fsspec's memory://.
"""

from __future__ import annotations

import collections
import copy
import uuid
from types import SimpleNamespace

import pytest
import torch

from cloud_elastic import plain_numpy
from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, load_state_payload, state_payload
from cloud_elastic.checkpoint.api import CheckpointError
from cloud_elastic.checkpoint import store as store_module
from cloud_elastic.checkpoint.store import write_job_record
from cloud_elastic.protocol_reports import CheckpointReport
from cloud_elastic.worker.comm.statecodec import check_attributes
from cloud_elastic.worker.durable.failure import CheckpointFailed
from cloud_elastic.worker.durable.rank_zero import DurableSettings, RankZeroCheckpoints

pytestmark = pytest.mark.timeout(60)

UNSHARED = ("--checkpoint-dir {url} as this worker on 10.0.0.7 sees it holds no record of job job-1: the driver "
            "and every worker must see the same storage (an fsspec URL such as s3://..., or a mount shared by all "
            "hosts)")


class _State:
    """Plain attributes, as ``ObjectState`` keeps them; ``restore``/``save`` as ``load_state_payload`` calls them."""

    def __init__(self, **values) -> None:
        self.__dict__.update(values)

    def restore(self) -> None:
        pass

    def save(self) -> None:
        pass


def _ctx(job_id: str = "job-1") -> SimpleNamespace:
    reports: list[tuple[str, dict]] = []
    ctx = SimpleNamespace(info=SimpleNamespace(rank=0, size=2), job_id=job_id, worker_id="10.0.0.7[0]#1",
                          hostname="10.0.0.7", driver_lost=False, reports=reports,
                          ledger=SimpleNamespace(commit_seq=1, held=[]))
    ctx.report_checkpoint = lambda event, **fields: reports.append((event, fields))
    ctx.ledger.hold_commit = ctx.ledger.held.append
    return ctx


def _schedule(url: str, ctx: SimpleNamespace) -> RankZeroCheckpoints:
    return RankZeroCheckpoints(DurableSettings(url, interval_s=60.0), ctx)


def _record(url: str, job_id: str = "job-1") -> None:
    write_job_record(CheckpointStore(url), DurableJobRecord(job_id, ("python", "train.py"), 0.0), only_if_absent=True)


@pytest.mark.parametrize("where", ["directory", "memory"])
@pytest.mark.parametrize("record", [None, "job-0"], ids=["no-record", "another-jobs-record"])
def test_storage_apart_from_the_drivers_ends_the_job_before_rank_0_writes_or_loads(tmp_path, where, record):
    url = str(tmp_path / "ckpt") if where == "directory" else f"memory://ce-{uuid.uuid4().hex}/ckpt"
    if record is not None:
        _record(url, record)
    ctx = _ctx()
    with pytest.raises(CheckpointFailed) as failed:
        _schedule(url, ctx).after_commit(_State(step=1, w=torch.ones(2)))
    line = UNSHARED.format(url=url)
    assert str(failed.value) == line and failed.value.failure == "storage"
    assert ctx.reports == [("failed", {"failure": "storage", "reason": line})]
    assert CheckpointReport.from_wire({"event": "failed", **ctx.reports[0][1]}).ending() == line  # the driver's
    assert CheckpointStore(url).list() == []  # nothing written where the driver never looks
    with pytest.raises(CheckpointFailed, match="holds no record of job job-1"):  # nor loaded from there
        _schedule(url, _ctx()).load_latest(_State(step=0, w=torch.zeros(2)))


def test_the_drivers_record_is_read_once_and_rank_0_then_writes_and_loads(tmp_path, monkeypatch):
    url = f"memory://ce-{uuid.uuid4().hex}/ckpt"
    _record(url)
    reads = []
    real = store_module.read_job_record
    monkeypatch.setattr(store_module, "read_job_record", lambda store: (reads.append(store.url), real(store))[1])
    ctx = _ctx()
    schedule = _schedule(url, ctx)
    state = _State(step=1, w=torch.ones(2))
    schedule.after_commit(state)
    state.step = 2
    schedule.after_commit(state)  # not due (60 s interval): no second read either
    assert schedule.stop_writing(30)
    assert reads == [url] and [(e, f["step"]) for e, f in ctx.reports] == [("saved", 1)]
    fresh = _State(step=0, w=torch.zeros(2))
    assert schedule.load_latest(fresh).step == 1 and fresh.step == 1 and torch.equal(fresh.w, state.w)
    schedule.after_commit(fresh)  # rank 0 again after the load: its writer starts anew
    assert schedule.stop_writing(30) and len(ctx.reports) == 3 and reads == [url]  # saved, loaded, saved: one read


def test_a_payload_the_checkpoint_refuses_is_reported_as_a_failed_write_in_one_line(tmp_path):
    url = str(tmp_path / "ckpt")
    _record(url)
    ctx = _ctx()
    with pytest.raises(CheckpointFailed) as failed:  # before: a bare CheckpointError that crashed rank 0
        _schedule(url, ctx).after_commit(_State(step=1, thing=object()))
    [(event, fields)] = ctx.reports
    assert (event, fields["failure"]) == ("failed", "write") and "cannot checkpoint the object at" in fields["reason"]
    assert str(failed.value) == f"cannot write the checkpoints --checkpoint-dir asks for: {fields['reason']}"
    assert "\n" not in str(failed.value) and CheckpointStore(url).list() == []


def _every_kind() -> dict:
    """One value of each leaf and container a commit accepts (plain_numpy.LEAVES, DICTS, SEQUENCES)."""
    return {
        "none": None, "flag": True, "n": 3, "x": 0.5, "z": 1j, "name": "a", "raw": b"\x00", "buf": bytearray(b"xy"),
        "dtype": torch.float16, "device": torch.device("cpu"), "layout": torch.strided, "size": torch.Size([2]),
        "tags": frozenset({"a", (1, 2)}), "keys": {frozenset({1}): {3}}, "ordered": collections.OrderedDict(a=[1]),
        "counts": collections.Counter(a=2), "pair": (1, 2.0), "items": [1], "bag": {2}, "w": torch.arange(3.0),
        "p": torch.nn.Parameter(torch.ones(1)),
    }


def test_every_value_a_commit_accepts_a_checkpoint_holds_and_gives_back(tmp_path):
    values = _every_kind()
    kinds = {type(v) for v in values.values()} | {type(k) for v in values.values() if isinstance(v, dict) for k in v}
    assert set(plain_numpy.LEAVES) | set(plain_numpy.DICTS) | set(plain_numpy.SEQUENCES) <= kinds  # nothing untried
    check_attributes(values)  # what a commit accepts...
    url = str(tmp_path / "ckpt")
    _record(url)
    schedule = _schedule(url, ctx := _ctx())
    expected = copy.deepcopy(values)
    schedule.after_commit(_State(step=1, **values))  # ...rank 0 checkpoints (before: frozenset, bytearray refused)
    values["buf"][0] = 0  # training goes on: the checkpoint holds the commit's copy
    assert schedule.stop_writing(30) and [e for e, _ in ctx.reports] == ["saved"]
    fresh = _State(step=None, **{name: None for name in values})
    load_state_payload(fresh, CheckpointStore(url).latest().payload)
    for name, value in expected.items():
        got = getattr(fresh, name)
        if isinstance(value, torch.Tensor):
            assert torch.equal(got, value), name
        else:
            assert type(got) is type(value) and got == value, name
    assert state_payload(_State(tags=values["tags"]))["tags"][1] == "frozenset"  # stored plain, as a tagged tuple


@pytest.mark.parametrize("failure, line", [
    (None, "training state lost: cannot resume from the checkpoint: why"),  # as workers sent it before
    ("load", "training state lost: cannot resume from the checkpoint: why"),
    ("write", "cannot write the checkpoints --checkpoint-dir asks for: why"),
    ("storage", "why"),  # the worker's line says it all (UNSHARED)
])
def test_the_driver_ends_the_job_with_the_line_that_fits_the_failure(failure, line):
    msg = {"event": "failed", "reason": "why", **({"failure": failure} if failure else {})}
    assert CheckpointReport.from_wire(msg).ending() == line


def test_a_report_of_an_unknown_failure_is_refused():
    from cloud_elastic.errors import ControlPlaneError

    with pytest.raises(ControlPlaneError, match="'failure' must be one of"):
        CheckpointReport.from_wire({"event": "failed", "reason": "why", "failure": "eaten"})


def test_a_checkpoint_failure_at_a_commit_ends_elastic_run_in_one_line(capsys, monkeypatch):
    import cloud_elastic.torch as hvd
    from cloud_elastic.worker import elastic
    from cloud_elastic.worker.context import init

    hvd.init()
    line = "cannot write the checkpoints --checkpoint-dir asks for: why"
    stopped = []
    monkeypatch.setattr(elastic, "_schedule", SimpleNamespace(stop_writing=lambda timeout=None: stopped.append(1)))
    monkeypatch.setattr(init().ledger, "after_commit", [lambda state: (_ for _ in ()).throw(
        CheckpointFailed("write", line))])  # rank 0's hook, once it has told the driver

    @hvd.elastic.run
    def train(state):
        state.commit()

    with pytest.raises(SystemExit) as exited:  # before: the CheckpointError's traceback, and the job re-formed
        train(hvd.elastic.ObjectState(epoch=0))
    assert exited.value.code == 1 and stopped == [1]
    assert capsys.readouterr().err.splitlines() == [f"cloud-elastic: {line}"]


def test_host_0_of_a_sharded_job_checks_the_store_before_it_writes_or_loads_too(tmp_path):
    from cloud_elastic.worker.durable.sharded import ShardedCheckpoints
    from tests.unit.test_sharded_checkpoint import _ctx as _sharded_ctx, _state, _train

    url = str(tmp_path / "ckpt")
    state, ctx = _state(), _sharded_ctx()
    _train(state, 1)
    line = UNSHARED.format(url=url).replace("10.0.0.7", "127.0.0.1")
    with pytest.raises(CheckpointFailed, match="holds no record of job job-1"):
        ShardedCheckpoints(DurableSettings(url), ctx).after_commit(state)
    assert ctx.reports == [("failed", {"failure": "storage", "reason": line})]
    assert CheckpointStore(url).list() == []
    with pytest.raises(CheckpointFailed, match="holds no record of job job-1"):
        ShardedCheckpoints(DurableSettings(url), _sharded_ctx()).load_latest(_state(seed=1))


# ------------------------------------------------- attempts that fail but may pass: the driver hears of each
NO_CREDENTIALS = "could not read s3://b/ckpt/job.json: Unable to locate credentials"


def test_a_job_record_rank_0_cannot_read_is_reported_at_each_attempt_one_interval_apart(tmp_path, monkeypatch):
    url = str(tmp_path / "ckpt")
    _record(url)
    real, broken = store_module.read_job_record, [True]

    def read(store):
        if broken[0]:
            raise CheckpointError(NO_CREDENTIALS)
        return real(store)

    monkeypatch.setattr(store_module, "read_job_record", read)
    now, ctx = [0.0], _ctx()
    schedule = RankZeroCheckpoints(DurableSettings(url, interval_s=60.0), ctx, clock=lambda: now[0])
    state = _State(step=1, w=torch.ones(2))
    schedule.after_commit(state)
    assert ctx.reports == [("not_written", {"reason": NO_CREDENTIALS, "step": 1})]
    now[0], state.step = 59.0, 2
    schedule.after_commit(state)  # before: a read, and a warning, at every commit
    assert len(ctx.reports) == 1
    now[0], state.step = 61.0, 3
    schedule.after_commit(state)
    assert ctx.reports[1:] == [("not_written", {"reason": NO_CREDENTIALS, "step": 3})]
    broken[0], now[0], state.step = False, 122.0, 4  # the credentials came
    schedule.after_commit(state)
    assert schedule.stop_writing(30) and [(e, f.get("step")) for e, f in ctx.reports[2:]] == [("saved", 4)]


def test_a_checkpoint_write_that_fails_in_the_background_is_reported_at_the_next_commit(tmp_path, monkeypatch):
    url = str(tmp_path / "ckpt")
    _record(url)
    ctx = _ctx()
    schedule = _schedule(url, ctx)

    def save(*args, **kwargs):
        raise OSError("AccessDenied: s3:PutObject")

    monkeypatch.setattr(schedule.store, "save", save)
    state = _State(step=1, w=torch.ones(2))
    schedule.after_commit(state)
    assert schedule._writer.wait(30) and ctx.reports == []
    state.step = 2
    schedule.after_commit(state)
    schedule.after_commit(state)  # reported once
    assert ctx.reports == [("not_written", {"reason": "AccessDenied: s3:PutObject"})]
    assert schedule.stop_writing(30)
