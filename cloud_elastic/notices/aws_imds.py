"""AWS: the EC2 instance metadata service, IMDSv2 (token) flow.

Each cycle (every ``poll_interval_s``, 0.5 s by default) reads three paths with
the session token:

* ``/latest/meta-data/spot/instance-action``: 404 while there is no notice;
  ``{"action": "terminate"|"stop"|"hibernate", "time": "…Z"}`` about two minutes
  before the interruption → :data:`TERMINATE` with that deadline (a stopped or
  hibernated instance leaves the job just the same, and so does an action this
  code does not know, logged once). One notice per action: its first time is
  the deadline.
* ``/latest/meta-data/events/recommendations/rebalance``: ``{"noticeTime": "…Z"}``
  → the soft :data:`REBALANCE`, no deadline (one per instance).
* ``/latest/meta-data/autoscaling/target-lifecycle-state``: ``Terminated`` →
  :data:`TERMINATE`, no deadline (the group's lifecycle hook holds the instance).

The token (``PUT /latest/api/token``) is renewed before it expires, at once
when a read answers 401, and at the next read after any other failed read. An
answer that is not a plausible token (printable ASCII without whitespace: not
a proxy's HTML page) is not kept.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from ._polling import BadAnswer, PollingWatcher, request
from .api import REBALANCE, SOURCE_AWS, TERMINATE, Notice

__all__ = ["AWSMetadataWatcher", "DEFAULT_ENDPOINT"]

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
SPOT_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
LIFECYCLE_PATH = "/latest/meta-data/autoscaling/target-lifecycle-state"
SPOT_ACTIONS = ("terminate", "stop", "hibernate")


def parse_aws_time(value: Any, what: str) -> float:
    """``2017-09-18T08:22:00Z`` → Unix seconds; BadAnswer otherwise."""
    if not isinstance(value, str):
        raise BadAnswer(f"{what}: bad time", f"{what}: time {value!r} is not a string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise BadAnswer(f"{what}: bad time", f"{what}: unreadable time {value!r}") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


class AWSMetadataWatcher(PollingWatcher):
    """Spot interruption, rebalance and lifecycle-state notices from IMDSv2.

    ``base_url`` is the metadata endpoint (``http://169.254.169.254`` on EC2);
    ``token_ttl_s`` the lifetime asked for each session token (1-21600).
    Other keyword arguments: see :class:`~cloud_elastic.notices._polling.PollingWatcher`.
    """

    source = SOURCE_AWS

    def __init__(self, base_url: str = DEFAULT_ENDPOINT, *, token_ttl_s: int = 21600, **kw: Any) -> None:
        super().__init__(base_url=base_url, **kw)
        if not 1 <= token_ttl_s <= 21600:
            raise ValueError(f"token_ttl_s must be 1-21600, got {token_ttl_s!r}")
        self.token_ttl_s = token_ttl_s
        self._token: str | None = None
        self._token_renew_at = 0.0

    def _cycle(self) -> tuple[list[Notice], float | None]:
        notices: list[Notice] = []
        self._session_token()  # no token, no reads: let the loop log it once
        for path, parse in ((SPOT_PATH, self._spot), (REBALANCE_PATH, self._rebalance),
                            (LIFECYCLE_PATH, self._lifecycle)):
            try:
                answer = self._get(path)
                if answer is not None:
                    notice = parse(answer)
                    if notice is not None:
                        notices.append(notice)
            except BadAnswer as exc:
                # One bad path must not hide a notice on another.
                self._trouble(exc)
        return notices, None

    # -- token -----------------------------------------------------------------------

    def _session_token(self) -> str:
        now = time.monotonic()
        if self._token is None or now >= self._token_renew_at:
            answer = request("PUT", self.base_url + TOKEN_PATH, timeout_s=self.request_timeout_s, what="api/token",
                             headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)},
                             track=self._track)
            token = answer.text()
            if answer.status != 200:
                raise BadAnswer(f"api/token: HTTP {answer.status}",
                                f"token request answered HTTP {answer.status} {token[:80]!r}")
            if not token or len(token) > 4096 or not all("!" <= c <= "~" for c in token):
                # A header value it could not be (an HTML page, a newline): every read would fail before it
                # reached the service, neither 401 nor a bad answer, until the token's renewal hours later.
                raise BadAnswer("api/token: bad token", f"token request answered no usable token {token[:80]!r}")
            self._token = token
            # Renew well before expiry so a slow cycle never uses a dead token.
            self._token_renew_at = now + max(self.token_ttl_s * 0.8, self.token_ttl_s - 60)
        return self._token

    def _get(self, path: str) -> bytes | None:
        """The body at ``path``, or None for 404 (no notice)."""
        what = path.rsplit("meta-data/", 1)[-1]
        try:
            for attempt in (1, 2):
                answer = request("GET", self.base_url + path, timeout_s=self.request_timeout_s, what=what,
                                 headers={"X-aws-ec2-metadata-token": self._session_token()}, track=self._track)
                if answer.status == 401 and attempt == 1:
                    self._token = None  # expired or revoked: renew once and retry
                    continue
                if answer.status == 404:
                    return None
                if answer.status != 200:
                    raise BadAnswer(f"{what}: HTTP {answer.status}", f"{what} answered HTTP {answer.status}")
                return answer.body
            raise BadAnswer(f"{what}: HTTP 401", f"{what} refused a fresh token (HTTP 401)")
        except BadAnswer:
            # Whatever failed, the token may be the cause: a fresh one costs one local PUT, a bad one
            # kept would cost every read until its renewal.
            self._token = None
            raise

    # -- the three paths ---------------------------------------------------------------

    @staticmethod
    def _json(body: bytes, what: str) -> dict[str, Any]:
        try:
            value = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            raise BadAnswer(f"{what}: bad JSON", f"{what}: not JSON: {body[:80]!r}") from exc
        if not isinstance(value, dict):
            raise BadAnswer(f"{what}: bad JSON", f"{what}: not a JSON object: {body[:80]!r}")
        return value

    def _spot(self, body: bytes) -> Notice:
        doc = self._json(body, "spot/instance-action")
        deadline = parse_aws_time(doc.get("time"), "spot/instance-action")
        action = doc.get("action")
        if action in SPOT_ACTIONS:
            what = str(action)
        else:
            # The path answers only while EC2 is about to take the instance, whatever it calls the action
            # (the queue's watcher drains the same way): leave, and say once what was not understood.
            what = f"unknown action {str(action)[:40]!r}"
            self._complain(f"{self.source}: spot action", f"{self.source}: spot/instance-action: {what}; "
                           "draining the host as for terminate")
        # One notice per action, whatever its time: a service whose time moved at every read would
        # otherwise send the driver a new notice every cycle (and grow the book of those reported).
        return Notice(SOURCE_AWS, TERMINATE, deadline, f"EC2 Spot interruption: {what} at {str(doc['time'])[:40]}",
                      f"aws-spot:{what}")

    def _rebalance(self, body: bytes) -> Notice:
        doc = self._json(body, "events/recommendations/rebalance")
        when = doc.get("noticeTime")
        parse_aws_time(when, "events/recommendations/rebalance")
        return Notice(SOURCE_AWS, REBALANCE, None, f"EC2 rebalance recommendation at {str(when)[:40]}",
                      "aws-rebalance")

    def _lifecycle(self, body: bytes) -> Notice | None:
        state = body.decode("utf-8", "replace").strip()
        if state != "Terminated":
            return None  # InService, Standby, Warmed:*... are not notices
        return Notice(SOURCE_AWS, TERMINATE, None, "Auto Scaling target lifecycle state is Terminated",
                      "aws-lifecycle:Terminated")
