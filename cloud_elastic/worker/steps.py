"""Which optimizer steps of the worker process count as trained steps (steps/s, a rollback's ``steps_lost``).

:func:`count_steps` (``hvd.init``) registers one torch step post-hook for every optimizer of the process,
wrapped in ``DistributedOptimizer`` or not. It counts a step once it returns (one that raised was not
trained), and only the outermost: an optimizer whose ``step`` runs another's (a subclass calling
``super().step()``, a Lookahead-style wrapper stepping its inner optimizer) takes one step, though torch
runs the global hook on each hooked ``step``. Steps taken :func:`uncounted` (torch DCP's learning-rate-0
step that gives an optimizer with no state its state) train nothing and are not counted; a step at
learning rate 0 of the script's own (a warm-up from 0) is.
"""

from __future__ import annotations

import contextlib
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


def count_steps(note_step: Callable[[], None]) -> None:
    """Call ``note_step()`` once per outermost optimizer step of the process that returns (once per process)."""

    def counted(optimizer: Any, args: Any, kwargs: Any) -> None:
        if getattr(_LOCAL, "uncounted", 0):
            return
        # No depth kept between hooks, so a step that raised leaves nothing stuck: this step is nested when the
        # torch step wrapper that runs this hook (the caller's frame) is also on the stack above it.
        wrapper = sys._getframe(1)
        outer = wrapper.f_back
        while outer is not None:
            if outer.f_code is wrapper.f_code:
                return  # the outer step counts once it returns
            outer = outer.f_back
        note_step()

    register_optimizer_step_post_hook(counted)
    _dcp_setup_uncounted()


def _dcp_setup_uncounted() -> None:
    """Take torch DCP's optimizer set-up step (``get_optimizer_state_dict``, ``set_optimizer_state_dict`` of an
    optimizer with no state step it at learning rate 0) :func:`uncounted`. The function is torch's private one:
    a torch without it leaves those steps counted, nothing worse."""
    try:
        from torch.distributed.checkpoint import state_dict
    except ImportError:  # a torch built without distributed has no DCP
        return
    setup = getattr(state_dict, "_init_optim_state", None)
    if setup is None or getattr(setup, "ce_uncounted", False):
        return

    def init_optim_state(*args: Any, **kwargs: Any) -> Any:
        with uncounted():
            return setup(*args, **kwargs)

    init_optim_state.ce_uncounted = True  # type: ignore[attr-defined]
    state_dict._init_optim_state = init_optim_state
