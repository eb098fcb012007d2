"""Azure: Scheduled Events from the instance metadata service (IMDS).

Each cycle (every ``poll_interval_s``, 0.5 s by default) reads
``/metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true``
and keeps the events whose ``Resources`` name this VM:

* ``Preempt`` (Spot eviction, at least 30 s ahead) and ``Terminate`` (scale-in,
  delete; ``termination_notification`` on the scale set) → :data:`TERMINATE`
  with ``NotBefore`` as the deadline (an event already ``Started`` has no
  ``NotBefore``: the deadline is now; one without a zone, or ``-0000``, is UTC);
* ``Freeze``, ``Reboot``, ``Redeploy`` → the soft :data:`MAINTENANCE`.

This VM's name is the ``vm_name`` given, or read once from
``/metadata/instance/compute/name``. :meth:`AzureScheduledEventsWatcher.acknowledge`
POSTs ``{"StartRequests": [{"EventId": …}]}`` for the terminate events reported,
which lets the platform go ahead before ``NotBefore``.
"""

from __future__ import annotations

import json
import logging
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable

from ._polling import BadAnswer, PollingWatcher, Unreachable, log, request
from .api import MAINTENANCE, SOURCE_AZURE, TERMINATE, Notice

__all__ = ["AzureScheduledEventsWatcher", "DEFAULT_ENDPOINT"]

DEFAULT_ENDPOINT = "http://169.254.169.254"
EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
HEADERS = {"Metadata": "true"}
TERMINATING = ("Preempt", "Terminate")
MAINTAINING = ("Freeze", "Reboot", "Redeploy")
#: How often an acknowledgement that waits for the host's other workers looks again.
ACK_WAIT_POLL_S = 0.1


class AzureScheduledEventsWatcher(PollingWatcher):
    """Preempt/Terminate (hard) and Freeze/Reboot/Redeploy (soft) events for this VM.

    ``base_url`` is ``http://169.254.169.254`` on Azure; ``vm_name`` this VM's
    name as scheduled events list it (read from IMDS when None). Other keyword
    arguments: see :class:`~cloud_elastic.notices._polling.PollingWatcher`.
    """

    source = SOURCE_AZURE

    def __init__(self, base_url: str = DEFAULT_ENDPOINT, *, vm_name: str | None = None, **kw: Any) -> None:
        super().__init__(base_url=base_url, **kw)
        self.vm_name = vm_name
        self._acknowledged: set[str] = set()

    def _get(self, path: str, what: str) -> bytes:
        answer = request("GET", self.base_url + path, headers=HEADERS, timeout_s=self.request_timeout_s, what=what,
                         track=self._track)
        if answer.status != 200:
            raise BadAnswer(f"{what}: HTTP {answer.status}", f"{what} answered HTTP {answer.status}")
        return answer.body

    def _cycle(self) -> tuple[list[Notice], float | None]:
        if self.vm_name is None:
            name = self._get(NAME_PATH, "compute/name").decode("utf-8", "replace").strip()
            if not name or len(name) > 256 or any(c.isspace() for c in name):
                raise BadAnswer("compute/name: bad value", f"compute/name: unusable VM name {name[:40]!r}")
            self.vm_name = name
            log.debug("Azure scheduled events: this VM is %s", name)
        body = self._get(EVENTS_PATH, "scheduledevents")
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadAnswer("scheduledevents: bad JSON", f"scheduledevents: not JSON: {body[:80]!r}") from exc
        events = doc.get("Events") if isinstance(doc, dict) else None
        if not isinstance(events, list):
            raise BadAnswer("scheduledevents: no Events", f"scheduledevents: no Events list in {body[:80]!r}")
        notices = []
        for event in events:
            try:
                notice = self._notice(event)
            except BadAnswer as exc:
                self._trouble(exc)  # one malformed event must not hide the others
                continue
            if notice is not None:
                notices.append(notice)
        return notices, None

    def _notice(self, event: Any) -> Notice | None:
        if not isinstance(event, dict):
            raise BadAnswer("scheduledevents: bad event", f"scheduledevents: event is not an object: {event!r:.80}")
        event_id, kind, resources = event.get("EventId"), event.get("EventType"), event.get("Resources")
        if not isinstance(event_id, str) or not event_id or not isinstance(kind, str) or not isinstance(resources, list):
            raise BadAnswer("scheduledevents: bad event", f"scheduledevents: event lacks EventId/EventType/Resources: "
                            f"{json.dumps(event)[:120]}")
        if len(event_id) > 200 or not event_id.isprintable() or any(c.isspace() for c in event_id):
            raise BadAnswer("scheduledevents: bad event", f"scheduledevents: unusable EventId {event_id[:80]!r}")
        if self.vm_name not in resources:
            return None  # another VM's event (scheduled events list the whole availability set / scale set)
        if kind in TERMINATING:
            notice_kind = TERMINATE
        elif kind in MAINTAINING:
            notice_kind = MAINTENANCE
        else:
            self._complain(f"{self.source}: type {kind}", f"scheduledevents: unknown EventType {kind!r}",
                           logging.INFO)
            return None
        deadline = self._not_before(event.get("NotBefore"), event_id)
        source = event.get("EventSource")
        source = source[:80] if isinstance(source, str) and source.isprintable() else None  # a reason is one line
        reason = f"Azure scheduled event {kind} {event_id}" + (f" ({source})" if source else "")
        return Notice(SOURCE_AZURE, notice_kind, deadline, reason, event_id)

    def _not_before(self, value: Any, event_id: str) -> float:
        if value in (None, ""):
            return self._now()  # Started: it is happening now
        if not isinstance(value, str):
            raise BadAnswer("scheduledevents: bad NotBefore", f"event {event_id}: NotBefore {value!r} is not a date")
        try:
            when = parsedate_to_datetime(value)
            if when.tzinfo is None:  # no zone, or "-0000" (RFC 2822: zone unknown): IMDS writes UTC, not our zone
                when = when.replace(tzinfo=timezone.utc)
            return when.timestamp()
        except (TypeError, ValueError, IndexError, OverflowError) as exc:  # OverflowError: a year past any calendar
            raise BadAnswer("scheduledevents: bad NotBefore",
                            f"event {event_id}: unreadable NotBefore {value[:80]!r}") from exc

    def _unacknowledged(self) -> list[Notice]:
        with self._lock:
            return [n for n in self._reported.values() if n.kind == TERMINATE and n.event_id not in self._acknowledged]

    def acknowledge(self, until: Callable[[], bool] | None = None) -> tuple[str, ...]:
        notices = self._unacknowledged()
        if notices and until is not None and not until():
            # The eviction follows the acknowledgement at once: not while a worker of this host (rank 0
            # writing the last checkpoint) is still leaving. At the deadline Azure goes ahead anyway.
            deadline = min(self._now() if n.deadline is None else n.deadline for n in notices)
            while not until() and self._now() < deadline:
                if self._stop.wait(ACK_WAIT_POLL_S):
                    return ()
            if not until():
                log.warning("acknowledging Azure scheduled events at their deadline: workers of this host "
                            "were still there")
            notices = self._unacknowledged()
        pending = [n.event_id for n in notices]
        if not pending:
            return ()
        body = json.dumps({"StartRequests": [{"EventId": e} for e in pending]}).encode()
        try:
            answer = request("POST", self.base_url + EVENTS_PATH, body=body, timeout_s=self.request_timeout_s,
                             headers={**HEADERS, "Content-Type": "application/json"}, what="scheduledevents ack")
            if answer.status != 200:
                raise BadAnswer("ack: HTTP", f"acknowledging {pending} answered HTTP {answer.status}")
        except (BadAnswer, Unreachable) as exc:
            self._complain(f"{self.source}: ack", f"{self.source}: could not acknowledge {pending}: {exc}")
            return ()
        with self._lock:
            self._acknowledged.update(pending)
        log.info("acknowledged Azure scheduled events %s", ", ".join(pending))
        return tuple(pending)
