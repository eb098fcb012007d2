"""The worker's commit ledger and its two seams: what the driver is told of the commits, which optimizer's
step makes a commit's copies (``CommitParticipant``), and which durable-checkpoint schedule a job gets.

Standalone mode (rank 0 of 1), as a script run with plain ``python`` gets.
"""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.commit.participant import CommitParticipant
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.durable.api import open_schedule
from cloud_elastic.worker.durable.rank_zero import RankZeroCheckpoints
from cloud_elastic.worker.durable.sharded import ShardedCheckpoints
from cloud_elastic.worker.ledger import CommitLedger
from cloud_elastic.worker.link.progress import Progress

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def standalone():
    hvd.init()


def _train(state, opt, steps: int, commit: bool = True) -> None:
    for i in range(steps):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(i))
        opt.zero_grad()
        F.mse_loss(state.model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        if commit:
            state.commit()


def test_the_ledger_reports_commits_and_the_steps_a_rollback_undid():
    progress = Progress()
    ledger = CommitLedger("auto", progress, "w")
    seen = []
    ledger.after_commit.append(seen.append)
    ledger.note_step()
    ledger.note_commit("state-1")
    assert (ledger.commits, ledger.commit_seq, ledger.live_commit_seq, seen) == (1, 1, 1, ["state-1"])
    ledger.note_step()
    ledger.note_step()
    ledger.note_rollback()  # two steps past commit 1 are lost, and the driver hears it at the next rendezvous
    assert (ledger.rolled_back, ledger.steps_since_commit, ledger.commit_seq) == (2, 0, 1)
    ledger.hold_commit(7)  # a sync gave this worker rank 0's commit 7
    ledger.note_commit()
    assert (ledger.commits, ledger.commit_seq, ledger.holds_commit) == (2, 8, True)
    assert progress.steps == 3


def test_a_lost_commit_is_said_once_and_the_next_commit_holds_again(caplog):
    ledger = CommitLedger("auto", Progress(), "w")
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.worker.ledger"):
        ledger.lost_commit("the parameters were updated")
        ledger.lost_commit("the parameters were updated")
    assert caplog.text.count("cannot restore the last commit exactly") == 1
    assert not ledger.holds_commit
    ledger.note_commit()
    assert ledger.holds_commit


def test_a_commit_of_torch_state_is_what_the_context_reports():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    ledger = get_context().ledger
    before = ledger.commits
    _train(state, opt, 3)
    assert ledger.commits == before + 3 and get_context().commits == ledger.commits
    assert get_context().commit_seq == ledger.commit_seq == ledger.live_commit_seq


def test_only_a_distributed_optimizer_takes_part_in_commits():
    model = torch.nn.Linear(4, 1)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    assert not isinstance(plain, CommitParticipant)
    wrapped = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(wrapped, CommitParticipant)
    state = hvd.elastic.TorchState(model, wrapped)
    assert [h.value for h in wrapped._ce_snapshots] == [model, wrapped]  # its step makes both commits' copies
    other = torch.nn.Linear(4, 1)
    plain_state = hvd.elastic.TorchState(other, torch.optim.SGD(other.parameters(), lr=0.1))
    assert not any(h.bound for h in plain_state._handlers.values())  # copied whole at each commit
    del state


def _ctx(tmp_path, *, standalone=False, checkpoint_dir=True, host_group=None):
    settings = SimpleNamespace(checkpoint_dir=str(tmp_path) if checkpoint_dir else None, checkpoint_interval_s=60.0,
                               checkpoint_keep=2, sharded_checkpoint_writes="background")
    return SimpleNamespace(standalone=standalone, settings=settings, host_group=host_group)


def test_a_job_gets_the_durable_schedule_its_training_needs(tmp_path):
    assert isinstance(open_schedule(_ctx(tmp_path)), RankZeroCheckpoints)  # rank 0 writes a replica's
    assert isinstance(open_schedule(_ctx(tmp_path, host_group=object())), ShardedCheckpoints)  # hvd.shard
    assert open_schedule(_ctx(tmp_path, checkpoint_dir=False)) is None  # no --checkpoint-dir
    assert open_schedule(_ctx(tmp_path, standalone=True)) is None  # plain python: no driver to resume from it


def test_a_job_without_checkpoints_does_not_load_the_checkpoint_code(tmp_path, monkeypatch):
    # Every worker opens its schedule as it starts; without --checkpoint-dir it must not import the checkpoint
    # package. None in sys.modules makes an import fail.
    monkeypatch.setitem(sys.modules, "cloud_elastic.worker.durable.rank_zero", None)
    assert open_schedule(_ctx(tmp_path, checkpoint_dir=False)) is None
    with pytest.raises(ImportError):  # what the import would have met: the test can see it
        open_schedule(_ctx(tmp_path))


def test_checkpoint_storage_imports_nothing_of_the_worker():
    """``checkpoint/`` is storage: the worker's schedules (``worker/durable``) use it, never the other way round."""
    from tests.unit.test_package_layout import import_graph

    reach = {m: sorted(t for t in targets if t.startswith("cloud_elastic.worker"))
             for m, targets in import_graph().items() if m.startswith("cloud_elastic.checkpoint")}
    assert not {m: t for m, t in reach.items() if t}
