"""The KILL orders for workers whose SSH connection dropped (driver/launch/ssh_orphans.py): the launcher's close
waits for one that the keepalive thread is starting at that very moment (a clean clone saw the close hang up the
new connection before its KILL, and the worker ran on for its 60 s grace:
test_ssh_launcher.py::test_a_connection_dropped_by_the_server_under_a_driver_grace_is_stopped_through_a_new_one)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from cloud_elastic.driver.launch.ssh_orphans import Orphans

pytestmark = pytest.mark.timeout(30)


class _Again:
    """The new connection: it reaches the wrapper after ``connect_s``; its KILL ends it at once."""

    def __init__(self, connect_s: float) -> None:
        self._at = time.monotonic() + connect_s
        self.killed = False

    @property
    def _started(self) -> bool:
        return time.monotonic() >= self._at

    def poll(self):
        return 0 if self.killed else None

    def kill(self) -> None:
        self.killed = True


def _dropped():
    """A worker whose connection dropped while it ran, with its driver alive (``left_running``)."""
    status = SimpleNamespace(transport_error="ssh to h: connection lost (not a worker failure)")
    return SimpleNamespace(poll=lambda: status, _started=True, _stopping=False, handle=lambda: {"nonce": "n"},
                           spec=SimpleNamespace(worker_id="w1", host="h"))


def test_a_close_waits_for_the_kill_a_concurrent_stop_is_still_setting_up() -> None:
    again = _Again(connect_s=0.3)
    attaching = threading.Event()

    def attach(spec, nonce, sink):  # reaching the wrapper again takes a moment (a process to start)
        attaching.set()
        time.sleep(0.3)
        return again

    orphans = Orphans(attach)
    keepalive = threading.Thread(target=orphans.stop, args=([_dropped()],))
    keepalive.start()  # the keepalive thread found the dropped connection ...
    assert attaching.wait(5)
    orphans.wait(bound_s=10)  # ... as the launcher closes: it must not go on before that KILL is sent
    assert again.killed
    keepalive.join(5)


class _Ended:
    """A new connection that ended before reaching the wrapper: ssh's own error (``transport_error``), or the
    wrapper's answer that its worker is gone (exit 1, no transport error)."""

    def __init__(self, transport_error: str | None) -> None:
        self._status = SimpleNamespace(code=255 if transport_error else 1, transport_error=transport_error)
        self._started = False
        self.spec = SimpleNamespace(worker_id="w1", host="h")

    def poll(self):
        return self._status

    def kill(self) -> None:
        pass


@pytest.mark.parametrize("first_error, tries", [("ssh to h: host unreachable: connection timed out", 2), (None, 1)])
def test_a_connection_that_failed_is_tried_again_one_the_wrapper_answered_is_not(first_error, tries) -> None:
    connections = [_Ended(first_error), _Again(connect_s=0.0)]
    attached = []

    def attach(spec, nonce, sink):
        attached.append(nonce)
        return connections[len(attached) - 1]

    orphans = Orphans(attach)
    orphans.stop([_dropped()])
    orphans.wait(bound_s=10)
    assert attached == ["n"] * tries
    assert connections[1].killed is (tries == 2)
