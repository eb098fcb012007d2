"""Which optimizer steps of the worker process count as trained steps (steps/s, a rollback's ``steps_lost``).

:func:`count_steps` (``hvd.init``) registers one torch step post-hook for every optimizer of the process,
wrapped in ``DistributedOptimizer`` or not. It counts a step once it returns (one that raised was not
trained), and only the outermost: an optimizer whose ``step`` runs another's (a subclass calling
``super().step()``, a Lookahead-style wrapper stepping its inner optimizer) takes one step, though torch
runs the global hook on each hooked ``step``. Steps that set state up train nothing and are not counted:
those taken :func:`uncounted` (the sharded checkpoint's) and torch DCP's learning-rate-0 step that gives an
optimizer with no state its state (found on the stack); a step at learning rate 0 of the script's own (a
warm-up from 0) is counted.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Callable, Iterator

from torch.optim.optimizer import register_optimizer_step_post_hook

__all__ = ["count_steps", "uncounted"]

_LOCAL = threading.local()


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Optimizer steps this thread takes inside are not trained steps (they set state up, as DCP's)."""
    before = getattr(_LOCAL, "uncounted", 0)
    _LOCAL.uncounted = before + 1
    try:
        yield
    finally:
        _LOCAL.uncounted = before


def count_steps(note_step: Callable[[Any], None]) -> None:
    """Call ``note_step(optimizer)`` once per outermost optimizer step of the process that returns (once per
    process)."""

    def counted(optimizer: Any, args: Any, kwargs: Any) -> None:
        if getattr(_LOCAL, "uncounted", 0):
            return
        # No depth kept between hooks, so a step that raised leaves nothing stuck: this step is nested when the
        # stack holds another of torch's step wrappers (``profile_hook_step``'s ``wrapper``, in the file of the
        # hook's caller) above this step's own. A torch.compile'd step calls the hook from dynamo's resume
        # function in that file, inside its wrapper, so the wrappers are counted by name and file, not identity.
        # Torch DCP's set-up step (get_/set_optimizer_state_dict of an optimizer with no state step it at
        # learning rate 0, in its private _init_optim_state) is found on the same walk, without importing DCP.
        frame = sys._getframe(1)
        torch_file = frame.f_code.co_filename
        wrappers = 0
        while frame is not None:
            code = frame.f_code
            if code.co_name == "wrapper" and code.co_filename == torch_file:
                wrappers += 1
                if wrappers > 1:
                    return  # the outer step counts once it returns
            elif code.co_name == "_init_optim_state" and code.co_filename.endswith(_DCP_STATE_DICT):
                return
            frame = frame.f_back
        note_step(optimizer)

    register_optimizer_step_post_hook(counted)


#: Where torch DCP's ``_init_optim_state`` lives (a private function: a torch without it just counts that step).
_DCP_STATE_DICT = (os.path.join("checkpoint", "state_dict.py"),)
