"""One host group's capacity as ``--manage-capacity`` sets it: the state machine of each source of a
:class:`~.multi.MultiSourceDiscovery`, whose calls (on its threads) it decides.

:class:`GroupCapacity` holds all the job's edge knows of one group: the job's value still to be sent, who set the
group's value (nobody yet, the job, a crashed predecessor taken over, an operator), what the cloud last took and
when, the group's limits and hosts as last read, and the clocks of its rules. Each event is one method that moves
the state and says what to do (:meth:`~GroupCapacity.decide`: the value to send now, or None). Its rules, one per
defect fixed (``tests/unit/test_fallback_table.py``):

* A value is held within MinSize..MaxSize (one WARNING at MaxSize) and sent only where it may change the group: not
  while the DesiredCapacity read equals it, nor, for a raise, is above it (an operator's value; not the job's own
  raise it lowers); asked again, at MaxSize, only once the limits read change; the desired capacity unknown, at most
  every :data:`REASK_UNKNOWN_S` and while it shows no more hosts than when last asked (or lowered by its scaling).
* A raise sent (whatever its answer, but one its provider proves the cloud refused, no attempt of it landed:
  ``HostDiscovery.capacity_refused``) or taken over is the job's (:attr:`~GroupCapacity.owned`): only then does a 0
  go. A raise skipped on a group set higher while the job had set nothing, or had set it back to 0, makes it an
  operator's: :meth:`~GroupCapacity.capacity_of` no longer says the job's earlier 0 (none is sent at the end); so
  does a raise sent on such a group and proven refused (the group is again whoever's it was before the raise). A
  group the job raised stays the job's, though its DesiredCapacity reads higher later (an operator's raise, or its
  own scaling): it is set back to 0 at the job's end (a stale read must not keep a paid group raised).
* :meth:`~GroupCapacity.room`: its MaxSize; what it has, where the job may not change it or its raise was refused
  :data:`REFUSALS_TO_SPILL` times in a row; what it shows, after fewer hosts than the job set for :data:`SHORT_FOR_S`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["GroupCapacity", "Room", "REASK_UNKNOWN_S", "REFUSALS_TO_SPILL", "SHORT_FOR_S", "JOB", "OPERATOR"]

log = logging.getLogger(__name__)

#: A value asked again reaches a group whose desired capacity the provider cannot read at most this often.
REASK_UNKNOWN_S = 300.0
#: A raise refused this many calls in a row (not AccessDenied) counts as one its group cannot give, until one succeeds.
REFUSALS_TO_SPILL = 3
#: Fewer hosts than the job set for this long: the group cannot give the rest (AWS took the value, then
#: InsufficientInstanceCapacity). A GPU instance shows within 1-3 minutes: less would pay for hosts still booting.
SHORT_FOR_S = 180.0
#: Who set the group's value (:attr:`GroupCapacity.who`; "": nobody yet, or a crashed predecessor's :meth:`adopt`).
JOB, OPERATOR = "job", "operator"


@dataclass(frozen=True)
class Room:
    """What a group can give the job now (:meth:`GroupCapacity.room`): ``most``, the most hosts it is asked (its
    MaxSize; None: unknown); ``gives``, where it cannot give all it is asked, the hosts it counts for when the next
    group's share is reckoned (None: all; its own ask is not lowered for it); ``managed``: False once the job may
    not change it (AccessDenied): it is asked nothing more; ``owned``: whether the job set it (None: not known);
    ``holds``: the most the group may hold of what the job, or a crashed predecessor taken over, set: a call under
    way, made or timed out counts, one proven refused does not; a 0 only once the cloud has taken it (0: nothing
    of the job's, or its 0 taken)."""

    most: int | None = None
    gives: int | None = None
    managed: bool = True
    owned: bool | None = None
    holds: int = 0


class GroupCapacity:
    """The capacity state of one host group (see module docstring); its provider makes one call at a time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.asked: int | None = None  # the job's value still to be sent
        self.managed = True  # False once the job may not change it (AccessDenied): asked nothing more
        self.who = ""  # who set its value: JOB, OPERATOR, or "" (nobody yet; a predecessor where adopted)
        self.value: int | None = None  # what the cloud took from this job (MaxSize where it held the value there)
        self.sending: int | None = None  # the value a call under way sets (another thread may read it)
        self.adopted: int | None = None  # what a crashed predecessor set (:meth:`adopt`)
        self.made: int | None = None  # the most the job's calls may have set it to (one timed out may have landed)
        self.refusals = 0  # calls refused in a row since the last that succeeded
        self.before: tuple[str, int | None] = ("", None)  # (who, made) before the call under way (a proven refusal)
        self.limits: tuple | None = None  # (MinSize, MaxSize[, DesiredCapacity]) as the last good find() read them
        self.shown = 0  # its hosts as the last good find() showed them
        self.short_since: float | None = None  # since when it shows fewer hosts than the job set
        self.above_max_warned = False
        # The last value the cloud took, when, the (MinSize, MaxSize) read then, the hosts shown then or at a drop.
        self.took: tuple[int | None, float, tuple | None, int] = (None, 0.0, None, 0)

    @property
    def owned(self) -> bool:
        """Whether the job set the group: a raise sent or taken over, not one held back or skipped."""
        return self.who == JOB or (self.who == "" and bool(self.adopted))

    def ask(self, hosts: int) -> None:
        if self.managed:
            self.asked = hosts

    def adopt(self, hosts: int) -> None:
        self.adopted = hosts

    @property
    def own(self) -> int | None:
        """The job's value on the group: the one the cloud last took from it, else a crashed predecessor's taken
        over (its own 0 taken replaces the predecessor's value); None: neither."""
        return self.value if self.value is not None else self.adopted

    def seen(self, now: float, shown: int, limits: tuple | None) -> None:
        """A find() showed ``shown`` hosts of it and read ``limits``."""
        if shown < self.shown:  # lowered by its own scaling: a value asked again may raise it back
            self.took = (*self.took[:3], shown)
        self.shown, self.limits = shown, limits
        self.short_since = (self.short_since if self.short_since is not None else now) if (self.own or 0) > shown \
            else None  # a taken-over raise is the job's too

    def decide(self, now: float, limits: tuple | None) -> int | None:
        """The value to send now for the job's (the group's ``limits`` read just before), or None: nothing (the
        job's value is then done with, as where it would not change the group)."""
        asked = self.asked
        if asked is None or not self.managed:
            return None
        hosts = self._within(asked, limits)
        if self._changes(asked, hosts, limits, now):
            return hosts
        self.asked = None
        return None

    def started(self, hosts: int) -> None:
        """A call setting ``hosts`` starts: made unless proven refused (it may land though it times out); a raise
        makes the group the job's, an operator's before included (it replaces the operator's value)."""
        self.sending, self.before = hosts, (self.who, self.made)
        self.made = max(self.made or 0, hosts)  # one that times out may land
        if hosts > 0:
            self.who = JOB

    def taken(self, asked: int, hosts: int, now: float, limits: tuple | None) -> None:
        """The cloud took ``hosts``: the job's value ``asked`` held within ``limits``."""
        self.value = min(asked, hosts)  # held at MaxSize: that is what was set (held at MinSize: as asked)
        # A 0 held at MinSize is not a raise of the job's: the group left the job (its MinSize hosts are the group's).
        self.asked, self.who, self.refusals, self.made = None, JOB, 0, hosts if asked else 0
        self.took = (hosts, now, limits and tuple(limits[:2]), self.shown)

    def refused(self, *, proven: bool = False) -> None:
        """A call failed; ``proven``: its provider proves the cloud refused it and no attempt of it landed, so it is
        not the job's (its owner before it is again); else (a retry, a timeout, an outcome unknown) it may have
        landed and stays the job's."""
        self.refusals += 1
        if proven:
            self.who, self.made = self.before

    def denied(self, *, proven: bool = False) -> None:
        """AccessDenied: no other call is made; ``proven`` as for :meth:`refused`."""
        self.managed, self.asked = False, None
        if proven:
            self.who, self.made = self.before

    def capacity_of(self) -> int | None:
        """The value the job last had set (a call under way may still set it); None: none, or an operator's value
        replaced it (the job's own 0 before it included: no 0 of the job's is the group's now)."""
        if self.sending is not None:
            return max(self.sending, self.value or 0)
        if self.who == OPERATOR:
            return None
        return self.own

    def room(self, now: float) -> Room:
        """What the group can give the job now (``MultiSourceDiscovery.can_give``)."""
        limits = self.limits
        has = limits[2] if limits is not None and len(limits) > 2 else self.shown
        counts = [has] if not self.managed or self.refusals >= REFUSALS_TO_SPILL else []
        if self.short_since is not None and now - self.short_since >= SHORT_FOR_S:
            counts.append(self.shown)
        holds = max(self.capacity_of() or 0, self.made or 0) if self.owned else 0
        return Room(None if limits is None else limits[1], min(counts, default=None), self.managed, self.owned, holds)

    def _changes(self, asked: int, hosts: int, limits: tuple | None, now: float) -> bool:
        desired = limits[2] if limits is not None and len(limits) > 2 else None
        # Nothing to change, or a group raised beyond it by someone else (the job lowers its own raise itself).
        skip = asked > 0 and desired is not None and (desired == hosts or desired > hosts and desired != self.value)
        if (skip or asked > 0 and desired) and not (self.own or self.made):
            # Not the job's (a call of its own that timed out may have set it): kept; a raise sent replaces it
            # (started), one proven refused gives it back (refused: the job's end leaves it, though the job had
            # set the group to 0 before the operator raised it).
            self.who = OPERATOR
        if skip:
            if desired == hosts and self.adopted and self.value is None:
                self.value = min(asked, hosts)  # a group taken over at the job's value: its own (SHORT_FOR_S)
            return False
        took, took_at, took_limits, took_shown = self.took
        if asked == 0 and not self.owned:
            return False  # the job's value is not the group's (held back, skipped): an operator's, left as it is
        if hosts != took or asked == 0 or desired is not None:
            return True
        if hosts < asked:  # MaxSize holds it: again only once the limits read have changed
            return (limits and tuple(limits[:2])) != took_limits
        return now - took_at >= REASK_UNKNOWN_S and self.shown <= took_shown

    def _within(self, hosts: int, limits: tuple | None) -> int:
        """``hosts`` held within the group's MinSize..MaxSize (the cloud refuses a value outside them)."""
        if limits is None:
            return hosts
        low, high = limits[:2]
        if hosts > high:
            if not self.above_max_warned:
                self.above_max_warned = True
                log.warning("--manage-capacity: the job wants %d host(s) of host source %r, but its group's maximum "
                            "size is %d: it is set to %d (raise the group's maximum to give the job more)", hosts,
                            self.name, high, high)
            return high
        self.above_max_warned = False
        return max(hosts, low)
