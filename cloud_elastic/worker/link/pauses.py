"""How long this worker's heartbeats can be held up while it is healthy: collections, compiles, first steps.

The heartbeat thread shares only the GIL with the training thread, and Python hands
the GIL over every few milliseconds, except inside one long C call. The common one in
a training process is a full garbage collection, which holds the GIL for the whole
scan: about 0.05-0.2 µs per allocated block (0.08 s for a bare torch worker, 0.5-1.8 s
with 3 million small objects, the longer when the machine is loaded).

:class:`Pauses` tells the driver, with every heartbeat, the longest such pause to
expect (``pause_s``), so that its fast silence rule allows for it (see
``driver/job/liveness.py``). It is the larger of

* the longest full collection measured in this process over the last
  :data:`MEMORY_S` (``gc.callbacks``: two clock reads per collection, none
  allocated);
* a prior from the heap's size (``sys.getallocatedblocks()``, O(1)) at
  :data:`PRIOR_S_PER_BLOCK`, for the first collection of a heap that grew since;
* :data:`BUSY_S` during the first optimizer step of a round and while
  ``torch.compile`` compiles: a compile held a heartbeat thread for 2.8 s here
  (``aot_eager``, a loaded machine), and a first step is where compiles, lazy
  initialisation and autotuning happen. The fast rule then leaves the worker to
  the heartbeat timeout. Compiles are seen through dynamo's compile callbacks,
  hooked once ``torch._dynamo`` has been imported by someone else (importing it
  here would cost every worker seconds).
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

__all__ = ["BUSY_S", "Pauses", "MEMORY_S", "PRIOR_S_PER_BLOCK"]

#: A measured pause is expected again for this long.
MEMORY_S = 600.0
#: Seconds of a full collection per allocated block, at the slow end of what was measured here (loaded).
PRIOR_S_PER_BLOCK = 0.2e-6
#: Announced during a round's first step and while compiling: more than any heartbeat timeout, so the
#: driver's fast rule does not judge the worker then.
BUSY_S = 600.0


class Pauses:
    """The longest GIL pause to expect (see module docstring).

    ``start()`` hooks into ``gc.callbacks``, ``close()`` unhooks (dynamo's too);
    :meth:`expected_s` is called by the heartbeat thread.
    """

    def __init__(self) -> None:
        self._started = 0.0
        self._longest = 0.0
        self._longest_at = float("-inf")
        self._compiling = 0
        self._dynamo: Any = None  # dynamo's callback handler, once hooked

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        if self._dynamo is not None:
            self._dynamo.remove_start_callback(self._compile_started)
            self._dynamo.remove_end_callback(self._compile_ended)
            self._dynamo = None

    def _compile_started(self, _args: Any) -> None:
        self._compiling += 1

    def _compile_ended(self, _args: Any) -> None:
        self._compiling = max(0, self._compiling - 1)

    def _hook_compiles(self) -> None:
        module = sys.modules.get("torch._dynamo.callback")
        handler = getattr(module, "callback_handler", None)
        if handler is None or not hasattr(handler, "register_start_callback"):
            return
        handler.register_start_callback(self._compile_started)
        handler.register_end_callback(self._compile_ended)
        self._dynamo = handler

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        now = time.monotonic()
        if phase == "start":
            self._started = now
            return
        took = now - self._started
        if took >= self._longest or now - self._longest_at > MEMORY_S:
            self._longest, self._longest_at = took, now

    def expected_s(self, now: float | None = None, first_step: bool = False) -> float:
        """The longest pause to expect now, in seconds (rounded to the millisecond); ``first_step``: the
        worker is in the first optimizer step of its round."""
        if self._dynamo is None:
            self._hook_compiles()
        if first_step or self._compiling:
            return BUSY_S
        now = time.monotonic() if now is None else now
        measured = self._longest if now - self._longest_at <= MEMORY_S else 0.0
        return round(max(measured, sys.getallocatedblocks() * PRIOR_S_PER_BLOCK), 3)
