"""A round's NCCL group: a collective's wait returns as it is queued, so the abort that ends a lost peer's collective
comes from the heartbeat thread, and nothing an abort cut short is read, applied or committed (``rounds.on_device``).

No GPU here: the group is a stand-in for ``ProcessGroupNCCL`` of two whose peer is gone. Its collectives are queued
at once (their futures complete, their ``wait()`` returns), and the host's synchronization with the device blocks
until the communicator is aborted, as behind a kernel that waits on a dead peer. The worker context, its waits and
its round bookkeeping are the real ones. ``tests/gpu/test_multi_gpu.py`` runs the same on two GPUs.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest
import torch

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import RoundInfo, WorkerContext, get_context
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.rounds.groups import RoundGroup
from cloud_elastic.worker.settings import WorkerSettings
from torch._C._distributed_c10d import ErrorType

pytestmark = pytest.mark.timeout(30)


class _Work:
    """An NCCL collective as the host sees it: queued at once; the device finishes it when ``pg.finished`` is set."""

    def __init__(self, pg: "_Nccl") -> None:
        self.pg = pg

    def wait(self, timeout=None) -> bool:  # NCCL's: the current stream waits for it, not the host
        return True

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(None)  # as ProcessGroupNCCL's: complete once queued
        return fut


class _Nccl:
    """A stand-in for an NCCL process group of two whose peer is gone: its collectives end when it is aborted."""

    def __init__(self, peer_alive: bool = False) -> None:
        self.aborts: list[str] = []
        self.finished = threading.Event()
        if peer_alive:
            self.finished.set()
        #: What ``ProcessGroupNCCL.get_error`` says: TIMEOUT once its own watchdog aborted it.
        self.error = ErrorType.SUCCESS

    def allreduce(self, tensors, opts=None) -> _Work:
        return _Work(self)

    def _get_backend(self, device) -> "_Nccl":
        return self

    def get_error(self) -> ErrorType:
        return self.error

    def abort(self) -> None:
        self.aborts.append(threading.current_thread().name)
        self.finished.set()


@pytest.fixture(autouse=True)
def device(monkeypatch):
    """The host's wait for the device: it returns once the stand-in's collectives have ended."""
    from cloud_elastic.worker.rounds import on_device

    current: list[Any] = []

    def synchronize(dev) -> None:
        if current and isinstance(current[-1], Exception):
            raise current[-1]
        if current and not current[-1].finished.wait(20):
            raise AssertionError("nothing ended the collective: it would have waited for NCCL's timeout")

    monkeypatch.setattr(on_device, "_synchronize", synchronize)
    return current


def _context(pg: _Nccl, backend: str = "nccl", round_: int = 3, size: int = 2) -> WorkerContext:
    ctx = WorkerContext(WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address="127.0.0.1:1", job_id="j", worker_id="w",
        hostname="127.0.0.1", secret="s" * 64, backend="gloo", collective_timeout_s=30.0, malloc_tuning=False,
    ))
    group = RoundGroup(pg, object(), None, backend, torch.device("cpu"), size)
    group.round = round_
    ctx._group = group
    ctx.info = RoundInfo(0, size, 0, 1, 0, size, round=round_, needs_sync=False, update_gen=0)
    return ctx


def _heartbeat_brings_the_abort(ctx: WorkerContext, after_s: float = 0.3) -> threading.Timer:
    """What the heartbeat thread does with a reply that says the round was aborted (``DriverLinkMixin``)."""
    def beat() -> None:
        ctx._seen_abort = ctx.info.round
        ctx.abort_lost_round()

    timer = threading.Timer(after_s, beat)
    timer.start()
    return timer


def test_a_collective_blocked_on_a_lost_peer_is_ended_by_the_heartbeat_threads_abort(device):
    pg = _Nccl()
    device.append(pg)
    ctx = _context(pg)
    _heartbeat_brings_the_abort(ctx)
    started = time.monotonic()
    with pytest.raises(CollectiveError, match="membership check abandoned: the driver aborted round 3"):
        ctx.wait(ctx.pg.allreduce([torch.ones(1)]), "membership check")
    assert time.monotonic() - started < 5
    assert pg.aborts == ["cloud-elastic-nccl-abort"]  # once, off the heartbeat thread (which must go on beating)
    assert ctx._group.quiesced  # the training thread waited for the device before it rolls back


def test_a_collective_that_finished_before_the_abort_is_whole():
    pg = _Nccl(peer_alive=True)
    ctx = _context(pg)
    ctx.wait(ctx.pg.allreduce([torch.ones(1)]), "membership check")  # no abort: the result is read as it is
    ctx._seen_abort = 3  # the abort arrives once it finished: the next collective fails, this one stands
    ctx.abort_lost_round()
    deadline = time.monotonic() + 5
    while not pg.aborts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pg.aborts
    with pytest.raises(CollectiveError, match="not started: the driver aborted round 3"):
        ctx.group("the next allreduce")


def test_the_gradients_wait_stays_on_the_device_and_the_update_is_confirmed_first(device):
    pg = _Nccl()
    device.append(pg)
    ctx = _context(pg)
    ctx.wait(ctx.pg.allreduce([torch.ones(1)]), "gradient allreduce", host=False)  # returns as NCCL queued it
    assert not pg.finished.is_set()
    _heartbeat_brings_the_abort(ctx)  # while the confirmation waits for the device
    with pytest.raises(CollectiveError, match="the commit not confirmed: the driver aborted round 3"):
        ctx.confirm_on_device("the commit")


def test_a_confirmation_without_an_abort_passes_and_gloo_or_a_group_of_one_are_left_alone():
    _context(_Nccl(peer_alive=True)).confirm_on_device("the commit")
    late = _context(_Nccl(peer_alive=True))
    late._seen_abort = 3  # the driver's abort, which the group has not met: what finished is whole
    late.confirm_on_device("the commit")
    with pytest.raises(CollectiveError, match="not started"):
        late.group("the next allreduce")  # and the round's next collective fails
    for ctx in (_context(_Nccl(), backend="gloo"), _context(_Nccl(), size=1)):  # one: no peer to lose
        ctx._seen_abort = 3
        ctx.abort_lost_round()
        ctx.confirm_on_device("the commit")  # Gloo's waits already failed where an abort mattered
        time.sleep(0.1)
        assert ctx._group.pg.aborts == []


def test_the_heartbeat_thread_aborts_only_the_round_the_driver_aborted():
    pg = _Nccl()
    ctx = _context(pg, round_=4)  # the worker has moved on to round 4; the driver's abort is round 3's
    ctx._seen_abort = 3
    ctx.abort_lost_round()
    time.sleep(0.2)
    assert pg.aborts == []
    ctx.dismissed = True  # every round is over for it
    ctx.abort_lost_round()
    deadline = time.monotonic() + 5
    while not pg.aborts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pg.aborts == ["cloud-elastic-nccl-abort"]


# ------------------------------------------------------------------ a training step and a commit
@pytest.fixture
def nccl_member(monkeypatch):
    """The process's standalone context, made a member of an NCCL round of two whose peer is gone (the stand-in above).

    What ran before it (a few steps and commits of the common loop) ran standalone on Gloo, as usual.
    """
    import dataclasses

    hvd.init()
    ctx = get_context()

    def join(peer_alive: bool = False) -> _Nccl:
        pg = _Nccl(peer_alive)
        group = RoundGroup(pg, object(), None, "nccl", torch.device("cpu"), 2)
        group.round = ctx.info.round
        monkeypatch.setattr(ctx, "_group", group)
        monkeypatch.setattr(ctx, "info", dataclasses.replace(ctx.info, size=2, cross_size=2))
        monkeypatch.setattr(ctx, "_seen_abort", ctx._seen_abort)
        return pg

    return join


def _model_and_optimizer(distributed: bool = True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    return model, hvd.DistributedOptimizer(opt) if distributed else opt


def _backward(model, opt, seed: int) -> None:
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()


def _values(model, opt) -> list[torch.Tensor]:
    out = [t.detach().clone() for t in model.state_dict().values()]
    for p in model.parameters():
        out += [v.clone() for _, v in sorted(opt.state[p].items()) if isinstance(v, torch.Tensor)]
    return out


def _trained_in_place():
    """Three steps of the common loop (step, commit), standalone: its commits are kept in place."""
    model, opt = _model_and_optimizer()
    state = hvd.elastic.TorchState(model, opt, step=0)
    for seed in range(3):
        _backward(model, opt, seed)
        opt.step()
        state.commit()
    assert all(h.in_place for h in opt._ce_snapshots)
    return model, opt, state


def _abort_now(ctx) -> None:
    """The driver's abort, as the heartbeat thread acts on it; returns once the group is aborted."""
    _heartbeat_brings_the_abort(ctx, after_s=0.0).join()
    deadline = time.monotonic() + 5
    while not ctx._group.abandoned and time.monotonic() < deadline:  # the abort runs on a thread of its own
        time.sleep(0.01)


def test_an_update_in_place_is_not_applied_once_an_abort_may_have_cut_its_allreduce(nccl_member, device):
    """The common loop keeps its commit in place: the update writes over the commit itself. Applied with what an
    aborted allreduce left in the gradients, the survivor could not return to its commit (before: it could not
    restore, and no survivor of a lost peer in the step's allreduce could)."""
    model, opt, state = _trained_in_place()
    committed = _values(model, opt)
    device.append(nccl_member())
    _backward(model, opt, 3)  # its gradients' allreduce is queued behind a peer that is gone
    ctx = get_context()
    _heartbeat_brings_the_abort(ctx)  # while the step waits for the device, before its update
    with pytest.raises(CollectiveError, match="gradient allreduce not confirmed: the driver aborted round"):
        opt.step()
    state.restore()
    assert ctx.ledger.holds_commit
    for got, want in zip(_values(model, opt), committed):
        assert torch.equal(got, want)
    opt._ce_clear()


def test_a_commit_after_an_abort_is_not_taken_and_the_one_before_it_is_restored(nccl_member):
    model, opt = _model_and_optimizer(distributed=False)  # a kept commit: the state is copied at each commit
    state = hvd.elastic.TorchState(model, opt, step=0)
    _backward(model, opt, 0)
    opt.step()
    state.commit()
    committed = _values(model, opt)
    nccl_member()
    ctx = get_context()
    _backward(model, opt, 1)
    grads = [p.grad for p in model.parameters()]
    ctx.wait(ctx.pg.allreduce(grads), "gradient allreduce", host=False)  # queued behind the peer that is gone
    _abort_now(ctx)
    opt.step()  # with what the aborted allreduce left, on a GPU
    with pytest.raises(CollectiveError, match="the commit not confirmed: the driver aborted round"):
        state.commit()
    state.restore()
    for got, want in zip(_values(model, opt), committed):
        assert torch.equal(got, want)


def test_an_error_from_torch_as_the_heartbeat_thread_aborts_the_round_is_a_lost_peer_not_the_scripts():
    """A collective started in the instant the communicator is aborted fails inside torch (a RuntimeError, not
    ours): in an aborted NCCL round that is a rollback, as any lost peer's; any other error is the script's."""
    from cloud_elastic.worker import sharded

    ctx = _context(_Nccl())
    ctx._seen_abort = 3
    assert sharded.peer_lost(ctx, RuntimeError("NCCL communicator was aborted on rank 0."))
    assert not sharded.peer_lost(ctx, RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x6 and 7x16)"))
    assert not sharded.peer_lost(_context(_Nccl(), backend="gloo"), RuntimeError("NCCL communicator was aborted"))


def test_an_abort_between_a_whole_update_in_place_and_its_commit_leaves_that_commit_exact(nccl_member, device):
    """The peer is lost after this step's allreduce finished: the update in place was confirmed whole, and the
    abort reaches the worker before its commit. Refusing that commit would leave nothing to restore (the update
    wrote over the last one); it is taken, and the round's next collective fails."""
    model, opt, state = _trained_in_place()
    device.append(nccl_member(peer_alive=True))
    _backward(model, opt, 3)
    opt.step()  # the allreduce finished: confirmed, applied in place
    updated = _values(model, opt)
    ctx = get_context()
    _abort_now(ctx)
    state.commit()
    with pytest.raises(CollectiveError, match="not started"):
        hvd.allreduce(torch.ones(1), name="loss")
    state.restore()
    assert ctx.ledger.holds_commit
    for got, want in zip(_values(model, opt), updated):
        assert torch.equal(got, want)


def test_an_update_in_place_then_a_whole_loss_allreduce_then_the_abort_still_commits(nccl_member, device):
    """A logging allreduce between step() and commit(), waited for on the host and found whole: the abort after it
    cut nothing the commit holds, and the update wrote over the last commit: the commit is taken."""
    model, opt, state = _trained_in_place()
    device.append(nccl_member(peer_alive=True))
    _backward(model, opt, 3)
    opt.step()
    hvd.allreduce(torch.ones(1), name="loss")
    updated = _values(model, opt)
    ctx = get_context()
    _abort_now(ctx)
    state.commit()
    state.restore()  # the next collective fails; the survivor rolls back to this commit
    assert ctx.ledger.holds_commit
    for got, want in zip(_values(model, opt), updated):
        assert torch.equal(got, want)


def test_a_membership_change_agreed_after_a_whole_update_in_place_commits_before_it_interrupts(nccl_member, device,
                                                                                               monkeypatch):
    """Horovod's loop calls check_host_updates() between commits; an abort arriving after the step's update was
    confirmed must not cost the survivor its commit there either."""
    model, opt, state = _trained_in_place()
    device.append(nccl_member(peer_alive=True))
    ctx = get_context()
    monkeypatch.setattr(ctx, "standalone", False)  # a job's worker: the membership check is asked
    monkeypatch.setattr(ctx, "_seen_update", ctx.info.update_gen + 1)  # a host joins: the flag rides the allreduce
    _backward(model, opt, 3)
    opt.step()
    updated = _values(model, opt)
    _abort_now(ctx)
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.check_host_updates()
    state.restore()
    assert ctx.ledger.holds_commit
    for got, want in zip(_values(model, opt), updated):
        assert torch.equal(got, want)


def test_a_group_nccls_own_watchdog_aborted_is_not_confirmed_though_the_driver_said_nothing(device):
    """Past the collective timeout torch's watchdog aborts the communicator itself (error handling mode 2): the
    group is not marked abandoned by us, but what its kernels left is no average either."""
    pg = _Nccl()
    device.append(pg)
    ctx = _context(pg)
    ctx.wait(ctx.pg.allreduce([torch.ones(1)]), "gradient allreduce", host=False)
    pg.error = ErrorType.TIMEOUT
    pg.finished.set()  # the watchdog's abort ended the kernels
    with pytest.raises(CollectiveError, match="the commit not confirmed"):
        ctx.confirm_on_device("the commit")


def test_an_error_of_the_device_itself_is_the_scripts_not_a_lost_peer(device):
    """A device-side assert of the script surfaces at the next wait for the device: with the group sound, it is the
    script's own error (the job ends with it), not a lost peer rolled back from again and again."""
    ctx = _context(_Nccl(peer_alive=True))
    device.append(RuntimeError("CUDA error: device-side assert triggered"))
    with pytest.raises(RuntimeError, match="device-side assert"):
        ctx.confirm_on_device("the commit")
    with pytest.raises(RuntimeError, match="device-side assert"):
        ctx.wait(ctx.pg.allreduce([torch.ones(1)]), "membership check")


def test_each_round_formed_names_its_group_for_the_heartbeat_threads_abort():
    hvd.init()
    ctx = get_context()
    assert ctx._group.round == ctx.info.round  # set by _form_group, which every round's group goes through


def test_a_training_function_that_returns_after_an_abort_is_run_again_from_its_commit(nccl_member, monkeypatch):
    """What the function leaves is what the final checkpoint writes and the driver counts as trained: after an abort
    that may have cut its last collectives short, it is rolled back to the commit and run again (here the second
    run finds the round formed again, a group of one, and returns)."""
    from cloud_elastic.worker import elastic

    monkeypatch.setattr(elastic, "_completed", False)  # restored after: the run below completes in this process
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # which a completed run wraps (elastic._name_failures_after_run)
    ctx = get_context()
    standalone_group, standalone_info = ctx._group, ctx.info
    model, opt = _model_and_optimizer(distributed=False)
    state = hvd.elastic.TorchState(model, opt, step=0)
    runs: list[list[torch.Tensor]] = []

    @hvd.elastic.run
    def train(state) -> None:
        runs.append(_values(model, opt))
        if len(runs) > 1:
            return
        state.commit()
        nccl_member()
        _backward(model, opt, 1)
        ctx.wait(ctx.pg.allreduce([p.grad for p in model.parameters()]), "gradient allreduce", host=False)
        _abort_now(ctx)
        opt.step()  # with what the aborted allreduce left; then the function returns
        monkeypatch.setattr(ctx, "rendezvous", lambda reason: _form_again())

    def _form_again():
        ctx._group, ctx.info = standalone_group, standalone_info
        return standalone_info

    train(state)
    assert len(runs) == 2
    for got, want in zip(runs[1], runs[0]):
        assert torch.equal(got, want)  # the second run started from the commit, not from the aborted step


@pytest.mark.parametrize("returns", ["the loss", "None"])
def test_a_closure_step_after_an_abort_is_not_committed_and_the_commit_before_it_is_restored(nccl_member, device,
                                                                                            returns):
    """``step(closure)`` runs its allreduces inside the update's window, so its commits are kept, never in place
    (``optim.closure``): an update applied with what an abort left is refused at the commit (or, with a loss
    returned, at the wait for the loss's mean), and the kept commit before it is restored exactly."""
    model, _ = _model_and_optimizer()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    state = hvd.elastic.TorchState(model, opt, step=0)
    seed = iter(range(100))

    def closure():
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(next(seed)))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        return loss if returns == "the loss" else None

    for _ in range(3):
        opt.step(closure)
        state.commit()
    assert not any(h.in_place for h in opt._ce_snapshots)
    committed = _values(model, opt)
    device.append(nccl_member())
    ctx = get_context()
    _heartbeat_brings_the_abort(ctx)
    with pytest.raises(CollectiveError, match="abandoned|not confirmed"):
        opt.step(closure)
        state.commit()
    state.restore()
    assert ctx.ledger.holds_commit
    for got, want in zip(_values(model, opt), committed):
        assert torch.equal(got, want)
    opt._ce_clear()
