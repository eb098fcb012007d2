"""What a local worker started from scratch runs its script through, so that it knows the code it exits with.

``python [-u] -m cloud_elastic.driver.launch.local_main SCRIPT ARGS`` (or ``... local_main -m MODULE ARGS``) runs
``SCRIPT`` as ``python [-u] SCRIPT ARGS`` would (:class:`~cloud_elastic.driver.launch.local.LocalLauncher` starts
every worker it does not fork this way when its command has that shape: with ``CLOUD_ELASTIC_LOCAL_FORKSERVER=0``,
and on every machine with a GPU).

Why: the driver that started a worker reaps it and has its exact status; a driver restarted after that one died
adopts the worker but is not its parent, so it learns how the worker ended only from the worker (its ``exiting``
message, or the exit report it leaves in the job's directory: :mod:`cloud_elastic.driver.restart.record`). A plain
interpreter shows no exit hook the code of a top-level ``sys.exit(n)``: a script that returns and one that exits 3
look the same there, so such a worker said nothing, and an adopted one that ended well failed its job ("ended
without saying its exit code"). Run through here, the script's end is seen as the fork server's child sees it
(:func:`~cloud_elastic.driver.launch.forkserver_child.run_main`, the same code: ``sys.argv``, ``sys.path[0]``,
``__file__``, ``__main__`` and tracebacks as the interpreter sets them), which hands the code to the worker library
before the exit hooks run (``link.driver_link.note_exit_code``).

The process then ends as the interpreter ends it, teardown included (unlike a forked worker: finalizers run): the
same status and message for ``SystemExit`` (propagated as is), 1 after an uncaught exception (its traceback printed
once), and an uncaught ``KeyboardInterrupt`` ends it by SIGINT. What no code of the process sees still goes
unsaid: ``os._exit(n)``, a signal; a restarted driver then fails the job for want of a code (never a success).
Standard library only (through ``forkserver_child``), so it costs the worker's start nothing it can measure.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

from cloud_elastic.driver.launch.forkserver_child import INTERRUPTED, run_main

__all__ = ["MODULE", "main", "through_main"]

#: This module, as ``python -m`` names it.
MODULE = "cloud_elastic.driver.launch.local_main"


def through_main(command: list[str] | tuple[str, ...], how: dict[str, Any] | None) -> list[str]:
    """``command`` run through this module when ``how`` (``forkserver.forkable(command, ...)``: the driver's Python
    running a script or a module) says it has that shape; else ``command`` as it is."""
    if how is None:
        return list(command)
    flags = 1
    while command[flags] == "-u":
        flags += 1
    return [*command[:flags], "-m", MODULE, *command[flags:]]


def _request(argv: list[str]) -> dict[str, Any] | None:
    if len(argv) >= 2 and argv[0] == "-m":
        return {"module": argv[1], "args": argv[2:]}
    if argv and not argv[0].startswith("-"):
        return {"script": argv[0], "args": argv[1:]}
    return None


def main(argv: list[str]) -> NoReturn:
    request = _request(argv)
    if request is None:
        print(f"usage: python -m {MODULE} SCRIPT ARGS | -m MODULE ARGS", file=sys.stderr)
        raise SystemExit(2)
    code = run_main(request)  # a SystemExit propagates: the interpreter ends with its status and message
    if code == INTERRUPTED:
        # Its traceback is printed: the interpreter must not print it again, only end by SIGINT after its teardown.
        sys.excepthook = lambda *_: None
        raise KeyboardInterrupt
    raise SystemExit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
