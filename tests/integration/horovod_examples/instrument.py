"""What the scripts beside this file add to Horovod's examples' shape, for the tests: not part of that shape.

* ``event``: ``EVENT {json}`` lines (as ``tests/integration/probe.py`` prints) the tests synchronise on;
* ``step``: one such line per optimizer step (rank, size, loss), then the brake: while the file named by
  ``CE_EXAMPLE_SLOW`` exists each step sleeps 0.2 s, so a test can kill a worker and add a host before
  training ends, then remove the file and let it finish at full speed;
* ``done``: the final parameters' checksum, to compare across ranks (parameters only: BatchNorm's running
  statistics are each worker's own, as under Horovod, which averages gradients, not buffers);
* ``images``: tiny generated images whose class shows (a fixed pattern per class plus noise), so a
  small network learns them in a few steps: never a download;
* ``models``: the torchvision model names the examples ask for, as small networks of the same kind.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import signal
import time
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

faulthandler.register(signal.SIGUSR1)  # the harness dumps stacks of a hung job


def event(kind: str, **fields: Any) -> None:
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), pid=os.getpid())
    print("EVENT " + json.dumps(fields), flush=True)


def step(hvd: Any, loss: torch.Tensor, **fields: Any) -> None:
    event("step", rank=hvd.rank(), size=hvd.size(), loss=float(loss.item()), **fields)
    slow = os.environ.get("CE_EXAMPLE_SLOW")
    if slow and os.path.exists(slow):
        time.sleep(0.2)


def done(hvd: Any, model: nn.Module, **fields: Any) -> None:
    h = hashlib.sha256()
    for value in model.parameters():
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    event("done", rank=hvd.rank(), size=hvd.size(), checksum=h.hexdigest()[:16], **fields)


def images(n: int, classes: int, shape: tuple[int, ...], seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn((classes,) + shape, generator=torch.Generator().manual_seed(12345))
    labels = torch.randint(0, classes, (n,), generator=g)
    return torch.utils.data.TensorDataset(patterns[labels] + 0.5 * torch.randn((n,) + shape, generator=g), labels)


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class TinyResNet(nn.Module):
    """A ResNet's parts (convolutions, BatchNorm buffers, residual blocks, pooling, 1000 classes), small."""

    def __init__(self, num_classes: int = 1000, width: int = 8) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.layer1 = nn.Sequential(_Block(width), _Block(width))
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


models = SimpleNamespace(resnet50=TinyResNet, resnet18=TinyResNet)


class NoProgress:
    """``tqdm``'s interface, printing nothing (tqdm is not installed here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> "NoProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass
