"""A fixed-size script (tests/integration/test_horovod_shutdown.py): ``allgather_object`` and
``grouped_allgather`` across the job, then ``hvd.shutdown()`` and work past the heartbeat timeout, as a script
that evaluates or uploads after its training does. Prints ``CHECK {json}``.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import cloud_elastic.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
objects = hvd.allgather_object({"rank": rank, "words": ["w"] * (rank + 1)})  # lengths differ by rank
rows = hvd.grouped_allgather([torch.full((rank + 1, 2), float(rank)), torch.tensor([rank])])
hvd.shutdown()
try:
    hvd.allreduce(torch.ones(1))
    refused = "no error"
except ValueError as exc:
    refused = str(exc)
check = {
    "rank": rank,
    "allgather_object": objects == [{"rank": r, "words": ["w"] * (r + 1)} for r in range(size)],
    "grouped_allgather": rows[0].shape == (size * (size + 1) // 2, 2) and rows[1].tolist() == list(range(size)),
    "is_initialized_after_shutdown": hvd.is_initialized(),
    "allreduce_after_shutdown": refused,
}
print("CHECK " + json.dumps(check), flush=True)
time.sleep(float(sys.argv[1]))  # the work after shutdown(), silent to the driver before heartbeats went on
print("CHECK " + json.dumps({"rank": rank, "worked_on": True}), flush=True)
