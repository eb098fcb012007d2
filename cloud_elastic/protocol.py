"""The control-plane messages both sides speak, as typed values.

:mod:`cloud_elastic.control` frames, signs and verifies a message; this module
says what is inside one. Each type converts to the JSON object sent on the
wire (``to_wire()``) and back (``from_wire()``), and ``from_wire`` rejects a
malformed object with :class:`~cloud_elastic.errors.ControlPlaneError`
(one line, naming the field) instead of failing later with a ``KeyError``.

The driver builds replies (:class:`Assignment`, :class:`ExitOrder`,
:class:`WaitReply`, :class:`PollReply`) and parses requests
(:class:`RendezvousRequest`, :class:`PollRequest`); the worker does the
opposite. Neither side imports the other's modules for these.

Topology numbers (:class:`RankInfo`), as this project defines them:

* ``rank``/``size``: position in the round and the number of workers in it;
  survivors keep their relative order, so rank 0 is the oldest worker.
* ``local_rank``: the index of the worker's slot on its host, i.e. its GPU.
  A worker keeps its slot for life, so its ``local_rank`` never changes
  between rounds, and no two live workers of a host share one
  (``torch.cuda.set_device(hvd.local_rank())`` stays right after failures).
  After a failure a host's local ranks may have a gap (slot 0 empty until its
  replacement joins).
* ``local_size``: one more than the highest ``local_rank`` in use on the host
  in this round, so ``0 <= local_rank < local_size`` always holds; it equals
  the number of the host's workers whenever its slots are filled from 0 up
  without gaps (always, outside a failure or a shrink).
* ``cross_rank``/``cross_size``: among the hosts that have a worker with this
  ``local_rank`` (hosts ordered by their first worker's rank), this host's
  position and their number (Horovod's cross communicator).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol_reports import (  # there: this module is at its size bound
    MAX_ADDRESSES, StacksReport, evidence_fields, facts_field, fingerprint_field, fingerprint_wire)

__all__ = [
    "RankInfo", "Assignment", "ExitOrder", "WaitReply", "RendezvousReply", "PollReply", "NextRound", "NextRoundReport",
    "FlightEntry", "RendezvousRequest", "PollRequest", "LinkReport", "ProbeOrder", "RENDEZVOUS_REASONS",
    "parse_rendezvous_reply", "ReRegister", "AdoptRequest", "CompletedReport", "CompletionReply",
    "COMPLETION_DECISIONS", "StacksReport",
]

#: Why a worker comes to rendezvous: its first round, a graceful change, or a failed collective.
RENDEZVOUS_REASONS = ("start", "update", "failure")


def _int(msg: Mapping[str, Any], name: str, what: str) -> int:
    value = msg.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ControlPlaneError(f"malformed {what}: {name!r} must be a non-negative integer, got {value!r}")
    return value


def _optional_int(msg: Mapping[str, Any], name: str, what: str) -> int:
    """A non-negative integer that older peers may leave out (0 then)."""
    return 0 if msg.get(name) is None else _int(msg, name, what)


def _optional_seconds(msg: Mapping[str, Any], name: str, what: str) -> float:
    """A non-negative finite number of seconds that older peers may leave out (0.0 then)."""
    value = msg.get(name)
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
        raise ControlPlaneError(f"malformed {what}: {name!r} must be a non-negative number, got {value!r}")
    return float(value)


def _bool(msg: Mapping[str, Any], name: str, what: str) -> bool:
    value = msg.get(name)
    if not isinstance(value, bool):
        raise ControlPlaneError(f"malformed {what}: {name!r} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class RankInfo:
    """One worker's topology numbers in one round (see the module docstring for their meaning)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


@dataclass(frozen=True)
class Assignment:
    """Rendezvous reply: the worker's place in a formed round. It names no other member, so its size does not grow with
    the round's (the group's store tells the peers: ``worker.rounds.peers``), except to an older worker (``hosts``:
    what it names a partition's peers from, see ``driver.job.partitions``; an older driver's is ignored) and rank 0's
    ``facts`` (three numbers a member, in rounds of at most ``MAX_TOLD_FACTS``)."""

    round: int
    ranks: RankInfo
    needs_sync: bool
    update_gen: int
    #: No worker of the round holds the committed state: rank 0 loads the latest durable checkpoint.
    from_checkpoint: bool = False
    #: The round is the planned one of this number (:class:`NextRound`): every member formed its group in the
    #: background, and switches to it instead of forming one (0: form the group now, as usual).
    planned: int = 0
    #: Every member reads its peers' addresses in the round's store (``worker.rounds.peers``): write them there.
    peers_in_store: bool = False
    hosts: tuple[str, ...] = ()  # the round's hosts, each once: sent to an older worker only (not read back)
    #: Not None: the round's first sync takes its facts from here, not from a gather (``worker.commit.sync_facts``): to
    #: rank 0, every member's (commit_seq, holds_commit, host index) as it said at this rendezvous, by rank; () else.
    facts: tuple[tuple[int, int, int], ...] | None = None

    def to_wire(self) -> dict[str, Any]:
        return dict(asdict(self.ranks), status="assigned", round=self.round, needs_sync=self.needs_sync,
                    update_gen=self.update_gen, from_checkpoint=self.from_checkpoint, planned=self.planned,
                    peers_in_store=self.peers_in_store, **({"hosts": list(self.hosts)} if self.hosts else {}),
                    **({"facts": [list(row) for row in self.facts]} if self.facts is not None else {}))

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "Assignment":
        what = "rendezvous assignment"
        ranks = _ranks(msg, what)
        return cls(_int(msg, "round", what), ranks, _bool(msg, "needs_sync", what), _int(msg, "update_gen", what),
                   bool(msg.get("from_checkpoint", False)), _optional_int(msg, "planned", what),
                   msg.get("peers_in_store") is True, facts=facts_field(msg, what, ranks.rank, ranks.size))


def _ranks(msg: Mapping[str, Any], what: str) -> RankInfo:
    """A message's ranks, each in range."""
    ranks = RankInfo(**{f.name: _int(msg, f.name, what) for f in fields(RankInfo)})
    if ranks.rank >= ranks.size or ranks.local_rank >= ranks.local_size or ranks.cross_rank >= ranks.cross_size:
        raise ControlPlaneError(f"malformed {what}: ranks out of range: {ranks}")
    return ranks


@dataclass(frozen=True)
class NextRound:
    """The driver's plan of the next round, offered to each of its members in their heartbeat reply.

    ``plan`` numbers the plans of this driver (a dropped plan is never offered again); each member
    forms the plan's process group in the background, on the round's namespace with the suffix
    ``-p<plan>``, and says so (kind ``next_round``). The plan is a proposal: only an
    :class:`Assignment` whose ``planned`` is ``plan`` makes it the round (it names no other member either).
    """

    plan: int
    round: int
    ranks: RankInfo
    peers_in_store: bool = False  # as in Assignment

    def to_wire(self) -> dict[str, Any]:
        return dict(asdict(self.ranks), plan=self.plan, round=self.round, peers_in_store=self.peers_in_store)

    @classmethod
    def from_wire(cls, msg: Any) -> "NextRound | None":
        if not isinstance(msg, Mapping):
            return None
        what = "next round"
        return cls(_int(msg, "plan", what), _int(msg, "round", what), _ranks(msg, what),
                   msg.get("peers_in_store") is True)


@dataclass(frozen=True)
class NextRoundReport:
    """A worker formed the process group of plan ``plan`` in the background (``formed``), or could not
    (kind ``next_round``)."""

    plan: int
    formed: bool
    reason: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"plan": self.plan, "formed": self.formed, "reason": self.reason[:300]}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "NextRoundReport":
        reason, what = msg.get("reason"), "next round report"
        return cls(_int(msg, "plan", what), _bool(msg, "formed", what), reason[:300] if isinstance(reason, str) else "")


@dataclass(frozen=True)
class ExitOrder:
    """Rendezvous reply telling a worker to leave (its host is going, or the job is ending)."""

    reason: str
    #: The worker's host holds the last copy of the state and was picked to checkpoint it (one host of the last
    #: holders, by the order they left in): its workers first write it, taking at most this long.
    checkpoint_s: float | None = None
    #: The one worker of that host that writes a replica's checkpoint (a sharded one is written by the whole host).
    writer: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"status": "exit", "reason": self.reason, "checkpoint_s": self.checkpoint_s, "writer": self.writer}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "ExitOrder":
        seconds = None if msg.get("checkpoint_s") is None else _optional_seconds(msg, "checkpoint_s", "exit order")
        return cls(str(msg.get("reason") or "told to exit"), seconds, msg.get("writer") is True)


@dataclass(frozen=True)
class WaitReply:
    """Rendezvous reply: no round yet; ask again."""

    def to_wire(self) -> dict[str, Any]:
        return {"status": "wait"}


@dataclass(frozen=True)
class ReRegister:
    """Reply of a restarted driver (within ``--driver-grace``) to a rendezvous request of a worker it does not know
    yet: send an :class:`AdoptRequest` (a poll reply says the same with ``PollReply.reregister``)."""

    def to_wire(self) -> dict[str, Any]:
        return {"status": "reregister"}


RendezvousReply = Assignment | ExitOrder | WaitReply | ReRegister


def parse_rendezvous_reply(msg: Mapping[str, Any]) -> RendezvousReply:
    """The typed form of a rendezvous reply; ControlPlaneError if it is none of them."""
    status = msg.get("status")
    if status == "assigned":
        return Assignment.from_wire(msg)
    if status == "exit":
        return ExitOrder.from_wire(msg)
    if status == "wait":
        return WaitReply()
    if status == "reregister":
        return ReRegister()
    raise ControlPlaneError(f"malformed rendezvous reply: unknown status {status!r}")


@dataclass(frozen=True)
class RendezvousRequest:
    """A worker asks to join the round after ``last_round`` (0: none yet).

    ``commits`` is how many commits it has made; ``rolled_back`` how many steps its last restore undid;
    ``commit_seq`` the position, in the job's history of commits, of the state it would restore (see
    ``WorkerContext.commit_seq``): the driver makes the holder of the newest commit rank 0. ``holds_commit``
    is False when its live state is not that commit and nothing it kept can restore it (a failure after an
    in-place update, see ``worker.ledger``): the driver must not take the state from it. ``unreachable``: the IP
    addresses its last round's group still tried to reach when it gave the formation up; ``addresses``: its own host's,
    which its peers reach it at (None: an older worker's, which reads no peer's in the store, and whose ``unreachable``
    names hosts); the driver names the hosts behind the first by the second (``driver.job.partitions``).
    ``trained``: the fingerprint of that commit's state ("": none; see ``driver.job.repeats.Trained``).
    """

    last_round: int
    reason: str
    commits: int = 0
    rolled_back: int = 0
    commit_seq: int = 0
    holds_commit: bool = True
    unreachable: tuple[str, ...] = ()
    trained: str = ""
    addresses: tuple[str, ...] | None = None
    takes_facts: bool = False  # it reads a sync's facts in its assignment (``Assignment.facts``): older ones gather

    def to_wire(self) -> dict[str, Any]:
        addresses = None if self.addresses is None else list(self.addresses[:MAX_ADDRESSES])
        return {"last_round": self.last_round, "reason": self.reason, "commits": self.commits, "rolled_back": self.rolled_back,
                "commit_seq": self.commit_seq, "holds_commit": self.holds_commit, **fingerprint_wire(self.trained),
                "unreachable": list(self.unreachable[:MAX_ADDRESSES]), "addresses": addresses,
                "takes_facts": self.takes_facts}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "RendezvousRequest":
        reason = msg.get("reason")
        if reason not in RENDEZVOUS_REASONS:
            raise ControlPlaneError(f"malformed rendezvous request: reason must be one of {RENDEZVOUS_REASONS}, got {reason!r}")
        what = "rendezvous request"
        holds = True if msg.get("holds_commit") is None else _bool(msg, "holds_commit", what)  # older workers: True
        unreachable, addresses = evidence_fields(msg, what)
        return cls(_int(msg, "last_round", what), reason, _optional_int(msg, "commits", what),
                   _optional_int(msg, "rolled_back", what), _optional_int(msg, "commit_seq", what), holds,
                   unreachable, fingerprint_field(msg, what), addresses, msg.get("takes_facts") is True)


@dataclass(frozen=True)
class LinkReport:
    """A worker's link probe, sent with its heartbeats (see ``worker.link.link_probe``).

    ``port``: where its probe answers on its host (0: no probe); ``probed``: the
    :class:`ProbeOrder` its ``mb_s`` answers (0: none yet); ``mb_s``: per peer
    worker id, the bandwidth measured to it, in MB/s (at most :attr:`MAX_PEERS`).
    """

    port: int = 0
    probed: int = 0
    mb_s: tuple[tuple[str, float], ...] = ()

    MAX_PEERS = 16

    def to_wire(self) -> dict[str, Any]:
        return {"port": self.port, "probed": self.probed, "mb_s": dict(self.mb_s)}

    @classmethod
    def from_wire(cls, msg: Any) -> "LinkReport | None":
        if msg is None:
            return None
        what = "link report"
        if not isinstance(msg, Mapping):
            raise ControlPlaneError(f"malformed {what}: must be an object or null")
        port = _optional_int(msg, "port", what)
        raw = msg.get("mb_s") or {}
        if port > 65535 or not isinstance(raw, Mapping) or len(raw) > cls.MAX_PEERS:
            raise ControlPlaneError(f"malformed {what}: 'port' must be a port, 'mb_s' at most {cls.MAX_PEERS} peers")
        mb_s = tuple((str(peer)[:200], _optional_seconds(raw, peer, what)) for peer in raw)
        return cls(port, _optional_int(msg, "probed", what), mb_s)


@dataclass(frozen=True)
class ProbeOrder:
    """The driver asks a worker to probe its links to ``peers`` (``worker_id@host:port`` each), once per ``seq``."""

    seq: int
    peers: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.seq, "peers": list(self.peers)}

    @classmethod
    def from_wire(cls, msg: Any) -> "ProbeOrder | None":
        if not isinstance(msg, Mapping):
            return None
        peers = msg.get("peers")
        if not isinstance(peers, list) or len(peers) > LinkReport.MAX_PEERS or not all(
                isinstance(p, str) and 0 < len(p) <= 300 for p in peers):
            raise ControlPlaneError("malformed probe order: 'peers' must be a short list of worker@host:port")
        return cls(_int(msg, "seq", "probe order"), tuple(peers))


@dataclass(frozen=True)
class FlightEntry:
    """A worker's newest collective (its flight record, see ``worker.rounds.flight``), sent with its heartbeat.

    ``seq`` numbers the collectives of ``round`` from 1, the same on every rank; ``state`` is
    ``entered`` (waiting in it), ``completed`` or ``failed``; ``age_s`` is how long ago it was
    entered (``entered``) or ended (the others), so that no clocks need agree.
    """

    round: int
    seq: int
    op: str
    state: str
    age_s: float

    STATES = ("entered", "completed", "failed")

    def to_wire(self) -> dict[str, Any]:
        return {"round": self.round, "seq": self.seq, "op": self.op, "state": self.state, "age_s": self.age_s}

    @classmethod
    def from_wire(cls, msg: Any) -> "FlightEntry | None":
        if msg is None:
            return None
        what = "flight entry"
        if not isinstance(msg, Mapping) or msg.get("state") not in cls.STATES or not isinstance(msg.get("op"), str):
            raise ControlPlaneError(f"malformed {what}: needs a state of {cls.STATES} and an op")
        return cls(_int(msg, "round", what), _int(msg, "seq", what), msg["op"][:80], msg["state"],
                   _optional_seconds(msg, "age_s", what))


@dataclass(frozen=True)
class PollRequest:
    """Heartbeat long-poll: what the worker already knows; the reply comes when any of it changes."""

    round: int
    update_gen: int
    abort_round: int
    commits: int = 0  # commits the worker has made (its progress, for the driver and the events)
    commit_seq: int = 0  # position of its last commit in the job's history (see RendezvousRequest)
    #: A counter that grows whenever the worker makes progress: a commit, an optimizer step, a
    #: collective completed, or its training thread moving on outside collectives (see
    #: ``worker.link.progress``). The driver aborts a round whose members' counters all stand still.
    progress: int = 0
    steps: int = 0  # optimizer steps the worker has taken in all (for reports)
    waiting_s: float = 0.0  # how long its training thread has been waiting in one collective (0: not waiting)
    #: Its compute time per optimizer step (median of its recent steps in this round), when known.
    compute_s: float | None = None
    #: Its time per optimizer step in collectives (waiting on peers and sending), when known.
    comm_s: float | None = None
    #: Its link probe: its port and its last measurements (None: no probe).
    link: LinkReport | None = None
    #: Its newest collective (None: none yet, or an older worker).
    flight: FlightEntry | None = None
    #: The longest pause of its garbage collector to expect (its heartbeats wait for it; see ``worker.link.pauses``).
    pause_s: float = 0.0
    #: The planned next round it acts on (:class:`NextRound`'s ``plan``; 0: none).
    next_plan: int = 0
    #: It has entered ``hvd.elastic.run``: the job is elastic (``driver.job.fixed_size``; older workers: False).
    elastic: bool = False
    stacks_signal: bool | None = None  # it prints its stacks on the driver's signal (None: an older worker)
    trained: str = ""  # the fingerprint of its last commit's state (see RendezvousRequest)
    #: Whether it can restore its last commit exactly (see RendezvousRequest); False while it follows in its round
    #: (``worker.commit.follow``: it has no whole state yet). None: an older worker, which says so at rendezvous only.
    holds_commit: bool | None = None

    def to_wire(self) -> dict[str, Any]:
        # A literal, not asdict(): sent twice a second by every worker (asdict was ~15 % of a heartbeat).
        return {"round": self.round, "update_gen": self.update_gen, "abort_round": self.abort_round,
                "commits": self.commits, "commit_seq": self.commit_seq, "progress": self.progress,
                "steps": self.steps, "waiting_s": self.waiting_s, "compute_s": self.compute_s,
                "comm_s": self.comm_s, "link": None if self.link is None else self.link.to_wire(),
                "flight": None if self.flight is None else self.flight.to_wire(), "pause_s": self.pause_s,
                "next_plan": self.next_plan, "elastic": self.elastic, "stacks_signal": self.stacks_signal,
                "holds_commit": self.holds_commit, **fingerprint_wire(self.trained)}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "PollRequest":
        what = "poll request"
        return cls(_int(msg, "round", what), _int(msg, "update_gen", what), _int(msg, "abort_round", what),
                   _optional_int(msg, "commits", what), _optional_int(msg, "commit_seq", what),
                   _optional_int(msg, "progress", what), _optional_int(msg, "steps", what),
                   _optional_seconds(msg, "waiting_s", what),
                   None if msg.get("compute_s") is None else _optional_seconds(msg, "compute_s", what),
                   None if msg.get("comm_s") is None else _optional_seconds(msg, "comm_s", what),
                   LinkReport.from_wire(msg.get("link")), FlightEntry.from_wire(msg.get("flight")),
                   _optional_seconds(msg, "pause_s", what), _optional_int(msg, "next_plan", what),
                   msg.get("elastic") is not None and _bool(msg, "elastic", what),
                   None if msg.get("stacks_signal") is None else _bool(msg, "stacks_signal", what),
                   fingerprint_field(msg, what),
                   None if msg.get("holds_commit") is None else _bool(msg, "holds_commit", what))


@dataclass(frozen=True)
class PollReply:
    """Heartbeat reply: what a running worker must know right now."""

    round: int
    update_gen: int
    abort_round: int
    shutdown: bool
    #: Set when this worker is to run its host's metadata notice watcher for that cloud.
    notice_watcher: str | None = None
    #: A restarted driver does not know this worker yet: it must send an :class:`AdoptRequest`.
    reregister: bool = False
    #: The driver wants this worker's Python stacks (a stuck round): each new number asks once.
    stacks: int = 0
    #: Why the driver sends this worker away (its host leaves: it is draining or told to exit), else None.
    #: A worker learns it at its next commit or rendezvous; one still forming its host's group
    #: (``hvd.shard``), where neither comes, learns it here.
    leave: str | None = None
    #: The driver wants this worker to probe its links to these peers (each order once; see :class:`ProbeOrder`).
    probe: ProbeOrder | None = None
    #: The planned next round this worker is a member of, to form its group in the background (see :class:`NextRound`).
    next_round: NextRound | None = None
    #: The plan the current round formed from (0: none): a worker told of a plan learns whether it became the round.
    round_plan: int = 0
    #: Told to a leaving host watcher: every other worker of its host has exited, so it may acknowledge the notices.
    host_vacated: bool = False

    @property
    def dismissed(self) -> bool:
        """The driver does not count this worker (unknown, or given up): ``PollReply(0, 0, 0, True)``."""
        return self.shutdown and self.round == 0

    def to_wire(self) -> dict[str, Any]:
        return {"round": self.round, "update_gen": self.update_gen, "abort_round": self.abort_round,
                "shutdown": self.shutdown, "notice_watcher": self.notice_watcher, "reregister": self.reregister,
                "stacks": self.stacks, "leave": self.leave,
                "probe": None if self.probe is None else self.probe.to_wire(),
                "next_round": None if self.next_round is None else self.next_round.to_wire(),
                "round_plan": self.round_plan, "host_vacated": self.host_vacated}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "PollReply":
        what = "poll reply"
        watcher = msg.get("notice_watcher")
        leave = msg.get("leave")
        return cls(_int(msg, "round", what), _int(msg, "update_gen", what), _int(msg, "abort_round", what),
                   bool(msg.get("shutdown", False)), watcher if isinstance(watcher, str) else None,
                   msg.get("reregister") is True, _optional_int(msg, "stacks", what),
                   leave[:500] if isinstance(leave, str) and leave else None, ProbeOrder.from_wire(msg.get("probe")),
                   NextRound.from_wire(msg.get("next_round")), _optional_int(msg, "round_plan", what),
                   msg.get("host_vacated") is True)


#: What the driver answers a worker whose training function returned (kind ``completed``).
COMPLETION_DECISIONS = ("done", "wait", "leave")


@dataclass(frozen=True)
class CompletedReport:
    """A worker's training function returned (kind ``completed``); ``commit_seq`` and ``steps``: how far it got.

    ``error``: rank 0 could not write the final durable checkpoint (the job must not report success then).
    ``elastic`` False: from the exit hook of a worker whose script never entered ``hvd.elastic.run`` (a fixed-size
    script, ``driver.fixed``), ``error`` naming what it ended with, if any. ``again``: the worker entered
    ``hvd.elastic.run`` again after a completion (the job is elastic again)."""

    round: int
    commit_seq: int = 0
    steps: int = 0
    error: str | None = None
    elastic: bool = True
    again: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"round": self.round, "commit_seq": self.commit_seq, "steps": self.steps, "error": self.error,
                "elastic": self.elastic, "again": self.again}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "CompletedReport":
        what = "completion report"
        error = msg.get("error")
        if error is not None and not isinstance(error, str):
            raise ControlPlaneError(f"malformed {what}: 'error' must be a string or null")
        elastic = True if msg.get("elastic") is None else _bool(msg, "elastic", what)  # older workers: True
        return cls(_optional_int(msg, "round", what), _optional_int(msg, "commit_seq", what),
                   _optional_int(msg, "steps", what), None if error is None else error[:500], elastic,
                   msg.get("again") is not None and _bool(msg, "again", what))  # older workers: False


@dataclass(frozen=True)
class CompletionReply:
    """The driver's answer to :class:`CompletedReport`.

    ``done``: the job is completing, the worker goes on with its script; ``wait``:
    rank 0 is still training, ask again; ``leave``: it returned while rank 0 was
    still training, so it leaves the job now (``reason`` says why) and its peers
    continue without it. ``checkpoint_s`` and ``writer`` with ``leave``: as in :class:`ExitOrder` (a parked member
    holding the final state when rank 0 was lost writes it on its way out); older workers ignore them.
    """

    decision: str
    reason: str = ""
    checkpoint_s: float | None = None
    writer: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"ok": True, "decision": self.decision, "reason": self.reason, "checkpoint_s": self.checkpoint_s,
                "writer": self.writer}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "CompletionReply":
        # A restarted driver still adopting answers {"status": "wait"}; an older driver, {"ok": true}.
        decision = msg.get("decision", "wait" if msg.get("status") == "wait" else "done")
        if decision not in COMPLETION_DECISIONS:
            raise ControlPlaneError(f"malformed completion reply: decision must be one of {COMPLETION_DECISIONS}, "
                                    f"got {decision!r}")
        seconds = msg.get("checkpoint_s")
        seconds = None if seconds is None else _optional_seconds(msg, "checkpoint_s", "completion reply")
        return cls(decision, str(msg.get("reason") or ""), seconds, msg.get("writer") is True)


@dataclass(frozen=True)
class AdoptRequest:
    """A worker re-registers with a restarted driver (kind ``adopt``): where it stands, so that the
    driver takes it over in its current round without a new round or a rollback.

    ``round``/``ranks``/``update_gen`` are those of the round it trains in (``round`` 0: it never joined one);
    ``seen_update``/``seen_abort`` the highest update generation and aborted round it has heard of; ``commits``
    its commits; ``pid`` its process id; ``commit_seq`` its last commit's position in the job's history (see
    RendezvousRequest); ``sigterm_deadline`` (Unix time, 0: none) that of a SIGTERM the dead driver let it stay for;
    ``completed``: its training function returned and the driver said ``done`` (it is in the work after it).
    """

    round: int
    ranks: RankInfo | None
    update_gen: int
    seen_update: int
    seen_abort: int
    commits: int
    slot: int
    pid: int
    commit_seq: int = 0
    sigterm_deadline: float = 0.0
    completed: bool = False

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "ranks"}
        out["ranks"] = None if self.ranks is None else asdict(self.ranks)
        return out

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "AdoptRequest":
        what = "adopt request"
        raw, ranks = msg.get("ranks"), None
        if raw is not None:
            if not isinstance(raw, Mapping):
                raise ControlPlaneError(f"malformed {what}: 'ranks' must be an object or null")
            ranks = RankInfo(**{f.name: _int(raw, f.name, what) for f in fields(RankInfo)})
            if ranks.rank >= ranks.size or ranks.local_rank >= ranks.local_size:
                raise ControlPlaneError(f"malformed {what}: ranks out of range: {ranks}")
        round_ = _int(msg, "round", what)
        if (ranks is None) != (round_ == 0):
            raise ControlPlaneError(f"malformed {what}: a round needs ranks and ranks need a round")
        return cls(round_, ranks, _int(msg, "update_gen", what), _int(msg, "seen_update", what),
                   _int(msg, "seen_abort", what), _int(msg, "commits", what), _int(msg, "slot", what),
                   _int(msg, "pid", what), _optional_int(msg, "commit_seq", what),
                   _optional_seconds(msg, "sigterm_deadline", what),
                   msg.get("completed") is not None and _bool(msg, "completed", what))  # older workers: False
