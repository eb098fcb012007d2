"""``tests/integration/after_training_probe.py`` with one gate per rank: after training, rank R waits until
``GATE.R`` exists (so one rank can exit while another still works), the rest as there (arguments, events, final.txt)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration"))

import after_training_probe  # noqa: E402

import cloud_elastic.torch as hvd  # noqa: E402

_GATE = sys.argv[2]
_exists = os.path.exists


def _per_rank(path: str) -> bool:
    return _exists(f"{path}.{hvd.rank()}") if path == _GATE else _exists(path)


if __name__ == "__main__":
    after_training_probe.os.path.exists = _per_rank  # the probe's gate check only asks for _GATE
    after_training_probe.main()
