"""Spares (``--spares N``): workers started beyond the job's size that wait outside the rounds.

A spare is an ordinary newcomer that the round has no room for. It is launched,
imports, runs its device self-test, connects and comes to rendezvous like any
worker, and then waits there (its long-poll held by the driver) until a round
takes it. It is not counted in ``-np``. The rules, each a pure function here
(tested on scripted timelines in ``tests/unit/test_spares.py``):

* **Launches** (:func:`launch_room`): the job keeps up to ``--max-np`` plus
  :func:`spare_slots` staying workers. With ``--whole-hosts`` a spare is a whole
  host: ``--spares N`` is N hosts' slots. Slots are taken in the job's usual
  order; with several host sources the preferred ones first, and a fallback
  source gives a spare only within what its own rule wants (docs/multi-source.md).
  A spare that is taken into a round leaves its place to the next launch, so
  spares are refilled from discovery as usual.
* **Room** (:func:`has_room`): a newcomer may join the running round only while
  it has fewer than ``--max-np`` members staying (under ``--whole-hosts``, room
  for a whole host). Only then does its arrival ask the round for an update; a
  spare asks for none, so a full round never stops for it.
* **When a spare becomes a member**: whenever a round forms with room, which
  is exactly when a member is lost or leaves: the recovery round after a
  failure takes a spare in place of each lost worker, and the round that forms
  when a leaving host's members leave at a commit takes spares in their
  places (no rollback: the spare syncs from rank 0 like any newcomer). A round
  that runs below ``--max-np`` (a member returned early, ``--max-np`` above the
  slots there were) has room too: a spare then joins at the next commit, as
  any newcomer would.
* **Which spare goes first** (:func:`admit`, :func:`spare_key`): survivors of
  the last round always stay; of the newcomers, the preferred source first
  (the multi-source choice rule: not a fallback, higher priority, lower price),
  then the one that has waited longest at rendezvous (it has been healthy
  longest), then the older host, the lower slot, the earlier launch; a spare on
  a doubtful host (a soft notice, or missing from discovery within its grace)
  goes after every other. Under
  ``--whole-hosts`` whole hosts are taken, each ordered by its first worker.
  This picks *who* joins; ranks then follow the usual order (survivors first,
  older hosts first; see :mod:`.plan`).
* **The last holders of the state** (every member's host leaving: draining,
  see :mod:`.leaving`, or missing and kept, see :mod:`.discovery_edge`) take no place: the round has room for a spare next to them,
  the spare receives the state from them in that round, and they leave at its
  first commit (:func:`admit`'s ``leaving``).
* **A spare's own failure** is any non-member's: its slot (its host, under
  ``--whole-hosts``) is blacklisted for the usual cooldown, no round is
  aborted, and the launch rule starts a replacement on the next free slot.
* **What shows** (:func:`spares_now`): the waiting workers beyond the running
  round's room are the job's spares; a ``spares`` event and a log line each
  time their number changes, ``status`` rows marked ``spare``, and the
  ``cloud_elastic_spares`` gauge. A spare on a doubtful host is not counted
  ready, nor as a place of ``--spares`` for launches: a replacement starts on a
  healthy slot. Once it is ready, the spare of a host with a soft notice leaves;
  one whose host is only missing from discovery stays within the grace, as a
  member's workers do (``formation``): if the host comes back, the spare that
  arrived last is the one beyond ``--spares`` and leaves.
"""

from __future__ import annotations

from typing import Callable, Collection, Hashable, Sequence, TypeVar

from cloud_elastic.driver.job.hosts import HostManager
from cloud_elastic.driver.job.plan import Candidate, whole_host_groups
from cloud_elastic.providers.sources import SourceSpec

__all__ = ["doubtful", "spare_slots", "launch_room", "has_room", "source_rank", "spare_key", "admit", "spares_now"]

T = TypeVar("T")


def doubtful(hosts: HostManager, host: str) -> bool:
    """Whether ``host`` has a soft notice (its own or the provider's) or is missing from discovery: its workers
    stay, but no new worker is placed there (:meth:`~.hosts.HostManager.available_slots`), nor counted a spare."""
    return host in hosts.soft or host in hosts.provider_soft or host in hosts.missing


def spare_slots(spares: int, host_slots: int) -> int:
    """Workers kept as spares: ``spares``, or ``spares`` whole hosts' slots under ``--whole-hosts``."""
    return spares * host_slots if host_slots else spares


def launch_room(active: int, *, max_np: int, spares: int, host_slots: int) -> int:
    """How many more staying workers the job may launch, ``active`` staying already (may be negative)."""
    return max_np + spare_slots(spares, host_slots) - active


def has_room(staying: int, *, max_np: int, host_slots: int) -> bool:
    """Whether a running round with ``staying`` members (not leaving) has room for a newcomer: at least one
    slot below ``max_np``, or a whole host's under ``--whole-hosts``."""
    return max_np - staying >= max(host_slots, 1)


def source_rank(spec: SourceSpec | None, price: float | None) -> tuple[Hashable, ...]:
    """A host's place in the multi-source choice rule (:func:`~.sourcing.choose`): not a fallback, higher
    priority, a known and lower price first."""
    if spec is None:
        return (False, 0, price is None, price if price is not None else 0.0)
    return (spec.fallback, -spec.priority, price is None, price if price is not None else 0.0)


def spare_key(source_rank: tuple[Hashable, ...], arrival: int, host_order: int, slot: int,
              seq: int, doubtful: bool = False) -> tuple[Hashable, ...]:
    """Which waiting newcomer goes first (lower first): not on a doubtful host, preferred source, longest
    waiting, older host, slot, launch order. ``source_rank`` is ``()`` for a job with one source."""
    return (doubtful, *source_rank, arrival, host_order, slot, seq)


def admit(waiting: Sequence[Candidate], *, max_np: int, host_slots: int,
          key: Callable[[Candidate], Hashable], leaving: Collection[str] = ()) -> list[Candidate]:
    """Who of ``waiting`` may be in the next round, in ``waiting``'s order, when more wait than ``max_np``.

    Survivors of earlier rounds (and any holder of the state) always stay: they are
    at most a round's size. The rest of the room goes to newcomers by ``key``
    (lowest first), whole hosts only under ``--whole-hosts``. ``leaving`` are kept
    workers that are the last holders of the state on leaving hosts: they take no
    room (the round is that much larger than ``max_np`` until they leave). With no
    more waiting than that, ``waiting`` is returned as it is:
    :func:`~.plan.plan_round` decides as ever.
    """
    if len(waiting) <= max_np + len(leaving):
        return list(waiting)
    kept = {c.worker_id for c in waiting if c.prev_rank is not None or c.holds_state}
    newcomers = sorted((c for c in waiting if c.worker_id not in kept), key=key)
    room = max_np - len(kept.difference(leaving))
    chosen: set[str] = set()
    if host_slots:
        # Hosts whose every slot waits, in the order of their first worker by key.
        for host in whole_host_groups(newcomers, host_slots, lambda c: (c.host, c.slot)):
            if room < host_slots:
                break
            chosen.update(c.worker_id for c in host)
            room -= host_slots
    else:
        chosen.update(c.worker_id for c in newcomers[:max(room, 0)])
    return [c for c in waiting if c.worker_id in kept or c.worker_id in chosen]


def spares_now(newcomers: Sequence[T], *, staying: int, max_np: int, host_slots: int,
               key: Callable[[T], Hashable], where: Callable[[T], tuple[str, int]],
               doubtful: Callable[[T], bool] = lambda _: False) -> list[T]:
    """The ready spares among ``newcomers`` (waiting, in no round) while a round with ``staying`` members runs:
    those beyond its room, last by ``key`` (under ``--whole-hosts``, whole hosts; a host not complete yet is
    still starting, not a spare), except those on a ``doubtful`` host."""
    room = max(max_np - staying, 0)
    ordered = sorted(newcomers, key=key)
    if not host_slots:
        spares = ordered[room:]
    else:
        spares = []
        for host in whole_host_groups(ordered, host_slots, where):
            if room >= host_slots:
                room -= host_slots
            else:
                spares += host
    return [w for w in spares if not doubtful(w)]
