"""GCP: the Compute Engine metadata server.

``instance/preempted`` answers ``TRUE`` or ``FALSE``; the watcher long-polls it
(``wait_for_change=true`` with the last ``ETag``), so a preemption is seen as
soon as the server announces it. ``TRUE`` → :data:`TERMINATE` with a deadline
``preemption_notice_s`` (30 s, what GCP gives Spot and preemptible VMs) after
the watcher saw it. Each long-poll is bounded by ``long_poll_s`` (10 s); after
it, ``instance/maintenance-event`` is read once: ``NONE`` is no notice;
``TERMINATE_ON_HOST_MAINTENANCE`` (GCE will stop the VM) → :data:`TERMINATE`
with a deadline ``maintenance_notice_s`` (60 s, the shortest notice GCE gives;
GPU VMs get an hour) after the watcher saw it, since the value carries no time;
any other value (``MIGRATE_ON_HOST_MAINTENANCE``: a live migration) → the soft
:data:`MAINTENANCE`.

Every request carries ``Metadata-Flavor: Google`` and every answer must carry
it back; an answer without it did not come from a metadata server (a proxy, a
captive portal) and is ignored.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from ._polling import Answer, BadAnswer, PollingWatcher, request
from .api import MAINTENANCE, SOURCE_GCP, TERMINATE, Notice

__all__ = ["GCPMetadataWatcher", "DEFAULT_HOST"]

DEFAULT_HOST = "metadata.google.internal"
PREEMPTED = "/computeMetadata/v1/instance/preempted"
MAINTENANCE_EVENT = "/computeMetadata/v1/instance/maintenance-event"
FLAVOR = {"Metadata-Flavor": "Google"}


class GCPMetadataWatcher(PollingWatcher):
    """Preemption (long-polled) and maintenance notices from the GCE metadata server.

    ``base_url`` is ``http://metadata.google.internal`` on GCE. Other keyword
    arguments: see :class:`~cloud_elastic.notices._polling.PollingWatcher`;
    ``poll_interval_s`` is used only when the server does not long-poll.
    """

    source = SOURCE_GCP

    def __init__(self, base_url: str = f"http://{DEFAULT_HOST}", *, long_poll_s: float = 10.0,
                 preemption_notice_s: float = 30.0, maintenance_notice_s: float = 60.0, **kw: Any) -> None:
        super().__init__(base_url=base_url, **kw)
        if not long_poll_s >= 1:
            raise ValueError(f"long_poll_s must be >= 1, got {long_poll_s!r}")
        self.long_poll_s = long_poll_s
        self.preemption_notice_s = preemption_notice_s
        self.maintenance_notice_s = maintenance_notice_s
        self._etag: str | None = None
        self._value: str | None = None  # the last answer of instance/preempted
        self._maintenance_id: str | None = None

    def _read(self, path: str, *, last_etag: str | None = None) -> Answer:
        what = path.rsplit("/", 1)[-1]
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
        answer = self._read(PREEMPTED, last_etag=self._etag)
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

    def _maintenance(self) -> Notice | None:
        value = self._read(MAINTENANCE_EVENT).text()
        if not value or len(value) > 100 or not value.replace("_", "").isalnum():
            raise BadAnswer("maintenance-event: bad value", f"maintenance-event: unexpected value {value[:40]!r}")
        if value == "NONE":
            if self._maintenance_id is not None:
                self._forget(self._maintenance_id)  # over: a later one is a new notice
                self._maintenance_id = None
            return None
        self._maintenance_id = f"gcp-maintenance:{value}"
        if value.startswith("TERMINATE"):  # GCE stops the VM (onHostMaintenance=TERMINATE: GPU VMs, for instance)
            return Notice(SOURCE_GCP, TERMINATE, self._now() + self.maintenance_notice_s,
                          f"GCE host maintenance: {value} (the VM will be stopped)", self._maintenance_id)
        return Notice(SOURCE_GCP, MAINTENANCE, None, f"GCE host maintenance: {value}", self._maintenance_id)
