"""AWS queue mode: interruption and lifecycle notices read from an SQS queue.

An EventBridge rule (the Terraform AWS module creates one) sends three kinds
of events for the group's instances to an SQS queue; each message body is the
event JSON. :func:`parse_message` turns one body into a :class:`Notice` or an
:class:`Ignored` (it never raises), :class:`NoticeBook` remembers the notices
per instance until they lapse, :func:`receive_all` reads what is waiting in
the queue without blocking, and :class:`QueueReceiver` long-polls the queue on
its own thread so that a notice reaches the driver at once, not at the next
discovery.

===========================================  ==================  =============================================
event (``detail-type``)                      kind                what the snapshot shows
===========================================  ==================  =============================================
``EC2 Spot Instance Interruption Warning``   ``spot``            draining, deadline = event ``time`` + 120 s
``EC2 Instance-terminate Lifecycle Action``  ``lifecycle``       draining, deadline from the hook's timeout
``EC2 Instance Rebalance Recommendation``    ``rebalance``       soft notice (draining with ``drain_on_rebalance``)
===========================================  ==================  =============================================

A lifecycle hook that targets the queue directly (``NotificationTargetARN``,
no EventBridge) sends a flat message with the same fields; it is read too, and
its ``autoscaling:TEST_NOTIFICATION`` is ignored. An event wrapped in an SNS
envelope (``"Type": "Notification"``) is unwrapped once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from cloud_elastic.notices.api import MAX_NOTICE_LEAD_S, NOTICE_GRACE_S, SOFT_NOTICE_TTL_S

__all__ = ["SPOT_WARNING_S", "Notice", "Ignored", "parse_message", "NoticeBook", "receive_all", "QueueReceiver"]

_log = logging.getLogger(__name__)

#: AWS reclaims a spot instance about two minutes after its interruption warning.
SPOT_WARNING_S = 120.0
SOURCE = "aws-sqs"
_SPOT = "EC2 Spot Instance Interruption Warning"
_REBALANCE = "EC2 Instance Rebalance Recommendation"
_TERMINATE_ACTION = "EC2 Instance-terminate Lifecycle Action"
_TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
_MAX_BODY = 256 * 1024  # SQS's own message size limit
_RECEIVE_ROUNDS = 10  # at most 100 messages per find(); the rest wait for the next one
_SEEN_EVENTS = 4096
_SAID = 4096  # (kind, instance or group) keys logged once; the queue sees every instance of the region
_SPOT_ACTIONS = ("terminate", "stop", "hibernate")  # what EC2 documents; the metadata watcher knows the same
_ACTION_EXCERPT = 40
_EXCERPT = 120  # characters of a message quoted in a log line
_MAX_WAITING = 10_000  # bodies a receiver keeps for the next find(); far more than a discovery interval brings
_PAUSE_WARN_EVERY_S = 60.0  # a receiver that pauses again within this logs at DEBUG


@dataclass(frozen=True)
class Notice:
    """One notice about one instance.

    ``kind`` is ``spot``, ``lifecycle`` or ``rebalance``; ``time`` is when AWS
    sent it (Unix seconds); ``deadline`` is when AWS takes the instance, where
    the event says (spot only: a lifecycle hook's deadline depends on the
    hook's timeout, which the provider looks up). ``group``, ``hook`` and
    ``token`` come with lifecycle actions.
    """

    kind: str
    instance: str
    time: float
    deadline: float | None
    reason: str
    event_id: str = ""
    group: str | None = None
    hook: str | None = None
    token: str | None = None


@dataclass(frozen=True)
class Ignored:
    """A message this provider does not act on: ``kind`` says why, ``detail`` (one short line) shows what."""

    kind: str
    detail: str = ""


def parse_message(body: Any, *, _enveloped: bool = False) -> Notice | Ignored:
    """Turn one SQS message body into a Notice, or an Ignored saying why not. Never raises."""
    if not isinstance(body, str) or len(body) > _MAX_BODY:
        return Ignored("not JSON", _excerpt(body))
    try:
        event = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return Ignored("not JSON", _excerpt(body))
    if (isinstance(event, dict) and event.get("Type") == "Notification" and isinstance(event.get("Message"), str)
            and not _enveloped):
        return parse_message(event["Message"], _enveloped=True)  # an SNS envelope
    if not isinstance(event, dict):
        return Ignored("wrong shape", _excerpt(body))
    if event.get("Event") == "autoscaling:TEST_NOTIFICATION":
        return Ignored("test notification", _excerpt(str(event.get("AutoScalingGroupName", ""))))
    if "detail-type" in event:
        return _from_eventbridge(event)
    if "LifecycleTransition" in event:
        return _lifecycle(event, event.get("Time"), event.get("RequestId"), body)
    return Ignored("wrong shape", _excerpt(body))


def _from_eventbridge(event: dict) -> Notice | Ignored:
    kind = event.get("detail-type")
    detail = event.get("detail")
    if not isinstance(detail, dict):
        return Ignored("wrong shape", _excerpt(f"{kind}: no detail"))
    if kind == _TERMINATE_ACTION:
        return _lifecycle(detail, event.get("time"), event.get("id"), kind)
    if kind not in (_SPOT, _REBALANCE):
        return Ignored("other event", _excerpt(str(kind)))
    when = _parse_time(event.get("time"))
    instance = detail.get("instance-id")
    if when is None or not _is_instance_id(instance):
        return Ignored("wrong shape", _excerpt(f"{kind}: time {event.get('time')!r}, instance {instance!r}"))
    event_id = str(event.get("id") or "")
    if kind == _REBALANCE:
        return Notice("rebalance", instance, when, None, f"rebalance recommendation ({SOURCE})", event_id)
    action = detail.get("instance-action", "terminate")
    if action == "terminate":
        what = "spot interruption notice"
    elif action in _SPOT_ACTIONS:
        what = f"spot interruption notice: {action}"
    else:
        # Still drained: the event's type says EC2 takes the instance in two minutes, whatever the action
        # (one EC2 adds later); draining a host for nothing costs a graceful leave and lapses, missing a
        # real interruption costs the steps since the last commit. Bounded: the body is anyone's text.
        what = f"spot interruption notice: unknown action {_excerpt(action, _ACTION_EXCERPT)}"
    return Notice("spot", instance, when, when + SPOT_WARNING_S, f"{what} ({SOURCE})", event_id)


def _lifecycle(fields: dict, time_text: Any, event_id: Any, what: str) -> Notice | Ignored:
    transition = fields.get("LifecycleTransition", _TERMINATING)
    if transition != _TERMINATING:
        return Ignored("other event", _excerpt(str(transition)))
    when = _parse_time(time_text)
    instance = fields.get("EC2InstanceId")
    group, hook, token = (fields.get(k) for k in ("AutoScalingGroupName", "LifecycleHookName", "LifecycleActionToken"))
    if when is None or not _is_instance_id(instance) or not all(isinstance(v, str) and v for v in (group, hook)):
        return Ignored("wrong shape", _excerpt(f"lifecycle action: {what}"))
    return Notice("lifecycle", instance, when, None, f"terminate lifecycle action ({SOURCE})", str(event_id or ""),
                  group=group, hook=hook, token=token if isinstance(token, str) and token else None)


def _parse_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)  # AWS writes UTC
    return when.timestamp()


def _is_instance_id(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("i-") and len(value) <= 64


def _excerpt(value: Any, limit: int = _EXCERPT) -> str:
    text = value if isinstance(value, str) else repr(value)
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


class NoticeBook:
    """The notices the provider acts on, per instance, until they lapse or the instance leaves the group.

    Pure bookkeeping, no I/O: :meth:`take` files one parsed message and says
    what became of it; :meth:`lapse` drops notices AWS did not follow up;
    :meth:`forget` drops instances that left the group.
    Each first notice is logged once at INFO; garbage once per kind at
    WARNING (later ones at DEBUG); duplicates and messages for other
    instances or groups at DEBUG, once per instance or group.
    """

    def __init__(self, label: str, group: str) -> None:
        self._label = label
        self._group = group
        self._notices: dict[str, dict[str, Notice]] = {}  # instance -> kind -> first notice
        self._seen: OrderedDict[str, None] = OrderedDict()  # recent event ids, for duplicates
        self._said: OrderedDict[tuple[str, str], None] = OrderedDict()  # logged once lately, newest last
        self._heard: dict[tuple[str, str], float] = {}  # (instance, kind) -> when lapse() first saw its notice

    def take(self, parsed: Notice | Ignored, members: Iterable[str]) -> str:
        """File one parsed message and say what became of it.

        Returns ``recorded``, ``duplicate``, ``other instance``, ``other group``
        or, for an :class:`Ignored`, its kind.
        """
        if isinstance(parsed, Ignored):
            self._once(logging.WARNING, ("ignored", parsed.kind), "%s: ignoring a notice queue message (%s): %s",
                       self._label, parsed.kind, parsed.detail)
            return parsed.kind
        if parsed.group is not None and parsed.group != self._group:
            self._once(logging.DEBUG, ("group", parsed.group), "%s: ignoring a lifecycle action of group %r",
                       self._label, parsed.group)
            return "other group"
        if parsed.instance not in set(members):
            self._once(logging.DEBUG, ("instance", parsed.instance),
                       "%s: ignoring a %s notice for %s, not in the group", self._label, parsed.kind, parsed.instance)
            return "other instance"
        kinds = self._notices.setdefault(parsed.instance, {})
        if (parsed.event_id and parsed.event_id in self._seen) or parsed.kind in kinds:
            _log.debug("%s: duplicate %s notice for %s", self._label, parsed.kind, parsed.instance)
            return "duplicate"
        if parsed.event_id:
            self._seen[parsed.event_id] = None
            while len(self._seen) > _SEEN_EVENTS:
                self._seen.popitem(last=False)
        kinds[parsed.kind] = parsed
        return "recorded"

    def lapse(self, now: float, ready: Iterable[str]) -> list[Notice]:
        """Drop the notices that have lapsed at ``now`` (Unix time) and return them.

        A rebalance recommendation lapses ``SOFT_NOTICE_TTL_S`` after it was
        sent. A spot or lifecycle notice lapses ``NOTICE_GRACE_S`` after its
        deadline (after it was sent, when it has none), and only while its
        instance is in ``ready`` (the group state alone would make it ready):
        AWS did not take it after all. A deadline counts at most
        ``MAX_NOTICE_LEAD_S`` ahead, and a message sent later than the first
        lapse() after it was filed (the find() that read it) counts as sent
        then: a garbled time (the year 9999) does not keep an instance off for ever.
        """
        ready = set(ready)
        gone = []
        for instance, kinds in self._notices.items():
            for kind, notice in list(kinds.items()):
                sent = min(notice.time, self._heard.setdefault((instance, kind), now))
                if kind == "rebalance":
                    over = now >= sent + SOFT_NOTICE_TTL_S
                else:
                    base = sent if notice.deadline is None else min(notice.deadline, sent + MAX_NOTICE_LEAD_S)
                    over = instance in ready and now >= base + NOTICE_GRACE_S
                if over:
                    del kinds[kind]
                    del self._heard[(instance, kind)]
                    gone.append(notice)
        return gone

    def forget(self, members: Iterable[str]) -> None:
        """Drop the notices of instances that are no longer in the group."""
        keep = set(members)
        for instance in [i for i in self._notices if i not in keep]:
            del self._notices[instance]
        for key in [k for k in self._heard if k[0] not in keep]:
            del self._heard[key]

    def of(self, instance: str) -> dict[str, Notice]:
        """The notices remembered for ``instance``, by kind."""
        return dict(self._notices.get(instance, {}))

    def instances(self) -> list[str]:
        """Instances with at least one notice."""
        return [i for i, kinds in self._notices.items() if kinds]

    def _once(self, level: int, key: tuple[str, str], message: str, *args: Any) -> None:
        if key in self._said:
            self._said.move_to_end(key)
            _log.debug(message, *args)
            return
        self._said[key] = None
        while len(self._said) > _SAID:  # the longest unheard of may be logged once more some day
            self._said.popitem(last=False)
        _log.log(level, message, *args)


def receive_all(sqs: Any, url: str, handle: Callable[[str], None]) -> int:
    """Read what is waiting in the queue (no long poll), pass each body to ``handle``, delete it.

    Receives up to 10 messages per call while the queue keeps answering full
    batches, at most ``_RECEIVE_ROUNDS`` times, so one find() stays bounded;
    what is left waits for the next one. Each batch is deleted after it has
    been handled, whatever ``handle`` made of it. SDK errors propagate.
    Returns the number of messages handled.
    """
    handled = 0
    for _ in range(_RECEIVE_ROUNDS):
        answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        messages = answer.get("Messages", [])
        for message in messages:
            handle(message.get("Body", ""))
        _delete(sqs, url, messages)
        handled += len(messages)
        if len(messages) < 10:
            break
    return handled


def _delete(sqs: Any, url: str, messages: list[dict]) -> None:
    if not messages:
        return
    entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)]
    result = sqs.delete_message_batch(QueueUrl=url, Entries=entries)
    for failed in result.get("Failed", []):
        _log.debug("notice queue: could not delete a message (%s); it will come back and be a duplicate",
                   failed.get("Code"))


class QueueReceiver:
    """Long-polls the notice queue on one daemon thread and hands what it receives to the provider.

    Each batch is kept for :meth:`take` (the provider files it at its next
    find()), then deleted. When a batch holds a body that ``urgent`` calls
    urgent (a notice for a member of the group), ``wake()`` asks for that
    find() at once, so a notice waits for one receive and one find(), not for
    the discovery interval. At most ``max_waiting`` bodies are kept: once that
    many wait (no find() since: discovery failing, or a flood), the receiver
    calls ``wake()`` and receives nothing more until :meth:`take` makes room,
    so the rest stay in SQS and nothing is deleted unread; a WARNING (at most
    one a minute) says so. SDK errors go to ``trouble`` (the provider logs
    them) and the receive is retried ``retry_s`` later. The constructor does
    no I/O; :meth:`start` starts the thread; :meth:`close` stops it once the
    receive in flight returns (at most ``wait_s`` plus the client's timeout;
    the thread is a daemon, so it never holds up the process's exit) and
    the thread then closes ``sqs``, which is its own.
    """

    def __init__(self, sqs: Any, url: str, *, wake: Callable[[], None], urgent: Callable[[str], bool],
                 trouble: Callable[[Exception], None], wait_s: int = 20, retry_s: float = 5.0,
                 max_waiting: int = _MAX_WAITING) -> None:
        if not 0 <= wait_s <= 20:
            raise ValueError(f"wait_s must be 0-20 (SQS's limit), got {wait_s!r}")
        self._sqs, self._url = sqs, url
        self._wake, self._urgent, self._trouble = wake, urgent, trouble
        self._wait_s, self._retry_s = wait_s, retry_s
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1, got {max_waiting!r}")
        self._max_waiting = max_waiting
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified by take() and close()
        self._waiting: list[str] = []
        self._warned_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="notice-queue", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._room:
            self._room.notify_all()

    def take(self) -> list[str]:
        """The bodies received since the last call, oldest first."""
        with self._room:
            bodies, self._waiting = self._waiting, []
            self._room.notify_all()
        return bodies

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._receive_once()
                except Exception as exc:  # SDK trouble, or a bug: logged by the provider; the queue is read again
                    if self._stop.is_set():
                        return
                    self._trouble(exc)
                    self._stop.wait(self._retry_s)
        finally:
            self._sqs.close()

    def _room_left(self) -> int:
        """How many more bodies may be kept, once at least one may (0: closed meanwhile)."""
        with self._room:
            held = len(self._waiting)
        if held < self._max_waiting:
            return self._max_waiting - held
        now = time.monotonic()
        level = logging.DEBUG
        if self._warned_at is None or now - self._warned_at >= _PAUSE_WARN_EVERY_S:
            level, self._warned_at = logging.WARNING, now
        _log.log(level, "notice queue: %d messages received and not yet filed (no discovery since); receiving "
                 "paused, the rest stay in the queue until discovery takes these", held)
        self._wake()  # a flood, not a failing discovery: the next find() makes room
        with self._room:
            while not self._stop.is_set() and len(self._waiting) >= self._max_waiting:
                self._room.wait()
            return 0 if self._stop.is_set() else self._max_waiting - len(self._waiting)

    def _receive_once(self) -> None:
        room = self._room_left()
        if not room:
            return
        answer = self._sqs.receive_message(QueueUrl=self._url, MaxNumberOfMessages=min(10, room),
                                           WaitTimeSeconds=self._wait_s)
        messages = answer.get("Messages", [])
        if not messages:
            return
        bodies = [m.get("Body", "") for m in messages]
        with self._lock:
            self._waiting.extend(bodies)  # within max_waiting: no more was asked for
        if any(self._urgent(body) for body in bodies):
            self._wake()
        _delete(self._sqs, self._url, messages)
