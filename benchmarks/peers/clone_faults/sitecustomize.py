"""Counts the minor page faults of the clone inside each ``hvd.allreduce`` of allreduce_bw.py's own loop.

    PYTHONPATH=benchmarks/peers/clone_faults:$PWD CLONE_FAULTS_DIR=/tmp/cf python benchmarks/peers/allreduce_bw.py

Python imports this file at startup when its folder is on PYTHONPATH; in a worker
(``--worker``) it replaces ``collectives.allreduce`` (before ``cloud_elastic.torch``
imports it) by the same clone + ``allreduce_``, with the clone stamped: one line
"bytes faults clone_µs" per call, in CLONE_FAULTS_DIR/<pid>. Not part of the product.
"""

import os
import sys

if "--worker" in sys.argv and os.environ.get("CLONE_FAULTS_DIR"):
    import resource
    import time

    import cloud_elastic.worker.collectives as _c

    _out = os.path.join(os.environ["CLONE_FAULTS_DIR"], str(os.getpid()))

    def allreduce(tensor, *args, **kwargs):
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        t0 = time.perf_counter()
        clone = tensor.detach().clone()
        dt = time.perf_counter() - t0
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
        with open(_out, "a") as fh:
            fh.write(f"{tensor.numel() * tensor.element_size()} {faults} {round(dt * 1e6)}\n")
        return _c.allreduce_(clone, *args, **kwargs)

    _c.allreduce = allreduce
