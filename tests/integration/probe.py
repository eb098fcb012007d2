"""Training script the integration tests run under ``cloud-elastic run``.

It prints machine-readable ``EVENT {json}`` lines (forwarded by the driver
with a rank prefix) so tests can synchronise on what workers actually do:
hello (pid), step, commit, reset (with the step before and after, to see
rollbacks), done (final step and a checksum of the parameters). hello and
reset also carry the round and the worker's topology numbers.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import hashlib
import json
import logging
import os
import re
import signal
import threading
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.comm import followers
from cloud_elastic.worker.context import get_context

# Follow-mode admission's INFO lines (who follows from which commit, or why not; when the window ends): tests
# read them to know how a newcomer was admitted. Only the CLI configures the library's handlers.
_FOLLOW_LOG = logging.getLogger("cloud_elastic.worker.commit.follow")
_FOLLOW_LOG.setLevel(logging.INFO)
_FOLLOW_LOG.addHandler(logging.StreamHandler())


def cycled_tensor_bytes() -> int:
    """Bytes of tensors that only Python's cyclic collector frees (held by a reference cycle, unreachable):
    on a GPU, device memory kept past a reset until the collector happens to run."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sum(o.untyped_storage().nbytes() for o in gc.garbage if isinstance(o, torch.Tensor))
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.collect()


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), pid=os.getpid())
    print("EVENT " + json.dumps(fields), flush=True)


def checksum(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.state_dict().values():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def topology() -> dict:
    return dict(round=get_context().info.round, local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size())


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # the harness dumps stacks of a hung job
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--fail-at-step", type=int, default=-1, help="exit 1 at this step")
    p.add_argument("--exit0-at-step", type=int, default=-1, help="exit 0 (without finishing) at this step")
    p.add_argument("--only-slot", default="", help="apply the failure only to this worker id prefix")
    p.add_argument("--sampler", type=int, default=0, help="train over an ElasticSampler of this many samples")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--min-resets", type=int, default=0, help="keep training past --steps/--epochs until this many resets")
    p.add_argument("--commit-every", type=int, default=1, help="commit every N steps (without a sampler)")
    p.add_argument("--commit-in-reset", action="store_true", help="the reset callback commits (and checks for updates)")
    p.add_argument("--block-at-step", type=int, default=-1,
                   help="the training thread blocks for good in native code inside this step (--only-slot)")
    p.add_argument("--return-at-step", type=int, default=-1,
                   help="return from the training function after committing this step (--only-slot): too early")
    p.add_argument("--fail-after-training", action="store_true",
                   help="raise right after the training function returns (a final save that fails)")
    p.add_argument("--start-when", default="", help="train only once this file exists (the test's gate)")
    p.add_argument("--hold-gil-at-step", type=int, default=-1,
                   help="the training thread runs forever in C code that never releases the GIL (--only-slot): "
                        "no other thread of the worker, its heartbeats included, runs again")
    p.add_argument("--stop-when", default="",
                   help="keep training past --steps/--min-resets until this file exists (rank 0 looks, after a commit; "
                        "with --sampler, at the end of each epoch past --epochs)")
    p.add_argument("--entry-events", action="store_true",
                   help="an 'entered' event at each entry into the training function (after the state sync): "
                        "the round, the step and a checksum of the parameters")
    p.add_argument("--count-cycles", action="store_true",
                   help="with --entry-events: also the bytes of tensors only reference cycles hold (runs the cyclic "
                        "collector at each entry, which production leaves to Python: only the tests that check it)")
    args = p.parse_args()

    # CE_PROBE_ENV=HOST=NAME=VALUE: the worker on HOST has NAME=VALUE in its environment before init() reads it
    # (a setting for one host only, without a shell around the probe: a shell's Python is started from scratch,
    # a probe run directly is forked from the driver's fork server, some 3 CPU-seconds less per worker).
    env_host, _, setting = os.environ.get("CE_PROBE_ENV", "").partition("=")
    if setting and os.environ.get("CLOUD_ELASTIC_HOSTNAME") == env_host:
        name, _, value = setting.partition("=")
        os.environ[name] = value
    # CE_PROBE_STRAGGLER=HOST: the worker on HOST never reaches rendezvous (it never calls init()).
    if os.environ.get("CLOUD_ELASTIC_HOSTNAME") == os.environ.get("CE_PROBE_STRAGGLER", "-"):
        time.sleep(600)
    hvd.init()
    # CE_PROBE_SETUP=HOST=SECONDS: the worker on HOST sets up that long after init() (a model, data, a device)
    # before its first call that needs the round; local_rank() is known before.
    setup_host, _, setup = os.environ.get("CE_PROBE_SETUP", "").partition("=")
    if setup and os.environ.get("CLOUD_ELASTIC_HOSTNAME") == setup_host:
        event("setting up", local_rank=hvd.local_rank(), t=time.time())
        time.sleep(float(setup))
        event("set up", t=time.time())
    event("hello", rank=hvd.rank(), size=hvd.size(), **topology())
    torch.manual_seed(0)
    # CE_PROBE_WIDE=HOST: the worker on HOST builds its hidden layer wider (a model built otherwise there).
    width = 32 if os.environ.get("CLOUD_ELASTIC_HOSTNAME") == os.environ.get("CE_PROBE_WIDE", "-") else 16
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    counters = {"executed": 0}
    extra = {}
    sampler = None
    if args.sampler:
        dataset = torch.utils.data.TensorDataset(torch.arange(args.sampler))
        sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
        extra["sampler"] = sampler
    state = hvd.elastic.TorchState(model, optimizer, step=0, epoch=0, resets=-1, **extra)
    mine = os.environ.get("CLOUD_ELASTIC_WORKER_ID", "").startswith(args.only_slot)
    # CE_PROBE_SLOW=HOST=SECONDS: the worker on HOST sleeps that much longer every step (a slow instance).
    slow_host, _, slow = os.environ.get("CE_PROBE_SLOW", "").partition("=")
    slow_s = float(slow) if slow and os.environ.get("CLOUD_ELASTIC_HOSTNAME") == slow_host else 0.0

    def on_reset() -> None:
        event("reset", rank=hvd.rank(), size=hvd.size(), executed=counters["executed"], step=state.step, **topology())
        counters["executed"] = state.step
        if args.commit_in_reset:
            state.commit()

    state.register_reset_callbacks([on_reset])

    def one_step() -> None:
        g = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
        x = torch.randn(4, 8, generator=g)
        optimizer.zero_grad()
        F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        optimizer.step()
        counters["executed"] += 1  # trained: a step whose allreduce failed is not (nor is it a step lost)
        if mine and state.step + 1 == args.hold_gil_at_step:
            event("holding the GIL", rank=hvd.rank(), step=state.step)
            re.fullmatch(r"(a|aa)+", "a" * 64 + "b")  # exponential backtracking, all of it in C under the GIL
        if mine and state.step + 1 == args.block_at_step:
            event("blocking", rank=hvd.rank(), step=state.step)
            blocked_in_native_code = threading.Event()
            blocked_in_native_code.wait()  # never set: a lock wait, no Python runs
        state.step += 1
        if mine and state.step == args.fail_at_step:
            event("failing", rank=hvd.rank())
            os._exit(1)
        if mine and state.step == args.exit0_at_step:
            event("exiting0", rank=hvd.rank())
            os._exit(0)
        time.sleep(args.step_sleep + slow_s)

    def more() -> bool:
        """Whether to train another step: until --steps and --min-resets are reached, then until rank 0
        sees the --stop-when file (it decides for all: after a commit, where a collective costs no copy)."""
        if state.step < args.steps or state.resets < args.min_resets:
            return True
        return bool(args.stop_when) and not hvd.broadcast_object(os.path.exists(args.stop_when), root_rank=0)

    entered = {"round": None}

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        # A new round is entered after the state sync, so every rank counts alike. The end of a follow window
        # enters again in the same round (``commit.follow``): not a membership change, not counted.
        if get_context().info.round != entered["round"]:
            entered["round"] = get_context().info.round
            state.resets += 1
        if args.entry_events:
            event("entered", rank=hvd.rank(), size=hvd.size(), round=get_context().info.round, step=state.step,
                  checksum=checksum(model), **({"cycled": cycled_tensor_bytes()} if args.count_cycles else {}))
        while args.start_when and not os.path.exists(args.start_when):
            time.sleep(0.05)
        if sampler is None:
            while more():
                one_step()
                # Past --steps every step commits (the last one must), except while only --min-resets keeps
                # the loop going: then commits stay every --commit-every steps, as a test of it expects.
                if state.step % args.commit_every == 0 or (state.step >= args.steps
                                                           and state.resets >= args.min_resets):
                    state.commit()
                    event("commit", rank=hvd.rank(), size=hvd.size(), step=state.step)
                if mine and state.step == args.return_at_step:
                    event("returning", rank=hvd.rank(), step=state.step)
                    return
            return
        trained = False  # in this round: a round formed at the very end of the last epoch trains one more
        while True:
            sampler.set_epoch(state.epoch)
            for batch_idx, (batch,) in enumerate(loader):
                trained = True
                # Printed before the step: a member whose allreduce failed (or who was killed) after it sent
                # its gradients may have had them committed by another member whose allreduce completed.
                event("batch", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch, step=state.step + 1,
                      indices=sampler.get_indices(batch_idx, args.batch_size),
                      following=followers.is_follower(get_context()))  # a follower's batch is not trained
                one_step()
                sampler.record_batch(batch_idx, args.batch_size)
                state.commit()
                event("commit", rank=hvd.rank(), size=hvd.size(), step=state.step)
            if state.epoch + 1 >= args.epochs and state.resets >= args.min_resets and (trained or not args.min_resets):
                if not args.stop_when or hvd.broadcast_object(os.path.exists(args.stop_when), root_rank=0):
                    return
            state.epoch += 1

    train(state)
    event("done", rank=hvd.rank(), size=hvd.size(), step=state.step, checksum=checksum(model))
    if args.fail_after_training:
        raise RuntimeError("the final save failed (--fail-after-training)")


if __name__ == "__main__":
    main()
