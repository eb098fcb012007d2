"""A plain torchrun / DDP training script: the "before" of docs/torchrun.md.

    torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py

``examples/ddp_ported.py`` is this script ported to cloud-elastic. Run unchanged
under ``cloud-elastic run``, this script stops at ``init_process_group``: cloud-elastic
sets no ``RANK``, ``WORLD_SIZE`` or ``MASTER_ADDR``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=512, help="size of the generated dataset")
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint", default="ddp_checkpoint.pt", help="resumed from after torchrun restarts the workers")
    return p.parse_args()


def make_dataset(samples: int) -> TensorDataset:
    """A fixed regression problem: the same samples on every worker."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 32, generator=g)
    return TensorDataset(x, torch.tanh(x @ torch.randn(32, 1, generator=g)))


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from torchrun
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dataset = make_dataset(args.samples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    start = 0
    if os.path.exists(args.checkpoint):  # torchrun restarted every worker: go on from the last saved epoch
        saved = torch.load(args.checkpoint)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = saved["epoch"]

    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
                       args.checkpoint)
            print(f"epoch {epoch} loss {loss.item():.4f} on {dist.get_world_size()} worker(s)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
