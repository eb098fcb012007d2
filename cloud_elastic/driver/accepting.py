"""A listening socket that cannot accept (the process is out of descriptors): pause it, do not spin.

A connection that ``accept()`` cannot take stays in the listener's backlog, so the
listener stays readable and a selector loop would wake at once, fail again and
log again, at full CPU, for as long as the shortage lasts. :class:`AcceptPause`
takes the listener out of the selector for a moment instead and puts it back
when the loop asks (:meth:`resume_if_due`); the waiting connections are accepted
then. One warning per shortage, not one per attempt.
"""

from __future__ import annotations

import errno
import logging
import selectors
import time
from typing import Any

__all__ = ["AcceptPause", "PAUSE_S"]

log = logging.getLogger(__name__)

#: How long the listener is left alone after an accept that failed for want of descriptors or memory.
PAUSE_S = 0.25
_SHORTAGES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class AcceptPause:
    """Pauses ``listener`` (registered in ``selector`` with ``data``) while accepting fails for want of resources."""

    def __init__(self, selector: selectors.BaseSelector, listener: Any, data: Any, what: str) -> None:
        self._selector, self._listener, self._data, self._what = selector, listener, data, what
        self._until: float | None = None
        self._short = False  # a shortage was logged and no accept has succeeded since

    def failed(self, exc: OSError) -> bool:
        """``accept()`` raised ``exc``: True if it was a shortage (the listener is then paused)."""
        if exc.errno not in _SHORTAGES:
            return False
        if self._until is None:
            self._selector.unregister(self._listener)
        self._until = time.monotonic() + PAUSE_S
        if not self._short:
            self._short = True
            log.warning("%s: cannot accept connections (%s); they wait, and are accepted once descriptors are "
                        "free again", self._what, exc)
        return True

    def accepted(self) -> None:
        if self._short:
            self._short = False
            log.warning("%s: accepting connections again", self._what)

    def timeout(self, other: float | None) -> float | None:
        """The selector's timeout: ``other`` (None: none), or less, to resume accepting on time."""
        if self._until is None:
            return other
        left = max(0.0, self._until - time.monotonic())
        return left if other is None else min(other, left)

    def resume_if_due(self) -> None:
        if self._until is not None and time.monotonic() >= self._until:
            self._until = None
            self._selector.register(self._listener, selectors.EVENT_READ, self._data)
