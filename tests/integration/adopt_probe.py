"""``probe.py`` whose EVENT lines also go to ``EVENTS_DIR/<pid>.jsonl`` (the first argument),
each with its Unix time ``t``.

A worker adopted by a restarted driver has lost its output pipe with the old
driver, so the tests read what it did from these files instead.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import probe

_DIR = sys.argv.pop(1)
_print_event = probe.event


def event(kind: str, **fields: object) -> None:
    _print_event(kind, **fields)
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), pid=os.getpid(), t=time.time())
    with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(fields) + "\n")


probe.event = event

if __name__ == "__main__":
    probe.main()
