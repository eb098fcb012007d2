"""Runs a training function in a worker process of its own: ``python -m cloud_elastic.spark.runfn FN RESULT``.

The Spark task writes the function (as Spark's cloudpickle serialised it, in a
private temporary directory on its own executor) to ``FN`` and starts this
module through the SSH launcher's wrapper, so the worker has a process group
of its own that dies with the task. When the function returns, its value and
this worker's rank go to ``RESULT``; the task hands them back to Spark. No
pickle ever crosses a socket here: both files are local to the task.
"""

from __future__ import annotations

import pickle
import sys


def main(argv: list[str]) -> int:
    fn_path, result_path = argv
    with open(fn_path, "rb") as f:
        fn, args, kwargs = pickle.load(f)
    value = fn(*args, **kwargs)  # an exception prints its traceback and exits 1; a leaving worker exits 0
    rank = None
    from cloud_elastic.worker import context

    if context.is_initialized():
        rank = context.get_context().info.rank
        context.get_context().close()
    with open(result_path + ".tmp", "wb") as f:
        pickle.dump({"rank": rank, "value": value}, f)
    import os

    os.replace(result_path + ".tmp", result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
