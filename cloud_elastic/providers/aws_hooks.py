"""AWS lifecycle hooks: the deadline of an instance held in ``Terminating:Wait``,
heartbeats while the job still needs it, and its release once the job is done.

An instance whose termination a lifecycle hook holds waits in
``Terminating:Wait`` until someone calls ``CompleteLifecycleAction`` or the
hook's ``HeartbeatTimeout`` runs out (``RecordLifecycleActionHeartbeat``
restarts that timeout; the hold can never outlast the global timeout,
100 x ``HeartbeatTimeout`` or 48 hours, whichever is smaller). The provider
learns about a hold from the group state (``Terminating:Wait``) or from a
lifecycle-action notice in the queue (which also carries the action token),
whichever comes first.

Deadline: when the hold started (the event's time) + ``HeartbeatTimeout``,
moved on by each heartbeat. A hold first seen in the group state has no known
start (the driver restarted, or discovery failed meanwhile): it may have begun
a whole timeout earlier, so it is heartbeated at once, which makes AWS's
timeout run from now; until a heartbeat is accepted its deadline is the
earliest the hold can end, the moment it was first seen (the global timeout
is counted from that earliest start too). Heartbeats are sent while the job
has not released the instance and less than a third of the timeout remains.
Once released, the action is completed with ``CONTINUE`` exactly
once (by token if known, else by instance id and hook name). Errors in these
calls are logged on one line at WARNING and retried at the next find(); they
never fail discovery.

Which hook: the one the ``lifecycle_hook`` option names; without it, the one a
notice names or the group's only termination hook. A group with several
termination hooks needs the option: the others (another tool's) are left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from cloud_elastic.providers._common import one_line

__all__ = ["Hook", "Hold", "LifecycleHolds", "GLOBAL_TIMEOUT_CAP_S"]

_log = logging.getLogger(__name__)

_TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
#: AWS's global timeout of a lifecycle action: 100 x HeartbeatTimeout, at most 48 hours.
GLOBAL_TIMEOUT_CAP_S = 48 * 3600.0
_HEARTBEAT_WHEN_LEFT = 1 / 3  # of the timeout
_HOOKS_REFRESH_S = 60.0
_WARN_EVERY_S = 60.0


@dataclass(frozen=True)
class Hook:
    """A termination lifecycle hook of the group: its name and ``HeartbeatTimeout``."""

    name: str
    timeout_s: float


@dataclass
class Hold:
    """One instance held in ``Terminating:Wait`` (mutable bookkeeping, owned by LifecycleHolds)."""

    instance: str
    since: float
    hook: str | None = None  # named by a lifecycle-action notice, with its token
    token: str | None = None
    timed_by: str | None = None  # the hook whose timeout gives the deadline
    deadline: float | None = None
    cap: float | None = None
    completed: bool = False
    #: False while the hook's timeout may have started before ``since`` (first seen waiting, with no lifecycle
    #: event and no heartbeat accepted yet): the deadline is then the earliest the hold can end.
    exact: bool = True

    def timed(self, hook: Hook) -> None:
        """Give the hold its deadline from ``hook`` (once its timeout is known)."""
        if self.deadline is None:
            self.timed_by = hook.name
            start = self.since if self.exact else self.since - hook.timeout_s  # the earliest it can have begun
            self.deadline = start + hook.timeout_s
            self.cap = start + min(100 * hook.timeout_s, GLOBAL_TIMEOUT_CAP_S)


class LifecycleHolds:
    """Holds per instance, the hooks of the group, and the two write calls.

    ``autoscaling`` is a boto3 Auto Scaling client; ``client_errors`` the SDK
    exception types that mean "this call failed" (logged, retried later).
    """

    def __init__(self, label: str, group: str, clock: Callable[[], float], *, hook_name: str | None = None) -> None:
        self._label = label
        self._group = group
        self._clock = clock
        self._hook_name = hook_name
        self._hooks: dict[str, Hook] | None = None
        self._hooks_read_at = float("-inf")
        self._holds: dict[str, Hold] = {}
        self._released: set[str] = set()
        self._warned: dict[str, float] = {}

    # -- what the provider learnt this cycle ---------------------------------------------

    def waiting(self, instance: str) -> None:
        """The group state shows ``instance`` in ``Terminating:Wait``."""
        self._holds.setdefault(instance, Hold(instance, since=self._clock(), exact=False))

    def past_wait(self, instance: str) -> None:
        """The group state shows ``instance`` beyond the wait (``Terminating:Proceed``...): nothing left to do."""
        hold = self._holds.get(instance)
        if hold is not None:
            hold.completed = True

    def action(self, instance: str, *, since: float, hook: str, token: str | None) -> None:
        """A lifecycle-action notice for ``instance`` (from the queue): hook, token and start time."""
        hold = self._holds.setdefault(instance, Hold(instance, since=since))
        if hold.deadline is None:
            hold.since, hold.exact = min(hold.since, since), True
        if self._hook_name is not None and hook != self._hook_name:
            return  # another tool's hook: its action is not ours to heartbeat or complete
        hold.hook = hold.hook or hook
        hold.token = hold.token or token

    def in_use(self, instance: str) -> None:
        """The job may use ``instance`` again (it is ready): an earlier release no longer applies."""
        self._released.discard(instance)

    def forget(self, members: Iterable[str]) -> None:
        """Drop holds and releases of instances that left the group."""
        keep = set(members)
        self._holds = {i: h for i, h in self._holds.items() if i in keep}
        self._released &= keep

    def deadline(self, instance: str) -> float | None:
        """When the hook lets ``instance`` go unless heartbeats move it (None if unknown or not held)."""
        hold = self._holds.get(instance)
        return None if hold is None or hold.completed else hold.deadline

    def held(self, instance: str) -> Hold | None:
        """The hold of ``instance``, if any."""
        return self._holds.get(instance)

    # -- the write path ------------------------------------------------------------------

    def release(self, autoscaling: Any, client_errors: tuple[type[BaseException], ...], instance: str) -> None:
        """The job is done with ``instance``: complete its lifecycle action now if it is held, else when it is."""
        self._released.add(instance)
        hold = self._holds.get(instance)
        if hold is not None and not hold.completed:
            self._complete(autoscaling, client_errors, hold)

    def service(self, autoscaling: Any, client_errors: tuple[type[BaseException], ...]) -> None:
        """Once per find(): time new holds, complete released ones, heartbeat the ones about to expire."""
        open_holds = [h for h in self._holds.values() if not h.completed]
        if not open_holds:
            return
        if any(h.deadline is None for h in open_holds):
            self._time_holds(autoscaling, client_errors, open_holds)
        now = self._clock()
        for hold in open_holds:
            if hold.instance in self._released:
                self._complete(autoscaling, client_errors, hold)
            elif hold.deadline is not None:
                self._heartbeat_if_due(autoscaling, client_errors, hold, now)

    def _time_holds(self, autoscaling: Any, client_errors: tuple, holds: list[Hold]) -> None:
        now = self._clock()
        unknown = any(self._ours(h) not in (self._hooks or {}) for h in holds)
        if self._hooks is None or (unknown and now - self._hooks_read_at >= _HOOKS_REFRESH_S):
            self._read_hooks(autoscaling, client_errors, now)
        for hold in holds:
            hook = (self._hooks or {}).get(self._ours(hold) or "")
            if hook is not None:
                hold.timed(hook)

    def _read_hooks(self, autoscaling: Any, client_errors: tuple, now: float) -> None:
        self._hooks_read_at = now
        try:
            answer = autoscaling.describe_lifecycle_hooks(AutoScalingGroupName=self._group)
        except client_errors as exc:
            self._warn("describe", "%s: cannot read the lifecycle hooks (drain deadlines unknown until it works): %s",
                       self._label, one_line(exc))
            return
        self._hooks = {
            h["LifecycleHookName"]: Hook(h["LifecycleHookName"], float(h.get("HeartbeatTimeout") or 3600))
            for h in answer.get("LifecycleHooks", []) if h.get("LifecycleTransition") == _TERMINATING
        }
        _log.debug("%s: termination lifecycle hooks %s", self._label, sorted(self._hooks))

    def _ours(self, hold: Hold) -> str | None:
        """The hook this provider heartbeats and completes for ``hold``, or None (not known yet, or ambiguous).

        The ``lifecycle_hook`` option; else, when the group has several
        termination hooks, none (completing another tool's hook could cut its
        work short: warned); else the hook a notice named, or the only one.
        """
        if self._hook_name is not None:
            return self._hook_name
        hooks = self._hooks
        if hooks is not None and len(hooks) > 1:
            self._warn("several", "%s: the group has several termination hooks (%s); name the one to heartbeat and "
                       "complete with -o lifecycle_hook=NAME", self._label, ", ".join(sorted(hooks)))
            return None
        if hold.hook is not None:
            return hold.hook
        return next(iter(hooks)) if hooks else None

    def _complete(self, autoscaling: Any, client_errors: tuple, hold: Hold) -> None:
        hook = self._ours(hold)
        if hook is None:
            return  # retried once the hook is known
        if not self._lifecycle_call(autoscaling.complete_lifecycle_action, "CompleteLifecycleAction", "complete",
                                    client_errors, hold, hook, LifecycleActionResult="CONTINUE"):
            return
        hold.completed = True
        _log.info("%s: released %s to terminate (lifecycle hook %s completed with CONTINUE)",
                  self._label, hold.instance, hook)

    def _heartbeat_if_due(self, autoscaling: Any, client_errors: tuple, hold: Hold, now: float) -> None:
        hook = (self._hooks or {}).get(self._ours(hold) or "")
        if hook is None or hold.deadline is None or hold.cap is None:
            return
        if hold.deadline - now >= hook.timeout_s * _HEARTBEAT_WHEN_LEFT or hold.deadline >= hold.cap:
            return
        # A hold of unknown start may have begun a whole timeout before it was seen: its deadline stays that moment.
        then = "" if hold.exact else (f"; until then its deadline is when it was first seen waiting, "
                                      f"{now - hold.since:.0f}s ago: the hold may have begun a HeartbeatTimeout before")
        if not self._lifecycle_call(autoscaling.record_lifecycle_action_heartbeat, "RecordLifecycleActionHeartbeat",
                                    "heartbeat", client_errors, hold, hook.name, then=then):
            return
        hold.deadline, hold.exact = min(now + hook.timeout_s, hold.cap), True
        _log.debug("%s: heartbeat for %s; the hook now holds it until %.0f", self._label, hold.instance, hold.deadline)

    def _lifecycle_call(self, call: Callable[..., Any], api: str, key: str, client_errors: tuple, hold: Hold,
                        hook: str, *, then: str = "", **arguments: Any) -> bool:
        """Call the lifecycle action API ``call`` (named ``api``) on ``hook``'s action for ``hold``: True if it was
        accepted. An action already over (completed by someone else, or timed out) marks the hold completed; any
        other client error is warned (once a minute per ``key`` and instance, ``then`` appended) and retried at the
        next discovery."""
        # The token belongs to the hook of the notice that brought it.
        target = {"LifecycleActionToken": hold.token} if hold.token and hold.hook == hook else {
            "InstanceId": hold.instance}
        try:
            call(AutoScalingGroupName=self._group, LifecycleHookName=hook, **arguments, **target)
        except client_errors as exc:
            if _already_over(exc):
                _log.info("%s: lifecycle action of %s is already over (%s)", self._label, hold.instance, one_line(exc))
                hold.completed = True
            else:
                self._warn(f"{key} {hold.instance}", "%s: %s for %s failed (retried at the next discovery): %s%s",
                           self._label, api, hold.instance, one_line(exc), then)
            return False
        return True

    def _warn(self, key: str, message: str, *args: Any) -> None:
        # At most one WARNING a minute per kind of trouble and instance, so a long outage does not flood the log.
        now = self._clock()
        quiet = now - self._warned.get(key, float("-inf")) < _WARN_EVERY_S
        if not quiet:
            self._warned[key] = now
        _log.log(logging.DEBUG if quiet else logging.WARNING, message, *args)


def _already_over(exc: BaseException) -> bool:
    # AWS answers ValidationError "No active Lifecycle Action found ..." once the action was completed or timed out.
    error = (getattr(exc, "response", None) or {}).get("Error", {})
    return error.get("Code") == "ValidationError" and "No active Lifecycle Action" in str(error.get("Message", ""))
