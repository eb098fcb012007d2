"""Training script of the GPU tests (``tests/gpu``), run under ``cloud-elastic run``.

An MLP trains with AdamW on ``cuda:<local rank>`` (torch's default there: the
multi-tensor ``foreach`` update), as a Horovod script would place it, over
whatever backend the job uses (NCCL by default with CUDA; Gloo with
``CLOUD_ELASTIC_BACKEND=gloo``, carrying the CUDA tensors). It prints ``EVENT``
lines, forwarded by the driver with a rank prefix:

- ``hello``: pid, host, slot, rank, size, backend, device;
- ``resumed``: step, round, size and checksum each time the training function is
  entered (after the rollback and the state sync of a new round);
- ``memory`` (``--memory``): the process's CUDA memory at each ``resumed``;
- ``window`` (``--log-every``): right after the update of the step that started at
  ``step``, before a loss allreduce between ``step()`` and ``commit()``, the
  checksum of the tensors as the update left them, hashed with ``step``: it differs
  from the commit of ``step`` by exactly what a restore must undo;
- ``commit``: step and checksum after each commit (``interrupted`` when the
  commit ended the round for a membership change), and ``kept``: whether the
  commit kept a copy of the parameters and optimizer state (None if unknown);
- ``syncs`` (``--sync-check N``): for N steps of the first round (from its third step on),
  whether ``zero_grad``, forward, backward and ``step()`` ran without the host waiting for
  the device (``torch.cuda.set_sync_debug_mode("error")``), else the first such call's error;
- ``dying`` just before a planned death; ``done`` at the end.

The checksum covers the step counter, every tensor of the model's state dict and
every tensor of the optimizer's state, bytes as they are on the device.

Deaths: ``--die HOST/SLOT,POINT,STEP[,MINSIZE]`` (repeatable) makes the worker on
that slot SIGKILL itself (``stop-*`` points: SIGSTOP) at POINT of the first step
that starts at ``state.step >= STEP`` in a round of at least MINSIZE workers (and
two steps into the round: in steady training, not the first step after a sync),
once per job (a marker file in ``--once-dir``), so its replacement does not die again.
POINT: ``backward`` (the first gradient of backward: peers are left in the
step's gradient allreduce), ``update`` (right after ``step()``: peers fail in the
next collective, after their own update). ``--churn HOST/SLOT --die-after N``: every
process on that slot kills itself at ``update`` after N steps of its own.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import hashlib
import json
import os
import signal
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.exceptions import HostsUpdatedInterrupt

SLOT = f"{os.environ.get('CLOUD_ELASTIC_HOSTNAME', '')}/{os.environ.get('CLOUD_ELASTIC_SLOT', '')}"


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, slot=SLOT, pid=os.getpid())
    print("EVENT " + json.dumps(fields), flush=True)


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), n) if n else b""  # no numpy needed


def checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> str:
    h = hashlib.sha256(str(step).encode())
    for name, t in model.state_dict().items():
        h.update(name.encode() + tensor_bytes(t))
    for i, p in enumerate(model.parameters()):
        for key, value in sorted(optimizer.state.get(p, {}).items()):  # .get: reading must not add state
            h.update(f"{i}.{key}".encode())
            h.update(tensor_bytes(value) if isinstance(value, torch.Tensor) else repr(value).encode())
    return h.hexdigest()[:16]


def kept_commit(optimizer: torch.optim.Optimizer) -> bool | None:
    """Whether the last commit kept a copy of what the update overwrites (see worker/ledger.py)."""
    snapshots = getattr(optimizer, "_ce_snapshots", None)
    if not snapshots or not all(hasattr(s, "in_place") for s in snapshots):
        return None
    return not any(s.in_place for s in snapshots)


def memory(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device),
            "device_used": total - free}


class Deaths:
    """The planned deaths of this worker (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.plans = []
        for spec in args.die:
            slot, point, step, *size = spec.split(",")
            if slot == SLOT:
                self.plans.append((point, int(step), int(size[0]) if size else 1))
        if self.plans and not args.once_dir:
            raise SystemExit("--die needs --once-dir")
        self.once_dir = args.once_dir
        self.churn_after = args.die_after if args.churn == SLOT else 0
        self.own_steps = 0
        #: The step the current round began at (a planned death waits two steps past it).
        self.round_step = 0

    def at(self, point: str, start: int) -> None:
        if self.churn_after and point == "update" and self.own_steps >= self.churn_after:
            self._die(point, start, signal.SIGKILL)
        for planned, step, size in self.plans:
            if planned.removeprefix("stop-") != point or start < max(step, self.round_step + 2) or hvd.size() < size:
                continue
            marker = os.path.join(self.once_dir, f"{SLOT.replace('/', '_')}-{planned}-{step}")
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue  # this plan already ran (an earlier process on this slot died by it)
            self._die(planned, start, signal.SIGSTOP if planned.startswith("stop-") else signal.SIGKILL)

    def _die(self, point: str, start: int, sig: signal.Signals) -> None:
        event("dying", point=point, step=start, round=get_context().info.round, rank=hvd.rank(), size=hvd.size(),
              signal=sig.name)
        os.kill(os.getpid(), sig)
        if sig == signal.SIGSTOP:
            time.sleep(3600)  # continued only to be killed


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # the harness dumps stacks of a hung job
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--min-resets", type=int, default=0, help="train on past --steps until this many resets")
    p.add_argument("--tail-steps", type=int, default=0, help="... and this many steps after the last reset")
    p.add_argument("--commit-every", type=int, default=1)
    p.add_argument("--log-every", type=int, default=0, help="a loss allreduce between step() and commit() every N steps")
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--memory", action="store_true")
    p.add_argument("--die", action="append", default=[], help="HOST/SLOT,POINT,STEP[,MINSIZE]")
    p.add_argument("--once-dir", default="")
    p.add_argument("--churn", default="", help="HOST/SLOT whose every process dies after --die-after steps")
    p.add_argument("--die-after", type=int, default=0)
    p.add_argument("--sync-check", type=int, default=0, help="check N steps for host-device synchronizations")
    args = p.parse_args()

    hvd.init()
    ctx = get_context()
    device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    event("hello", rank=hvd.rank(), size=hvd.size(), backend=ctx.backend, device=str(device),
          cuda_devices=torch.cuda.device_count() if torch.cuda.is_available() else 0)
    deaths = Deaths(args)

    torch.manual_seed(0)
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(16, w), torch.nn.Tanh(), torch.nn.Linear(w, w), torch.nn.Tanh(),
                                torch.nn.Linear(w, 1)).to(device)
    optimizer = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01))
    state = hvd.elastic.TorchState(model, optimizer, step=0, resets=-1, reset_step=0)
    current = {"start": -1}
    model[4].weight.register_hook(lambda _g: deaths.at("backward", current["start"]))  # the first gradient

    def finished() -> bool:
        return (state.step >= args.steps and state.resets >= args.min_resets
                and state.step >= state.reset_step + args.tail_steps)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        # Entered once per round, after the rollback and the sync: every rank counts alike.
        state.resets += 1
        state.reset_step = deaths.round_step = state.step
        event("resumed", step=state.step, round=ctx.info.round, rank=hvd.rank(), size=hvd.size(),
              resets=state.resets, checksum=checksum(model, optimizer, state.step))
        if args.memory:
            event("memory", resets=state.resets, step=state.step, **memory(device))
        while not finished():
            start = current["start"] = state.step
            g = torch.Generator().manual_seed(start * 1000 + hvd.rank())
            x = torch.randn(8, 16, generator=g).to(device)
            checked = device.type == "cuda" and state.resets == 0 and 2 <= start < 2 + args.sync_check
            if checked:
                torch.cuda.synchronize(device)
                torch.cuda.set_sync_debug_mode("error")  # a call that makes the host wait for the GPU raises
            try:
                optimizer.zero_grad()
                loss = F.mse_loss(model(x), x.sum(1, keepdim=True).tanh())
                loss.backward()
                optimizer.step()
            except RuntimeError as exc:
                if not checked:
                    raise
                event("syncs", step=start, error=str(exc).splitlines()[0])
                raise SystemExit(3) from exc
            finally:
                if checked:
                    torch.cuda.set_sync_debug_mode("default")
            if checked:
                event("syncs", step=start, error=None)
            deaths.own_steps += 1
            deaths.at("update", start)
            state.step += 1
            if args.log_every and state.step % args.log_every == 0:
                # Hashed with the step it started from: equal to that commit's checksum only if nothing changed.
                event("window", step=start, rank=hvd.rank(), checksum=checksum(model, optimizer, start))
                hvd.allreduce(loss.detach(), name="loss")  # logging: a collective between step() and commit()
            if state.step % args.commit_every == 0 or finished():
                try:
                    state.commit()
                except HostsUpdatedInterrupt:
                    event("commit", step=state.step, rank=hvd.rank(), size=hvd.size(), interrupted=True,
                          checksum=checksum(model, optimizer, state.step), kept=kept_commit(optimizer))
                    raise
                event("commit", step=state.step, rank=hvd.rank(), size=hvd.size(), interrupted=False,
                      checksum=checksum(model, optimizer, state.step), kept=kept_commit(optimizer))
            time.sleep(args.step_sleep)

    train(state)
    event("done", step=state.step, rank=hvd.rank(), size=hvd.size(), resets=state.resets,
          checksum=checksum(model, optimizer, state.step))


if __name__ == "__main__":
    main()
