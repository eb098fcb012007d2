"""Training script of the chaos test: an ElasticSampler job that prints what it does.

Every line is ``EVENT {json}`` (the driver forwards it with a rank prefix) and
carries the worker id, its pid, the round and the wall time, so the test can
rebuild the training history after the fact. The same records also go to
``--events-dir``/``<pid>.jsonl``, one JSON object a line: a worker adopted by a
restarted driver lost its output pipe with the dead one, so the test reads the
history from these files (:class:`tests.integration.harness.EventFiles`).

* ``hello``: the worker started (pid, host).
* ``enter``: the training function was entered in a round, after the state sync:
  the step and epoch the round continues from.
* ``batch``: a step was taken; ``indices`` are the samples of *every* rank in
  that step (the sampler knows them all), so the history stays complete even
  when the worker that drew a sample is killed before it can print it.
* ``commit``: ``state.commit()`` returned for that step.
* ``done``: training returned; a checksum of the parameters.

Training runs epoch after epoch until the file ``--stop-file`` exists; the
workers decide that together at an epoch's end (an allreduce), so they all
stop after the same epoch.
"""

from __future__ import annotations

import argparse
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

_EVENTS_FILE = None  # this process's file under --events-dir, opened by main()


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), pid=os.getpid(), t=time.time())
    line = json.dumps(fields)
    if _EVENTS_FILE is not None:
        # One write per line, flushed: a SIGKILL loses at most the line being written.
        _EVENTS_FILE.write(line + "\n")
        _EVENTS_FILE.flush()
    print("EVENT " + line, flush=True)


def checksum(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.state_dict().values():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def every_ranks_indices(sampler: hvd.elastic.ElasticSampler, batch_idx: int, batch_size: int) -> list[int]:
    """The samples of batch ``batch_idx`` of all ranks, in rank order (padding excluded)."""
    mine = sampler.rank
    try:
        out: list[int] = []
        for rank in range(sampler.num_replicas):
            sampler.rank = rank
            out.extend(sampler.get_indices(batch_idx, batch_size))
        return out
    finally:
        sampler.rank = mine


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # the harness dumps stacks of a hung job
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--events-dir", help="also write every EVENT to EVENTS_DIR/<pid>.jsonl")
    args = p.parse_args()
    if args.events_dir:
        global _EVENTS_FILE
        path = os.path.join(args.events_dir, f"{os.getpid()}.jsonl")
        _EVENTS_FILE = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life)

    hvd.init()
    event("hello", rank=hvd.rank(), size=hvd.size(), round=get_context().info.round)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    dataset = torch.utils.data.TensorDataset(torch.arange(args.samples))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=11)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, step=0, epoch=0)

    def one_step(batch: torch.Tensor) -> None:
        # The input depends on the sample indices only, so the result does not
        # depend on which worker drew which sample.
        g = torch.Generator().manual_seed(int(batch.sum()) * 7919 + state.step)
        x = torch.randn(len(batch), 8, generator=g)
        optimizer.zero_grad()
        F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        optimizer.step()
        state.step += 1
        time.sleep(args.step_sleep)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        info = get_context().info
        event("enter", round=info.round, rank=hvd.rank(), size=hvd.size(), step=state.step, epoch=state.epoch)
        while True:
            sampler.set_epoch(state.epoch)
            for batch_idx, (batch,) in enumerate(loader):
                one_step(batch)
                sampler.record_batch(batch_idx, args.batch_size)
                event("batch", round=info.round, rank=hvd.rank(), size=hvd.size(), epoch=state.epoch,
                      step=state.step, indices=every_ranks_indices(sampler, batch_idx, args.batch_size))
                state.commit()
                event("commit", round=info.round, rank=hvd.rank(), size=hvd.size(), step=state.step)
            stop = hvd.allreduce(torch.tensor([float(os.path.exists(args.stop_file))]), op=hvd.Sum, name="stop")
            if stop.item() > 0:
                return
            state.epoch += 1

    train(state)
    event("done", rank=hvd.rank(), size=hvd.size(), step=state.step, epoch=state.epoch, checksum=checksum(model))


if __name__ == "__main__":
    main()
