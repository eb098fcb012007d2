"""The provider calls of one host source made beside its find(): one at a time, and the value a raise under way sets.

A multi-source provider (:mod:`cloud_elastic.providers.multi`) makes a source's ``set_capacity``, ``release`` and
``hourly_prices`` calls on whichever thread asks (the discovery thread, the driver's at the end). :class:`SideCalls`
starts one only while no call of that source runs (the check and the count are one step under its lock, so two
threads never both start one) and keeps, per call, the value a ``set_capacity`` under way sets: a call ending
clears only its own.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["SideCalls"]


class SideCalls:
    """Counts one source's provider calls other than its find() while they run (see module docstring)."""

    def __init__(self) -> None:
        self._ended = threading.Condition()
        self._setting: list[int] = []
        #: The calls under way (at most one: :meth:`start` starts none beside another).
        self.count = 0

    @contextmanager
    def start(self, idle: Callable[[], bool], setting: int | None = None) -> Iterator[bool]:
        """Count a call (a set_capacity() says its ``setting``) while the block runs, if none runs now and
        ``idle()`` (its find() does not run); yields whether it started: if not, nothing is counted and the caller
        keeps its work for later."""
        with self._ended:
            started = self.count == 0 and idle()
            if started:
                self.count += 1
                if setting is not None:
                    self._setting.append(setting)
        try:
            yield started
        finally:
            if started:
                with self._ended:
                    self.count -= 1
                    if setting is not None:
                        self._setting.remove(setting)
                    self._ended.notify_all()

    @property
    def setting(self) -> int | None:
        """The value a set_capacity() under way sets; None while none runs."""
        with self._ended:
            return max(self._setting, default=None)

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the calls under way to end; whether none runs."""
        with self._ended:
            return self._ended.wait_for(lambda: self.count == 0, max(0.0, timeout_s))
