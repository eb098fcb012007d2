"""Timing spans of a worker's admission path, for ``workload.py --trace`` (``admission_profile.py`` reads them).

:func:`install` wraps, in this process only, the calls an admission makes on the
running workers and on the newcomer, and prints one ``TRACE {json}`` line per
call: its label, its start and end (wall clock, as the ``STEPLOG`` lines'), the
name it was given (a collective's ``name``) and the process id. Nothing in
``cloud_elastic`` changes: the wrappers replace module and class attributes that
the product looks up at call time (``follow._pace`` from ``follow.at_commit``,
``collectives.broadcast_state`` from ``sync_facts.share``, ...).

The calls made at every step of a job without a follower (the commit, its
membership check, ``follow.at_commit``, the waits for a collective) are printed
only when they took 0.3 ms or more, so that an undisturbed step is not slowed by a line per call; every
other label is printed always.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import time
from typing import Any, Callable

#: (module, attribute: a function or ``Class.method``, label), in the order an admission meets them.
TARGETS = [
    ("cloud_elastic.worker.commit.state", "State.commit", "commit"),
    ("cloud_elastic.worker.commit.state", "State.check_host_updates", "membership check"),
    ("cloud_elastic.worker.context", "WorkerContext.rendezvous", "rendezvous"),
    ("cloud_elastic.worker.context", "WorkerContext._form_group", "form or adopt the group"),
    ("cloud_elastic.worker.commit.follow", "shed", "newcomer sheds its own state"),
    ("cloud_elastic.worker.elastic", "_sync", "sync"),
    ("cloud_elastic.worker.commit.sync_facts", "begin", "sync facts gather"),
    ("cloud_elastic.worker.commit.sync_facts", "share", "small parts: built and broadcast"),
    ("cloud_elastic.worker.comm.collectives", "broadcast_state", "small parts broadcast"),
    ("cloud_elastic.worker.comm.statecodec", "encode", "small parts encoded"),
    ("cloud_elastic.worker.comm.statecodec", "decode", "small parts decoded"),
    ("cloud_elastic.worker.comm.collectives", "broadcast_", "tensor broadcast"),
    ("cloud_elastic.worker.comm.shapes", "gather_rows_of", "shapes gathered"),
    ("cloud_elastic.worker.context", "WorkerContext.wait", "waits for a collective"),
    ("cloud_elastic.worker.commit.follow", "start", "follow.start"),
    ("cloud_elastic.worker.elastic", "_hold_synced_state", "hold the synced state"),
    ("cloud_elastic.worker.commit.state", "State.on_reset", "reset"),
    ("cloud_elastic.worker.commit.follow", "at_commit", "follow.at_commit"),
    ("cloud_elastic.worker.commit.follow", "_pace", "pace broadcast"),
    ("cloud_elastic.worker.comm.heal", "Heal.tensors", "pieces sent/received"),
    ("cloud_elastic.worker.comm.heal", "Heal.buffers", "model buffers"),
    ("cloud_elastic.worker.commit.follow", "_digest", "piece digest"),
    ("cloud_elastic.worker.commit.follow", "fingerprint", "fingerprint (window end)"),
    ("cloud_elastic.worker.commit.follow", "_gather", "activation allgather"),
    ("cloud_elastic.worker.commit.follow", "_resave", "follower re-saves"),
]

#: Labels of calls made at every commit: printed only from this many seconds.
PER_COMMIT = {"commit", "membership check", "follow.at_commit", "waits for a collective"}
PER_COMMIT_MIN_S = 0.0003


def _emit(label: str, t0: float, t1: float, args: tuple) -> None:
    name = next((a for a in args if isinstance(a, str)), None)
    print("TRACE " + json.dumps({"l": label, "t0": t0, "t1": t1, "pid": os.getpid(), "name": name}), flush=True)


def _wrap(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    per_commit = label in PER_COMMIT

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = time.time()
            if not per_commit or t1 - t0 >= PER_COMMIT_MIN_S:
                _emit(label, t0, t1, args)

    return traced


def install() -> None:
    """Wrap every target (once per process)."""
    if getattr(sys.modules[__name__], "_installed", False):
        return
    for module_name, attr, label in TARGETS:
        owner: Any = importlib.import_module(module_name)
        *path, leaf = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, leaf, _wrap(getattr(owner, leaf), label))
    globals()["_installed"] = True


def parse(line: str) -> dict | None:
    """The span of a ``TRACE`` line (None for any other line)."""
    at = line.find("TRACE {")
    if at < 0:
        return None
    try:
        return json.loads(line[at + len("TRACE "):])
    except ValueError:
        return None
