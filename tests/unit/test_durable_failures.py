"""Durable checkpoints that cannot be kept end the job in one line, once, instead of training on without them.

* A ``--checkpoint-dir`` this worker sees apart from the driver's (a plain path on a disk of its own, not a
  shared mount): rank 0 finds no record of its job there before its first write or load, and says so.
* A state value a commit accepts is one a checkpoint holds (one definition, ``plain_numpy.LEAVES``; with
  ``--checkpoint-dir`` no allowlisted class); a payload the checkpoint still refuses is a checkpoint failure
  reported to the driver (by every worker of host 0 with ``hvd.shard``), not a crash that re-forms the job
  forever. A checkpoint holding a frozenset is of a newer format, which older readers refuse as such.
* Storage that stalls delays the job record's check on the writer's thread, never the commit.

Rank 0's schedule on a fake worker context (its reports recorded); real stores: a directory, fsspec's memory://.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import threading
import uuid
from types import SimpleNamespace

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

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
    # "writing" (the commit a write is about to publish: test_checkpoint_heard_before_written) apart, with the count
    # of the other reports sent before it: each of those comes before that write's "saved".
    ctx.writing = []
    ctx.report_checkpoint = lambda event, **fields: (ctx.writing.append((len(reports), fields)) if event == "writing"
                                                     else reports.append((event, fields)))
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
    schedule = _schedule(url, ctx)
    schedule.after_commit(_State(step=1, w=torch.ones(2)))  # the record is read on the writer's thread...
    assert schedule._writer.wait(30)
    line = UNSHARED.format(url=url)
    assert ctx.reports == [("failed", {"failure": "storage", "reason": line})]  # ...which tells the driver at once
    with pytest.raises(CheckpointFailed) as failed:  # and the training thread stops at its next commit
        schedule.after_commit(_State(step=2, w=torch.ones(2)))
    assert str(failed.value) == line and failed.value.failure == "storage" and len(ctx.reports) == 1
    assert schedule.stop_writing(30)
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
    assert ctx.writing == [(0, {"step": 1, "commit_seq": 1})]  # heard of before the "saved" (index 0) was sent
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


def test_a_negative_step_ends_the_job_at_the_first_commit_in_one_line_and_no_store_takes_it(tmp_path):
    url = str(tmp_path / "ckpt")
    _record(url)
    ctx = _ctx()
    line = ("cannot checkpoint step -1: a checkpoint's step must be 0 or more (the state's integer step attribute, "
            "else its number of commits)")
    with pytest.raises(CheckpointFailed) as failed:  # before: written under a name no reader matches, never loaded
        _schedule(url, ctx).after_commit(_State(step=-1, w=torch.ones(2)))
    assert [(e, f["failure"], f["reason"]) for e, f in ctx.reports] == [("failed", "write", line)]
    assert str(failed.value) == f"cannot write the checkpoints --checkpoint-dir asks for: {line}"
    store = CheckpointStore(url)
    for write in (lambda: store.save(-1, {"w": torch.ones(2)}), lambda: store.reserve(-1)):
        with pytest.raises(CheckpointError, match=r"^cannot checkpoint step -1: .*0 or more"):
            write()
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-")] == []
    # hvd.shard's host 0 ends the job with the same line.
    from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx as _sharded_ctx, _state

    sharded, ctx = _state(), _sharded_ctx()
    sharded.step = -1
    with pytest.raises(CheckpointFailed) as failed:
        _checkpoints(tmp_path / "sharded", ctx).after_commit(sharded)
    assert (failed.value.failure, str(failed.value)) == ("write", f"cannot write the checkpoints --checkpoint-dir "
                                                                  f"asks for: {line}")


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


@dataclasses.dataclass
class _Stats:
    best: float = 0.0


@pytest.fixture
def allowlisted_stats():
    """``_Stats`` allowed with torch.serialization.add_safe_globals, as a sync's refusal tells the user to do."""
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([_Stats])
    yield
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(before)


def test_with_checkpoint_dir_a_commit_refuses_an_allowlisted_class_that_no_checkpoint_holds(allowlisted_stats,
                                                                                           monkeypatch):
    from cloud_elastic.checkpoint.payload import check_payload
    from cloud_elastic.worker.comm.statecodec import StateSyncError
    from cloud_elastic.worker.settings import CHECKPOINT_DIR_ENV

    monkeypatch.delenv(CHECKPOINT_DIR_ENV, raising=False)
    check_attributes({"stats": _Stats(1.5)})  # without --checkpoint-dir a sync carries it
    with pytest.raises(CheckpointError, match=r"cannot checkpoint the .*_Stats at payload\['stats'\]"):
        check_payload({"stats": _Stats(1.5)})  # which a checkpoint never holds: it loads without running code
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, "s3://b/ckpt")
    with pytest.raises(StateSyncError) as refused:  # before: accepted, and the job ended at rank 0's checkpoint
        check_attributes({"stats": _Stats(1.5)})
    assert str(refused.value) == (
        f"state.stats holds a {__name__}._Stats, which the job's checkpoints (--checkpoint-dir) cannot hold: keep "
        "numbers, strings, tensors, numeric numpy values, lists, tuples, sets and dicts in elastic state (a class "
        "allowed with torch.serialization.add_safe_globals is carried by a state sync, not by a checkpoint)")
    values = _every_kind()
    check_attributes(values)  # what a commit still accepts, a checkpoint holds
    check_payload(state_payload(_State(**values)))


def test_a_sharded_payload_the_checkpoint_refuses_ends_the_job_on_every_worker_of_host_0_before_any_queues(
        tmp_path, monkeypatch):
    """Local rank 0 decides for the host; before, its host-mates queued a DCP save that waited for it (which never
    came) until the group's timeout, one more each interval."""
    from cloud_elastic.worker.durable import sharded as sharded_module
    from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx as _sharded_ctx, _state, _train

    state = _state()
    _train(state, 1)
    state.note = _Stats()  # a value the checkpoint refuses (here past commit's check: it is not committed)
    answers, ctx = [], _sharded_ctx()
    real = sharded_module._from_local_rank_0
    monkeypatch.setattr(sharded_module, "_from_local_rank_0",
                        lambda obj, root, device: answers.append(real(obj, root, device)) or answers[-1])
    durable = _checkpoints(tmp_path, ctx)
    with pytest.raises(CheckpointFailed) as failed:
        durable.after_commit(state)  # local rank 0
    line = f"cannot write the checkpoints --checkpoint-dir asks for: cannot checkpoint the {__name__}._Stats at " \
           "payload['note']: a checkpoint holds only tensors and plain data (dict, list, tuple, set, str, bytes, " \
           "int, float, bool, None), which load without running code"
    assert (failed.value.failure, str(failed.value)) == ("write", line)
    assert [e for e, _ in ctx.reports] == ["failed"]
    # A host-mate (local rank 1) hears local rank 0's answer, and stops with the same line, having queued nothing.
    mate = _sharded_ctx()
    mate.info.local_rank, mate.info.local_size, mate.info.rank = 1, 2, 1
    monkeypatch.setattr(sharded_module, "_from_local_rank_0", lambda obj, root, device: answers[-1])
    other = _checkpoints(tmp_path, mate)
    with pytest.raises(CheckpointFailed) as mates:
        other.after_commit(state)
    assert (mates.value.failure, str(mates.value)) == ("write", line) and other._writes.idle
    assert durable._writes.idle and CheckpointStore(str(tmp_path / "ckpt")).list() == []


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
    real, broken, reads = store_module.read_job_record, [True], []

    def read(store):
        reads.append(1)
        if broken[0]:
            raise CheckpointError(NO_CREDENTIALS)
        return real(store)

    monkeypatch.setattr(store_module, "read_job_record", read)
    now, ctx = [0.0], _ctx()
    schedule = RankZeroCheckpoints(DurableSettings(url, interval_s=60.0), ctx, clock=lambda: now[0])
    state = _State(step=1, w=torch.ones(2))
    schedule.after_commit(state)  # the first checkpoint: the writer reads the record first, and fails
    assert schedule._writer.wait(30) and reads == [1]
    now[0], state.step = 1.0, 2
    schedule.after_commit(state)  # the next commit tells the driver
    assert ctx.reports == [("not_written", {"reason": NO_CREDENTIALS})]
    now[0], state.step = 59.0, 3
    schedule.after_commit(state)  # before: a read, and a warning, at every commit
    assert schedule._writer.wait(30) and len(ctx.reports) == 1 and reads == [1]
    now[0], state.step = 61.0, 4
    schedule.after_commit(state)  # the next checkpoint, one interval later, reads it again
    assert schedule._writer.wait(30) and reads == [1, 1]
    now[0], state.step = 62.0, 5
    schedule.after_commit(state)
    assert ctx.reports[1:] == [("not_written", {"reason": NO_CREDENTIALS})]
    broken[0], now[0], state.step = False, 122.0, 6  # the credentials came
    schedule.after_commit(state)
    assert schedule.stop_writing(30) and [(e, f.get("step")) for e, f in ctx.reports[2:]] == [("saved", 6)]


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


# ------------------------------------------------- storage that stalls: the commit does not wait for the check
class _StalledMemory(MemoryFileSystem):
    """fsspec's memory filesystem, but a read of ``job.json`` blocks until :attr:`answer` is set (bounded: a
    failing test ends), as an S3 endpoint that accepts the connection and does not answer."""

    protocol, root_marker = ("stalled-memory",), ""
    store: dict = {}
    pseudo_dirs = [""]
    answer, reading, answered = threading.Event(), threading.Event(), threading.Event()

    @classmethod
    def _strip_protocol(cls, path):
        return str(path).removeprefix("stalled-memory://").strip("/")

    def cat_file(self, path, start=None, end=None, **kwargs):
        if str(path).endswith("job.json"):
            self.reading.set()
            self.answer.wait(10)
            self.answered.set()
        return super().cat_file(path, start=start, end=end, **kwargs)


@pytest.fixture
def stalled_url():
    """A store on :class:`_StalledMemory` holding this job's record; its reads of it wait until answered."""
    fsspec.register_implementation("stalled-memory", _StalledMemory, clobber=True)
    for event in (_StalledMemory.answer, _StalledMemory.reading, _StalledMemory.answered):
        event.clear()
    url = f"stalled-memory://ce-{uuid.uuid4().hex}/ckpt"
    _record(url)
    yield url
    _StalledMemory.answer.set()  # no read left waiting


def test_a_commit_does_not_wait_for_storage_that_stalls_on_the_job_record(stalled_url):
    ctx = _ctx()
    schedule = _schedule(stalled_url, ctx)
    state = _State(step=1, w=torch.ones(2))
    schedule.after_commit(state)  # before: this commit waited for the storage's answer
    state.step = 2
    schedule.after_commit(state)
    assert _StalledMemory.reading.wait(20) and not _StalledMemory.answered.is_set()  # returned while the read waits
    assert ctx.reports == [] and schedule._writer.busy
    _StalledMemory.answer.set()  # the storage answers: the record is this job's, the checkpoint is written
    assert schedule.stop_writing(30) and [(e, f["step"]) for e, f in ctx.reports] == [("saved", 1)]


def test_a_load_waits_for_storage_that_stalls_on_the_job_record_a_bounded_time(stalled_url, monkeypatch):
    """Loading must wait for storage, but not for ever (s3fs's timeouts and retries add up to tens of minutes):
    past the bound the load fails in one line, as for storage that cannot be read."""
    from cloud_elastic.worker.durable import failure

    url = stalled_url
    monkeypatch.setattr(failure, "RECORD_WAIT_S", 0.2)
    with pytest.raises(CheckpointError) as failed:
        _schedule(url, ctx := _ctx()).load_latest(_State(step=0, w=torch.zeros(2)))
    assert not _StalledMemory.answered.is_set()  # before: the load waited for the storage's answer
    assert str(failed.value) == f"the job record in {url} did not come within 0.2s: the storage does not answer"
    assert not isinstance(failed.value, CheckpointFailed) and ctx.reports == []


@pytest.mark.parametrize("tags, version", [(frozenset({"a", (1, 2)}), 3), (("a", (1, 2)), 1)],
                         ids=["frozenset", "tuple"])
def test_only_a_checkpoint_holding_a_frozenset_is_of_the_newer_format_which_older_readers_refuse_as_such(
        tmp_path, monkeypatch, tags, version):
    url = str(tmp_path / "ckpt")
    info = CheckpointStore(url).save(1, state_payload(_State(tags=tags, w=torch.ones(2))))
    assert info.format_version == version  # before: 1 for both
    fresh = _State(tags=None, w=torch.zeros(2))
    load_state_payload(fresh, CheckpointStore(url).latest().payload)  # this cloud-elastic reads both
    assert type(fresh.tags) is type(tags) and fresh.tags == tags
    monkeypatch.setattr(store_module, "READ_VERSION", 2)  # the reader of the cloud-elastic before frozensets
    older = CheckpointStore(url)
    if version == 1:  # every other checkpoint stays readable by it
        assert older.latest().info.step == 1
    else:  # refused as of a newer format (the driver then refuses to start over), not loaded and called forged
        assert older.latest() is None and older.unreadable() == [
            (info.name, "unreadable manifest: format version 3 is newer than this cloud-elastic reads (2)")]

def test_a_sharded_checkpoint_holding_a_frozenset_is_of_the_newer_format_and_loads_back(tmp_path):
    from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx as _sharded_ctx, _state, _train

    state = _state()
    state.note = frozenset({"x"})
    _train(state, 1)
    assert _checkpoints(tmp_path, _sharded_ctx()).finish(state) is None
    [info] = CheckpointStore(str(tmp_path / "ckpt")).list()
    assert info.format_version == 3 and info.shards  # before: 2, which a reader from before frozensets loads
    other = _state(seed=1)
    other.note = None
    assert _checkpoints(tmp_path, _sharded_ctx()).load_latest(other).step == 1 and other.note == frozenset({"x"})
