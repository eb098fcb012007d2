"""Resuming a sharded model (``hvd.shard``) from its DCP checkpoint when the optimizer's state does not cover
exactly its trainable parameters, when the shards do not fit, and when a host-mate is lost during the load.

One standalone process (one host of one worker), as ``test_sharded_checkpoint``; what the driver and the
other workers would do is faked where it must be (the round's abort, the rendezvous).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import cloud_elastic.torch as hvd
import cloud_elastic.worker.durable.sharded as sharded_checkpoints
from cloud_elastic.errors import CheckpointError
from cloud_elastic.worker import elastic, sharded
from cloud_elastic.worker.exceptions import CollectiveError, WorkerRemoved
from cloud_elastic.worker.ledger import CommitLedger
from cloud_elastic.worker.link.progress import Progress
from tests.unit.test_sharded_checkpoint import _checkpoints, _ctx, _train

pytestmark = pytest.mark.timeout(90)


class _Net(torch.nn.Module):
    """A trunk and an auxiliary head that this training never reaches: the head gets no gradient, so no
    optimizer state, yet it is trainable."""

    def __init__(self, width: int = 16, extra: bool = False) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
        self.aux = torch.nn.Linear(width, 3)
        self.extra = torch.nn.Linear(2, 2) if extra else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk(x)


def _state(width: int = 16, seed: int = 0, extra: bool = False):
    hvd.init()
    torch.manual_seed(seed)
    model = _Net(width, extra)
    hvd.shard(model, modules=[model.trunk[0], model.trunk[2], model.aux])
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1))
    return hvd.elastic.TorchState(model, opt, step=0)


def _everything(state) -> dict[str, torch.Tensor]:
    """Every parameter and every optimizer state value, by name: what a resume must give back bit for bit."""
    out = {name: sharded.local(p).clone() for name, p in state.model.named_parameters()}
    for name, p in state.model.named_parameters():
        for key, value in state.optimizer.state.get(p, {}).items():
            out[f"{name}/{key}"] = sharded.local(value).clone()
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _written(tmp_path, steps: int = 2):
    state = _state()
    _train(state, steps)
    ctx = _ctx()
    ctx.ledger.commit_seq = steps
    assert _checkpoints(tmp_path, ctx).finish(state) is None
    return state


def test_a_trainable_parameter_without_optimizer_state_resumes_and_trains_on_as_if_never_stopped(tmp_path):
    written = _written(tmp_path)
    assert not written.optimizer.state.get(written.model.aux.weight)  # no gradient yet: no AdamW state

    resumed = _state(seed=7)
    assert _checkpoints(tmp_path, (ctx := _ctx())).load_latest(resumed).step == 2
    assert ctx.ledger.held == [2]
    assert _same(_everything(resumed), _everything(written))
    _train(written, 1)
    _train(resumed, 1)
    assert _same(_everything(resumed), _everything(written))
    assert float(resumed.optimizer.state[resumed.model.trunk[0].weight]["step"]) == 3.0


def test_an_optimizer_whose_state_was_read_before_the_resume_still_gets_the_checkpoints_state(tmp_path):
    written = _written(tmp_path)
    resumed = _state(seed=7)
    for p in resumed.model.parameters():
        assert not resumed.optimizer.state[p]  # reading it makes an empty entry, as a script's logging may

    _checkpoints(tmp_path, _ctx()).load_latest(resumed)
    assert _same(_everything(resumed), _everything(written))
    assert float(resumed.optimizer.state[resumed.model.trunk[2].weight]["step"]) == 2.0


@pytest.mark.parametrize("changed, says", [
    (dict(width=8), "Size mismatch between saved torch.Size([16, 6]) and current: torch.Size([8, 6]) for "
                    "model.trunk.0.weight"),
    (dict(extra=True), "Missing key in checkpoint state_dict: model.extra.weight"),
])
def test_shards_that_do_not_fit_say_which_item_in_one_line(tmp_path, changed, says):
    _written(tmp_path)
    with pytest.raises(CheckpointError) as raised:
        _checkpoints(tmp_path, _ctx()).load_latest(_state(**changed))
    message = str(raised.value)
    assert "does not fit this training state" in message and says in message
    assert "Traceback" not in message and "\n" not in message


def _job_ctx(aborted: bool) -> SimpleNamespace:
    """:func:`_ctx` as a worker of a job's round: a host's group, the driver's abort of the round, a real ledger."""
    ctx = _ctx()
    ctx.info.round = 3
    ctx.standalone, ctx.host_group, ctx.heartbeat_timeout_s = False, object(), 0.05
    ctx._aborted = lambda round_: aborted and round_ == 3
    ctx.abandoned = []
    ctx._abandon_round = lambda: ctx.abandoned.append(3)
    ctx.ledger = CommitLedger("auto", Progress(), ctx.worker_id)
    return ctx


_RESET = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:20612: Connection reset by peer"


@pytest.mark.commit_mode("snapshot")  # the partly loaded shards are rolled back exactly
@pytest.mark.parametrize("where", ["in DCP's load, this worker's shards read", "in the host's vote before it"])
def test_a_host_mate_lost_during_the_load_sends_this_host_away_holding_no_commit(tmp_path, monkeypatch, where):
    _written(tmp_path)
    fresh = _state(seed=7)
    initial = _everything(fresh)

    def cut_short(tensors, storage):  # this worker's shards are read, then a host-mate's death fails DCP's collective
        load(tensors, storage)
        raise RuntimeError(_RESET)

    def vote_fails(self, trouble):
        raise RuntimeError(_RESET)

    load = sharded_checkpoints._load
    if where.startswith("in DCP"):
        monkeypatch.setattr(sharded_checkpoints, "_load", cut_short)
    else:
        monkeypatch.setattr(sharded_checkpoints.ShardedCheckpoints, "_worst", vote_fails)
    ctx = _job_ctx(aborted=True)
    with pytest.raises(CollectiveError, match="a worker of this host was lost"):
        _checkpoints(tmp_path, ctx).load_latest(fresh)
    assert ctx.abandoned == [3] and not any(event == "loaded" for event, _ in ctx.reports)
    # Its initial weights are back, and never pass for the job's trained state.
    assert _same(_everything(fresh), initial)
    assert ctx.ledger.holds_commit is False and ctx.ledger.commit_seq == 0


def test_the_same_failure_without_the_rounds_abort_is_not_taken_for_a_lost_peer(tmp_path, monkeypatch):
    _written(tmp_path)

    def fails(tensors, storage):
        raise RuntimeError("Connection reset by peer")

    monkeypatch.setattr(sharded_checkpoints, "_load", fails)
    with pytest.raises(CheckpointError, match="could not load the shards of .*: Connection reset by peer"):
        _checkpoints(tmp_path, _job_ctx(aborted=False)).load_latest(_state(seed=7))


def test_a_load_cut_short_makes_the_worker_rejoin_instead_of_ending_the_job(monkeypatch):
    """``elastic.run``: the CollectiveError of a load sends the worker to the next rendezvous (where the driver
    sends its host away), with no report that would end the job."""
    ledger = CommitLedger("auto", Progress(), "w")
    calls: list[str] = []
    ctx = SimpleNamespace(info=SimpleNamespace(from_checkpoint=True, cross_rank=0, rank=0), ledger=ledger,
                          standalone=False, join_if_pending=lambda: None, progress=SimpleNamespace(
                              watch_thread=lambda: None), report_checkpoint=lambda *a, **k: calls.append("report"))

    def rendezvous(reason: str):
        calls.append(f"rendezvous {reason}")
        raise WorkerRemoved("its host left")

    def load_latest(state):
        calls.append("load")
        raise CollectiveError("loading the checkpoint failed: a worker of this host was lost")

    ctx.rendezvous = rendezvous
    durable = SimpleNamespace(loads_here=lambda info: True, load_latest=load_latest)
    state = SimpleNamespace(restore=lambda: calls.append("restore"))
    monkeypatch.setattr(elastic, "init", lambda: ctx)
    monkeypatch.setattr(elastic, "_durable", lambda ctx: durable)
    with pytest.raises(WorkerRemoved):
        elastic._run(lambda state: None, state)
    assert calls == ["load", "restore", "rendezvous failure"]
