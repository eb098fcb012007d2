"""Runs a training function in a worker process of its own: ``python -m cloud_elastic.spark.runfn FN RESULT``.

The Spark task writes the function (as Spark's cloudpickle serialised it, in a
private temporary directory on its own executor) to ``FN`` and starts this
module through the SSH launcher's wrapper, so the worker has a process group
of its own that dies with the task. ``FN`` is this worker's own link to that
file: it is deleted as soon as it is loaded. When the function returns, this
worker's rank (a JSON line) and its value, pickled, go to ``RESULT``; the task hands
the pickle back to Spark untouched, and ``run_elastic`` unpickles it on the driver. When it
raises, or its value cannot be pickled, the one-line reason goes to ``RESULT.error`` for the caller. No
pickle ever crosses a socket here: both files are local to the task.
"""

from __future__ import annotations

import json
import os
import pickle
import sys


def main(argv: list[str]) -> int:
    fn_path, result_path = argv
    with open(fn_path, "rb") as f:
        fn, args, kwargs = pickle.load(f)
    os.unlink(fn_path)  # the user's function and arguments stay on disk no longer than needed
    try:
        value = fn(*args, **kwargs)  # a worker told to leave exits 0 from inside
    except Exception as exc:
        # One line for the caller of run_elastic; the traceback goes to the executor's log.
        import traceback

        with open(result_path + ".error", "w") as f:
            summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            f.write(f"the training function raised: {summary}"[:500])
        raise
    rank = None
    from cloud_elastic.worker import context

    ctx = context.current()  # as it is: a function that never needed the round does not join one now
    if ctx is not None:
        # Heartbeats go on while the value is pickled (minutes for a large state_dict) and through the exit
        # hooks, as for any script: the driver gives up a completed worker that goes silent.
        rank = ctx.info.rank if ctx.info is not None else None

    # Spark's cloudpickle, as Spark itself uses for what a task returns: a value whose class lives in the
    # driver's script or notebook (``__main__``) is pickled by value; plain pickle refuses it.
    from pyspark import cloudpickle

    try:
        with open(result_path + ".tmp", "wb") as f:
            f.write(json.dumps({"rank": rank}).encode() + b"\n")
            cloudpickle.dump(value, f)
    except Exception as exc:
        os.unlink(result_path + ".tmp")
        with open(result_path + ".error", "w") as f:
            f.write(f"the training function's return value ({type(value).__name__}) cannot be pickled for Spark: "
                    f"{type(exc).__name__}: {exc}"[:500])
        raise
    os.replace(result_path + ".tmp", result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
