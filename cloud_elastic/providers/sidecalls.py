"""The provider calls of one host source: its find() on a thread of its own (:class:`Caller`), and those made beside
it (:class:`SideCalls`), one at a time.

A multi-source provider (:mod:`cloud_elastic.providers.multi`) makes a source's ``set_capacity`` and ``hourly_prices``
calls on a second :class:`Caller` of the source's own, and ``release`` on whichever thread asks. :class:`SideCalls`
starts one only while no call of that source runs (the check and the count are one step under its lock, so two
threads never both start one).
"""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from typing import Callable, Generic, Iterator, TypeVar

__all__ = ["Caller", "SideCalls"]

T = TypeVar("T")


class Caller(Generic[T]):
    """Runs ``call`` on one thread of its own, one call at a time, for a waiter that may give up on it.

    A call given up on runs on: the next :meth:`ask` or :meth:`answer` starts none beside it (a provider never
    sees two calls at once), and :meth:`answer` waits for it and takes its answer. Only one thread calls
    :meth:`ask` and :meth:`answer`. The thread starts at the first call, not in the constructor.
    """

    def __init__(self, call: Callable[[], T], name: str = "discovery-call") -> None:
        self._call = call
        self._name = name
        self._asks: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: A call is under way, perhaps given up on (the write paths wait for its end).
        self.busy = False
        #: Set while no call runs (its answer may not be taken yet): another thread may wait for it.
        self._idle = threading.Event()
        self._idle.set()

    def ask(self) -> None:
        """Start a call, unless one is under way."""
        if not self.busy:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            self._idle.clear()
            self._asks.put(True)
            self.busy = True

    def answer(self, timeout_s: float) -> T | None:
        """The answer of the call under way, or of a new one; None if none came within ``timeout_s``."""
        self.ask()
        try:
            result = self._answers.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        self.busy = False
        return result

    @property
    def running(self) -> bool:
        """Whether a call runs now (unlike :attr:`busy`, False once it has ended, its answer not yet taken)."""
        return not self._idle.is_set()

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the call that runs now, if any, to end; whether none runs."""
        return self._idle.wait(max(0.0, timeout_s))

    def close(self) -> None:
        """Let the thread end, once the call under way (if any) has."""
        self._asks.put(False)

    def join(self, timeout_s: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def _serve(self) -> None:
        while self._asks.get():
            answer = self._call()
            self._idle.set()  # before the answer is taken: the next ask() clears it after this
            self._answers.put(answer)


class SideCalls:
    """Counts one source's provider calls other than its find() while they run (see module docstring)."""

    def __init__(self) -> None:
        self._ended = threading.Condition()
        #: The calls under way (at most one: :meth:`start` starts none beside another).
        self.count = 0

    @contextmanager
    def start(self, idle: Callable[[], bool]) -> Iterator[bool]:
        """Count a call while the block runs, if none runs now and ``idle()`` (its find() does not run); yields
        whether it started: if not, nothing is counted and the caller keeps its work for later."""
        with self._ended:
            started = self.count == 0 and idle()
            if started:
                self.count += 1
        try:
            yield started
        finally:
            if started:
                with self._ended:
                    self.count -= 1
                    self._ended.notify_all()

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the calls under way to end; whether none runs."""
        with self._ended:
            return self._ended.wait_for(lambda: self.count == 0, max(0.0, timeout_s))
