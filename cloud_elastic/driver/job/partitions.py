"""A round that keeps failing to form (worker hosts that cannot reach each other, say): ended or cut smaller.

When two worker hosts cannot reach each other but both still reach the driver,
no rule that watches a single worker fires: every member keeps heartbeating,
waits in the same formation (or collective), and comes back to rendezvous with
reason ``failure`` once the formation deadline (or the no-progress abort) gives
the round up. Nobody died, so nothing is blacklisted, and the driver would form
the very same round again, forever. The same holds on one host, for a group
that cannot form there at all (a ``--network-interface`` the host does not
have): its members come back at once, dozens of rounds a second.

:class:`Partitions` watches for exactly that signature, judged once per round
when the next one is about to form: the round, on any number of hosts, was
aborted, **every** member of it is back at rendezvous with reason ``failure``
(none died or was given up), and none of them committed in it. Such rounds in
a row, with the same slots, are *failed formations*. A commit, a member lost,
or a different set of slots starts the count over.

**Evidence.** A member whose round's group did not form by the deadline says
which addresses it was still trying to connect to, its SYN unanswered
(``RendezvousRequest.unreachable``, see ``worker.rounds.peers.Peers.unreached``);
every worker gives its own host's addresses at each rendezvous
(``RendezvousRequest.addresses``), and the round's members who gave one of them
name its host, as does a host named by an IP address (:func:`address_owners`:
no name is resolved here, and the assignments need not list the round's hosts).
An older worker gives no addresses: it names the hosts of its round it could not
reach (its assignment lists them, ``formation.RoundFormation.hosts``, in a round
of at most :data:`OLDER_HOSTS_LIMIT` hosts), and its own host is named by the
others only when the host is an IP address. Each such report is an edge between
two hosts.

**The rule.**

* After :data:`EXCLUDE_AFTER` failed formations in a row with evidence, the
  hosts on one side are excluded: the side of the failed round's rank 0 (it
  holds the state) is kept, and of the others the hosts with the most edges are
  taken out first (ties: the host seen last goes) until no edge is left
  (:func:`hosts_to_exclude`). Their slots are blacklisted for a cooldown, as a
  failed host's are, and their waiting workers are sent away; the round forms
  without them, provided at least ``--min-np`` workers remain.
* Failed formations in a row that could not be cut that way (no evidence, or
  too few workers would remain) end the job once there have been at least
  :data:`FAILED_FORMATIONS_LIMIT` of them and they have lasted the elastic
  timeout (``--elastic-timeout``, 600 s by default), with one line naming the
  hosts involved and what to check (on one host: not the network between
  hosts, but what each member logged of its formation). Until then a
  partition that heals (a rule rolled back, a link back up) lets the next
  round form and train on: the trained state lives only in the workers, so the
  job waits as long as it waits for workers below ``--min-np``.

So a partition costs at most the elastic timeout (or :data:`FAILED_FORMATIONS_LIMIT`
formation deadlines, 60 s each by default, if longer) before the job either
trains at a smaller size or stops; it never loops for good.

**Back-off.** From the second failed formation in a row, :meth:`Partitions.holding`
is True for :func:`backoff_s` (0.2 s, doubling, at most :data:`BACKOFF_CAP_S`)
and the round formation (``formation.py``) forms no round meanwhile: a group
that fails at once (a mistyped ``--network-interface``) re-formed thousands of
rounds a second. The first failed formation is retried at once, so one
transient failure costs no wait.
"""

from __future__ import annotations

import ipaddress
import logging
from collections import Counter
from typing import Callable, Iterable

from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

__all__ = ["Partitions", "hosts_to_exclude", "address_owners", "named_hosts", "round_hosts", "unreached_by",
           "backoff_s", "EXCLUDE_AFTER", "FAILED_FORMATIONS_LIMIT", "BACKOFF_CAP_S", "OLDER_HOSTS_LIMIT"]

log = logging.getLogger(__name__)

S = WorkerState

#: Failed formations in a row, with members naming the peers they could not reach, before a side is excluded.
EXCLUDE_AFTER = 2
#: Failed formations in a row (same slots, no commit between them) after which the job ends.
FAILED_FORMATIONS_LIMIT = 3
#: The longest wait before a round forms again after failed formations in a row.
BACKOFF_CAP_S = 10.0
#: The most hosts of a round an older worker's assignment lists (:func:`round_hosts`): hosts x older workers names
#: to encode and sign (a round of 8,192 one-slot hosts took 3.9 s of driver CPU when every assignment listed them).
OLDER_HOSTS_LIMIT = 256


def backoff_s(streak: int) -> float:
    """How long the next round waits after ``streak`` failed formations in a row: none after the first (a
    transient failure recovers at once), then 0.2 s, doubling up to :data:`BACKOFF_CAP_S`. Pure."""
    return 0.0 if streak <= 1 else min(BACKOFF_CAP_S, 0.2 * 2 ** min(streak - 2, 16))


def address_owners(workers: Iterable[WorkerRecord]) -> dict[str, set[str]]:
    """Each address ``workers`` gave as their own host's at rendezvous -> the hosts that gave it, and each host
    named by an IP address -> itself (whatever its workers gave: an older worker gives none). Pure, O(workers)."""
    owners: dict[str, set[str]] = {}
    for w in workers:
        for address in (w.addresses or ()) + _literal(w.slot.host):
            owners.setdefault(address, set()).add(w.slot.host)
    return owners


def _literal(host: str) -> tuple[str, ...]:
    """``host`` in the canonical text of its IP address when it is one (as discovery names most hosts), else ()."""
    try:
        return (str(ipaddress.ip_address(host)),)
    except ValueError:
        return ()


def named_hosts(addresses: Iterable[str], owners: dict[str, set[str]], own: str) -> list[str]:
    """The hosts behind ``addresses`` by ``owners`` (:func:`address_owners`), ``own`` left out, each once, in the
    addresses' order; an address nobody gave (not a member's: another thread's connection) names none. Pure."""
    return list(dict.fromkeys(h for a in addresses for h in sorted(owners.get(a, ())) if h != own))


def round_hosts(members: Iterable[WorkerRecord]) -> tuple[str, ...]:
    """The hosts of a round's ``members``, each once, in their order: what an older worker's assignment lists
    (``protocol.Assignment.hosts``), the names it gives its evidence in (:func:`unreached_by`); none past
    :data:`OLDER_HOSTS_LIMIT`. Pure."""
    hosts = tuple(dict.fromkeys(w.slot.host for w in members))
    return hosts if len(hosts) <= OLDER_HOSTS_LIMIT else ()


def unreached_by(w: WorkerRecord, owners: dict[str, set[str]], hosts: set[str]) -> list[str]:
    """The hosts ``w`` said at its last rendezvous it could not reach: addresses named by ``owners``, and from an
    older worker (it gave no addresses of its own) the host names it was given, those of ``hosts`` only. Pure."""
    named = named_hosts(w.unreachable, owners, w.slot.host)
    if w.addresses is None:
        return list(dict.fromkeys([h for h in w.unreachable if h in hosts and h != w.slot.host] + named))
    return named


def hosts_to_exclude(edges: Iterable[tuple[str, str]], keep: str, order: Callable[[str], int]) -> list[str]:
    """The hosts to take out so that no two remaining hosts report each other unreachable, never ``keep``.

    Greedy: the host with the most unreachable peers goes first; on a tie, the one latest in ``order``
    (the newest host: older hosts keep their ranks). Pure.
    """
    left = {frozenset(e) for e in edges if e[0] != e[1]}
    out: list[str] = []
    while left:
        degree = Counter(h for e in left for h in e if h != keep)
        host = max(degree, key=lambda h: (degree[h], order(h), h))
        out.append(host)
        left = {e for e in left if host not in e}
    return out


class Partitions:
    """Failed formations of one job, and what ends them (see module docstring)."""

    def __init__(self, job: JobView, send_away: Callable[[WorkerRecord, str], None]) -> None:
        self._job = job
        self._send_away = send_away
        self._formed: tuple[int, frozenset[Slot], int] | None = None  # round, its slots, its members' commits
        self._judged = 0  # the last round judged
        #: Failed formations in a row, and the slots they had.
        self.streak = 0
        self._since = 0.0  # when the first failed formation of the streak was judged
        self._slots: frozenset[Slot] = frozenset()
        self._hold_until = 0.0  # no round forms before then (see backoff_s)

    def formed(self, round_: int, members: list[WorkerRecord]) -> None:
        """Round ``round_`` formed with ``members``."""
        self._formed = (round_, frozenset(w.slot for w in members), sum(w.commits for w in members))

    def check(self, waiting: list[WorkerRecord], now: float) -> bool:
        """Before a round forms from ``waiting``: judge the last round once. False when the job ended or hosts
        were excluded (the waiting workers changed: the caller looks again)."""
        job = self._job
        if self._formed is None or self._formed[0] != job.round or self._judged == job.round:
            return True
        self._judged = job.round
        round_, slots, commits = self._formed
        back = [w for w in waiting if w.round == round_]
        hosts = {w.slot.host for w in back}
        failed = (job.abort_round >= round_ and len(back) == len(slots)
                  and all(w.rdzv_reason == "failure" for w in back) and sum(w.commits for w in back) <= commits)
        if not failed:
            self.streak = 0
            return True
        self.streak = self.streak + 1 if slots == self._slots else 1
        if self.streak == 1:
            self._since = now
        self._slots = slots
        self._hold_until = now + backoff_s(self.streak)
        owners = address_owners(back)
        edges = {(w.slot.host, peer) for w in back for peer in unreached_by(w, owners, hosts)}
        if edges and self.streak >= EXCLUDE_AFTER and self._exclude(back, waiting, edges, now):
            return False
        # A partition may heal (a rule rolled back, a switch back up): the state lives only in the workers, so
        # the job gives it as long as it gives a job below --min-np to recover.
        if self.streak >= FAILED_FORMATIONS_LIMIT and now - self._since >= job.policy.elastic_timeout_s:
            older = sorted({w.slot.host for w in back if w.addresses is None}, key=job.hosts.order_of)
            self._stop(sorted(hosts, key=job.hosts.order_of), edges, now - self._since, older)
            return False
        return True

    def unreached(self, w: WorkerRecord) -> list[str]:
        """The hosts ``w`` said at its last rendezvous it could not reach, named by every live worker's addresses
        (for its log line: O(workers), once a failed round)."""
        alive = self._job.alive()
        return unreached_by(w, address_owners(alive), {a.slot.host for a in alive})

    def holding(self, now: float) -> bool:
        """The next round must not form yet: failed formations in a row back it off (see :func:`backoff_s`)."""
        return self.streak > 0 and now < self._hold_until

    def _exclude(self, back: list[WorkerRecord], waiting: list[WorkerRecord], edges: set[tuple[str, str]],
                 now: float) -> bool:
        job = self._job
        rank0 = next((w for w in back if w.rank == 0), None)
        keep = rank0.slot.host if rank0 is not None else min(edges)[0]
        gone = set(hosts_to_exclude(edges, keep, job.hosts.order_of))
        if sum(1 for w in waiting if w.slot.host not in gone) < job.policy.min_np:
            return False
        pairs = ", ".join(f"{a} -> {b}" for a, b in sorted(edges))
        why = (f"partitioned: host(s) {', '.join(sorted(gone))} could not reach host {keep}'s side in {self.streak} "
               f"formation(s) in a row ({pairs}); check the firewall or security group between worker hosts")
        log.warning("job %s: %s; excluded, their slots blacklisted; the round forms without them", job.job_id, why)
        # Every slot of the host, as for a host that could not be reached: the network is the host's, not a slot's.
        slots = {Slot(h, i) for h in gone for i in range(job.hosts.ready.get(h, 0))}
        for slot in slots | {w.slot for w in waiting if w.slot.host in gone}:
            if not job.hosts.blacklist.blocked(slot, now):
                job.hosts.blacklist.record_failure(slot, now)
        for w in waiting:
            if w.slot.host in gone and w.state is S.WAITING:
                self._send_away(w, why)
        self.streak = 0
        return True

    def _stop(self, hosts: list[str], edges: set[tuple[str, str]], lasted_s: float, older: list[str]) -> None:
        job = self._job
        named = f"; members reported {', '.join(f'{a} cannot reach {b}' for a, b in sorted(edges))}" if edges else ""
        if not edges and older:  # a newer member's report of an older worker's host names no host (see above)
            named = (f"; no member's report named a host, and the workers on {', '.join(older)} run an older "
                     "cloud-elastic, which gives no addresses to name their hosts by (upgrade them)")
        short = (f", and excluding a side would leave fewer than --min-np {job.policy.min_np}" if edges else "")
        if len(hosts) == 1:
            # No network between hosts is involved: the group cannot form on this host at all.
            where, cause = (f"host {hosts[0]} alone", ": the process group cannot form on that host; each member "
                            "logged why ('could not form the process group of round N: ...', above): check "
                            "--network-interface (an interface the host has) and the backend the workers use")
        else:
            where, cause = (f"hosts {', '.join(hosts)}", f"{named}{short}: the worker hosts likely cannot reach each "
                            "other; check the firewall or security group between worker hosts (the ports of the "
                            "process group)")
        job.end(False, f"round formation failed {self.streak} times in a row over {lasted_s:.0f}s (--elastic-timeout "
                f"{job.policy.elastic_timeout_s:g}s) with the same members on {where} and no commit between them, "
                f"while every member still reached the driver{cause}", 1)
