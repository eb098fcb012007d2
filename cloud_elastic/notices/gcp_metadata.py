"""GCP: the Compute Engine metadata server.

``instance/preempted`` answers ``TRUE`` or ``FALSE``; the watcher long-polls it
(``wait_for_change=true`` with the last ``ETag``), so a preemption is seen as
soon as the server announces it. ``TRUE`` → :data:`TERMINATE` with a deadline
``preemption_notice_s`` (30 s, what GCP gives Spot and preemptible VMs) after
the watcher saw it. Each long-poll is bounded by ``long_poll_s`` (10 s); one
that fails or stalls is followed by a plain read at once, and by plain reads
every ``poll_interval_s`` for ``LONG_POLL_RETRY_S`` (5 minutes). After each
read, ``instance/maintenance-event`` is read once: ``NONE`` is no notice;
``TERMINATE_ON_HOST_MAINTENANCE`` (GCE will stop the VM) → :data:`TERMINATE`.
That value carries no time, and GCE gives from 60 s to an hour (GPU VMs), so
its deadline is ``window_start_time`` from ``instance/upcoming-maintenance``
(JSON) when that answers with a time still ahead, and otherwise none: the
host's workers leave at their next commit, never removed by force at a
deadline made up here. While the value stays, the notice is reported again
every ``renew_s`` (30 s), so that the driver keeps it (a hard notice lapses
:data:`~cloud_elastic.notices.api.NOTICE_GRACE_S` after its deadline, or after
its last report when it has none; one this watcher re-sent stays pending once
the host's workers, and this watcher, have left: see ``HostManager`` and
:func:`~cloud_elastic.notices.api.renewed`). Any other value
(``MIGRATE_ON_HOST_MAINTENANCE``: a live migration) → the soft
:data:`MAINTENANCE`.

Every request carries ``Metadata-Flavor: Google`` and every answer must carry
it back; an answer without it did not come from a metadata server (a proxy, a
captive portal) and is ignored.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any
from urllib.parse import quote

from ._polling import Answer, BadAnswer, PollingWatcher, Unreachable, request
from .api import GCP_MAINTENANCE_REASON, MAINTENANCE, NOTICE_GRACE_S, SOURCE_GCP, TERMINATE, Notice

__all__ = ["GCPMetadataWatcher", "DEFAULT_HOST"]

DEFAULT_HOST = "metadata.google.internal"
PREEMPTED = "/computeMetadata/v1/instance/preempted"
MAINTENANCE_EVENT = "/computeMetadata/v1/instance/maintenance-event"
UPCOMING_MAINTENANCE = "/computeMetadata/v1/instance/upcoming-maintenance?alt=json"
FLAVOR = {"Metadata-Flavor": "Google"}
#: After a failed long-poll, ``instance/preempted`` is read plainly (every ``poll_interval_s``) this long.
LONG_POLL_RETRY_S = 300.0


class GCPMetadataWatcher(PollingWatcher):
    """Preemption (long-polled) and maintenance notices from the GCE metadata server.

    ``base_url`` is ``http://metadata.google.internal`` on GCE. Other keyword
    arguments: see :class:`~cloud_elastic.notices._polling.PollingWatcher`;
    ``poll_interval_s`` is used only when the server does not long-poll;
    ``renew_s``: how often a ``TERMINATE_ON_HOST_MAINTENANCE`` notice is reported again while it lasts.
    """

    source = SOURCE_GCP

    def __init__(self, base_url: str = f"http://{DEFAULT_HOST}", *, long_poll_s: float = 10.0,
                 preemption_notice_s: float = 30.0, renew_s: float = NOTICE_GRACE_S / 4, **kw: Any) -> None:
        super().__init__(base_url=base_url, **kw)
        if not long_poll_s >= 1:
            raise ValueError(f"long_poll_s must be >= 1, got {long_poll_s!r}")
        self.long_poll_s = long_poll_s
        self.preemption_notice_s = preemption_notice_s
        if not 0 < renew_s < NOTICE_GRACE_S:
            raise ValueError(f"renew_s must be above 0 and below {NOTICE_GRACE_S:g}, got {renew_s!r}")
        self.renew_s = renew_s
        self._etag: str | None = None
        self._plain_until = 0.0  # time.monotonic() before which no long-poll is tried (one failed)
        self._value: str | None = None  # the last answer of instance/preempted
        self._maintenance_id: str | None = None
        self._renew_at = 0.0  # when a TERMINATE_ON_HOST_MAINTENANCE notice is next reported again
        self._stop_time: float | None = None  # its deadline: window_start_time, as last read

    def _read(self, path: str, *, last_etag: str | None = None) -> Answer:
        what = path.rsplit("/", 1)[-1].partition("?")[0]
        if last_etag is None:
            url, timeout = self.base_url + path, self.request_timeout_s
        else:
            timeout_sec = max(1, int(self.long_poll_s))
            url = (f"{self.base_url}{path}?wait_for_change=true&timeout_sec={timeout_sec}"
                   f"&last_etag={quote(last_etag, safe='')}")
            timeout = timeout_sec + self.request_timeout_s
        answer = request("GET", url, headers=FLAVOR, timeout_s=timeout, what=what, track=self._track)
        if answer.headers.get("metadata-flavor") != "Google":
            raise BadAnswer(f"{what}: no flavor", f"{what}: answer lacks 'Metadata-Flavor: Google' "
                            "(not a metadata server)")
        if answer.status != 200:
            raise BadAnswer(f"{what}: HTTP {answer.status}", f"{what} answered HTTP {answer.status}")
        return answer

    def _cycle(self) -> tuple[list[Notice], float | None]:
        started = time.monotonic()
        answer = self._preempted()
        value = answer.text()
        if value not in ("TRUE", "FALSE"):
            raise BadAnswer("preempted: bad value", f"preempted: expected TRUE or FALSE, got {value[:40]!r}")
        etag = answer.headers.get("etag")
        # Only a new value counts: a server (or proxy) that sends a new ETag with every answer would
        # otherwise be asked again at once, forever, at full speed.
        changed = value != self._value
        self._etag, self._value = etag, value  # etag None: the server gives no ETag, so poll plainly
        notices = []
        if value == "TRUE":
            deadline = self._now() + self.preemption_notice_s
            notices.append(Notice(SOURCE_GCP, TERMINATE, deadline, "GCE preemption (instance/preempted is TRUE)",
                                  "gcp-preempted"))
        try:
            notice = self._maintenance()
            if notice is not None:
                notices.append(notice)
        except BadAnswer as exc:
            self._trouble(exc)  # a bad maintenance answer must not hide a preemption
        if etag is not None and changed:
            return notices, 0.0  # first answer or a change: long-poll again at once
        # A long-poll that ran its course needs no pause; one the server cut
        # short (or a server without ETags) waits out the rest of the interval.
        return notices, max(0.0, self.poll_interval_s - (time.monotonic() - started))

    def _preempted(self) -> Answer:
        """``instance/preempted``: long-polled once an ETag is known, read plainly after a failed long-poll.

        A long-poll that stalls or fails (a proxy that holds ``wait_for_change`` requests) is followed at once
        by a plain read, and plain reads go on for ``LONG_POLL_RETRY_S``: else every cycle would wait out one
        more long-poll, see a preemption that long late, and read no maintenance event at all.
        """
        if self._etag is None or time.monotonic() < self._plain_until:
            return self._read(PREEMPTED)
        try:
            return self._read(PREEMPTED, last_etag=self._etag)
        except BadAnswer as exc:
            if self._stop.is_set():
                raise  # close() cut the long-poll short
            self._plain_until = time.monotonic() + LONG_POLL_RETRY_S
            self._complain(f"{self.source}: long-poll", f"{self.source} at {self.base_url}: {exc}; reading "
                           f"plainly every {self.poll_interval_s:g}s for {LONG_POLL_RETRY_S:g}s")
            return self._read(PREEMPTED)

    def _maintenance(self) -> Notice | None:
        value = self._read(MAINTENANCE_EVENT).text()
        if not value or len(value) > 100 or not value.replace("_", "").isalnum():
            raise BadAnswer("maintenance-event: bad value", f"maintenance-event: unexpected value {value[:40]!r}")
        if value == "NONE":
            if self._maintenance_id is not None:
                self._forget(self._maintenance_id)  # over: a later one is a new notice
                self._maintenance_id = None
            return None
        event_id = f"gcp-maintenance:{value}"
        if value.startswith("TERMINATE"):  # GCE stops the VM (onHostMaintenance=TERMINATE: GPU VMs, for instance)
            now = self._now()
            if event_id != self._maintenance_id or now >= self._renew_at:
                if event_id == self._maintenance_id:
                    self._forget(event_id)  # reported again: the driver keeps the host's notice from lapsing
                self._stop_time, self._renew_at = self._window_start(now), now + self.renew_s
            self._maintenance_id = event_id
            return Notice(SOURCE_GCP, TERMINATE, self._stop_time,
                          f"{GCP_MAINTENANCE_REASON}{value} (the VM will be stopped)", event_id)
        self._maintenance_id = event_id
        return Notice(SOURCE_GCP, MAINTENANCE, None, f"{GCP_MAINTENANCE_REASON}{value}", event_id)

    def _window_start(self, now: float) -> float | None:
        """``window_start_time`` of ``instance/upcoming-maintenance`` (Unix time), if it answers one still ahead.

        None when the server has no such key (404), answers no time (``NONE``, ``{}``, an error), a time
        already past (the window is open: when GCE stops the VM in it is not said) or something unreadable.
        """
        try:
            answer = self._read(UPCOMING_MAINTENANCE)
        except BadAnswer as exc:
            if not exc.key.endswith("HTTP 404"):
                self._trouble(exc)
            return None
        except Unreachable:
            return None  # the next cycle's long-poll tells
        try:
            data = json.loads(answer.body)
        except (ValueError, RecursionError):
            return None  # NONE, or not JSON at all
        if not isinstance(data, dict):
            return None
        # A flat object; GCE's documented example shows it wrapped once ("Upcoming maintenance": {...}).
        for found in [data, *(v for v in data.values() if isinstance(v, dict))]:
            text = found.get("window_start_time", found.get("windowStartTime"))
            if isinstance(text, str) and len(text) <= 64:
                try:
                    when = datetime.fromisoformat(text)
                except ValueError:
                    return None
                return when.timestamp() if when.tzinfo is not None and when.timestamp() > now else None
        return None
