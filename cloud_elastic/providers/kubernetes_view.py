"""The Kubernetes provider's in-memory view of the cluster, and how pods and nodes become hosts.

Pure: no I/O, no threads, no clock (``now`` is passed in). The watcher threads
(:mod:`cloud_elastic.providers.kubernetes_watch`) feed it the API's own JSON
(pods and nodes as dicts, straight from a list or a watch event); the provider
asks it for a :class:`~cloud_elastic.providers.api.DiscoveredHosts` snapshot.
Only the fields that matter are kept (:class:`PodRecord`, :class:`NodeRecord`),
so a node's status heartbeat or a pod's unrelated update changes nothing and
wakes nobody.

How a pod reads (first matching row wins; a pod needs ``status.podIP`` and
phase ``Running`` to appear at all: a pod with no IP yet is not a host yet):

==========================================================  ======================================
pod / its node                                              result
==========================================================  ======================================
its node's Node object deleted (see below)                  draining "node <node> deleted", deadline =
                                                            when the view first saw the deletion
``metadata.deletionTimestamp`` set                          draining "pod deleted", deadline = it
condition ``DisruptionTarget`` ``True``                     draining "<reason>", deadline = the
                                                            condition's time + the pod's grace
a hard drain taint on its node (see :data:`DRAIN_TAINTS`)   draining "node <node>: <taint>"; for
                                                            ``spot-itn``, deadline = the taint's
                                                            time + 120 s
condition ``Ready`` ``True``                                **ready**; a soft taint or a cordon
                                                            on its node is a *soft* notice
anything else (not ready)                                   absent
==========================================================  ======================================

A time the API leaves out is counted from when the view first saw the signal
(a snapshot's ``now``): a ``DisruptionTarget`` without ``lastTransitionTime``,
and a taint without ``timeAdded``, which is every taint but a ``NoExecute``
one (the termination handler's ``spot-itn`` is ``NoSchedule``). The deadline
is then later than the truth by the time the signal took to reach the view:
usually the one event that woke the driver.

A node deleted is one the view had and then lost: a ``DELETED`` event, or a
relist without it (not a node it never had: nodes refused; and never under
``node_selector``, where a node relabelled out of the selector leaves the same
way while it runs on). Its taints went with it, while its pods stay listed
``Running`` and ``Ready`` until the pod garbage collector deletes them (about
40 s later): they drain until they go, or until a node of that name is listed
again. A pod of a deleted node, like a terminating one, is not live below.

A terminating pod (``deletionTimestamp`` set) whose address a live pod now
has (the network plugin gave it out again while the old pod stays, say behind
a finalizer or on a lost node) is left out: the address is the live pod's, and
is offered with its identity, not drained under the old one's.

The pod's address is its IPv4 one: ``status.podIP``, or on a dual-stack
cluster whose first family is IPv6, the IPv4 entry of ``status.podIPs``. A pod
with no IPv4 address is warned about once and left out (the driver speaks IPv4
only; an IPv6 host in the snapshot would fail discovery, and end the job).

The worker container is the one ``container`` names; by default (or when no
container of the pod has that name, warned about once) the one with a
``gpu_resource`` limit, else the one named ``worker``, else the first: an
injected sidecar (a mesh proxy is often the first container) is not read for
slots or restarts.

Slots from the annotation must be a whole number from 1 to
:data:`~cloud_elastic.providers.api.MAX_SLOTS_PER_HOST`; any other value is
warned about once and leaves the pod out (it does not fail discovery, which
would end the job for one pod's typo).

A pod or node with a field of a type the API never sends (a pod that is a
string, a ``podIP`` that is a number, a ``deletionTimestamp`` that is not a
time: :class:`MalformedObject`, whose one line names the object and the field)
is warned about once and left out until it is sent readable; the rest of the
view goes on. Failing the list or the watch for one such object would leave
the whole view stale, and end a healthy job (a watch resumed from its kept
version is sent the same event again). A pod left out is missing to the
driver: an update that does not read may be the pod's deletion, so its old
record is not kept as if it were current. An event whose object names no pod
(its uid does not read) changes nothing.

Identity: ``instances`` names each host ``<pod name>/<pod uid>/<restarts>``
(restarts: the worker container's ``restartCount``). A pod recreated under
the same name has a new uid; a container that restarted has lost every worker
process in it. Either way the pod is a new instance, so the driver forgets the
address's known-hosts key and its blacklist entries.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from cloud_elastic.providers._common import SnapshotBuilder, OnceLog, Verdict, draining, READY, ABSENT, parse_time
from cloud_elastic.providers.api import MAX_SLOTS_PER_HOST, DiscoveredHosts

__all__ = ["DRAIN_TAINTS", "SOFT_TAINTS", "SLOTS_ANNOTATION", "PodRecord", "NodeRecord", "ClusterView", "ReadList",
           "MalformedObject", "pod_record", "node_record"]

_log = logging.getLogger(__name__)

#: Node taints that say the node is going away: every pod on it drains (key -> reason).
DRAIN_TAINTS: Mapping[str, str] = {
    "karpenter.sh/disrupted": "Karpenter disruption",
    "aws-node-termination-handler/spot-itn": "spot interruption (node termination handler)",
    "aws-node-termination-handler/asg-lifecycle-termination": "ASG lifecycle termination (node termination handler)",
    "aws-node-termination-handler/scheduled-maintenance": "scheduled maintenance (node termination handler)",
    "cloud.google.com/impending-node-termination": "GKE impending node termination",
}
#: Node taints that only advise moving work off the node: a soft notice (a drain with --drain-on-rebalance).
SOFT_TAINTS: Mapping[str, str] = {
    "aws-node-termination-handler/rebalance-recommendation": "rebalance recommendation (node termination handler)",
}
#: An AWS spot interruption comes two minutes after the warning the taint stands for.
_SPOT_TAINT_LEAD_S = {"aws-node-termination-handler/spot-itn": 120.0}
#: The annotation that gives a pod's slots when its container has no GPU limit (CPU pods).
SLOTS_ANNOTATION = "cloud-elastic.io/slots"
#: What a malformed object costs, as its warning says.
_LEFT_OUT = {"pod": "the pod is left out until the API server sends it readable",
             "node": "its taints and cordon are not seen until the API server sends it readable"}


@dataclass(frozen=True)
class PodRecord:
    """What the provider keeps of one pod (equal records: nothing the driver cares about changed)."""

    name: str
    uid: str
    node: str
    ip: str | None  # IPv4 when the pod has one; else its IPv6 podIP (warned, not a host)
    phase: str
    ready: bool
    restarts: int
    slots: int | None  # None: the slots annotation is unreadable (warned, not a host)
    slots_text: str
    created: str
    deleted_at: float | None
    grace_s: float
    disruption: tuple[str, float | None] | None  # (reason, since) of a True DisruptionTarget
    container: str = ""  # the worker container's name, as read

    @property
    def instance(self) -> str:
        return f"{self.name}/{self.uid}/{self.restarts}"


@dataclass(frozen=True)
class NodeRecord:
    """What the provider keeps of one node: its taints (key -> time added) and whether it is cordoned."""

    name: str
    taints: tuple[tuple[str, float | None], ...]
    cordoned: bool


class MalformedObject(ValueError):
    """An object from the API server with a field of a type the API never sends (a pod that is a string, a
    ``podIP`` that is a number...), or a list page of the wrong shape: one line naming the object and the field.

    ``key`` is the pod's uid or the node's name when that much could be read, else None."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


_NAMES = {Mapping: "an object", list: "a list", str: "a string", int: "a whole number", bool: "true or false",
          (int, float): "a number"}


def shown(value: Any, limit: int = 40) -> str:
    """``value`` as a message shows it: its repr (one line: a string's control characters come escaped), cut."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Fields:
    """Typed reads of one object's JSON (``kind``: ``pod``, ``node``, ``page``): a field of another type raises
    :class:`MalformedObject` naming the object and the field (after ``context``, e.g. ``listing pods: ``), where
    Python's own error (``'str' object has no attribute 'get'``) names neither. A field that is absent or
    ``null`` reads as the default."""

    def __init__(self, kind: str, obj: Any, context: str = "") -> None:
        self.kind = kind
        self.context = context
        self.name = ""
        self.key: str | None = None
        if not isinstance(obj, Mapping):
            raise MalformedObject(f"{context}a {kind} that is {shown(obj)}, not an object")

    def get(self, parent: Mapping[str, Any], where: str, key: str, want: Any, default: Any = None) -> Any:
        """``parent[key]`` (``where`` is the parent's path in the object, ``""`` at its top), of type ``want``."""
        value = parent.get(key)
        if value is None:
            return default
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            path = f"{where}.{key}" if where else key
            raise self.bad(f"{path} is {shown(value)}, not {_NAMES[want]}")
        return value

    def items(self, parent: Mapping[str, Any], where: str, key: str) -> list[tuple[str, Mapping[str, Any]]]:
        """``parent[key]``, a list of objects, each with its path (``spec.containers[1]``)."""
        entries = self.get(parent, where, key, list, [])
        path = f"{where}.{key}" if where else key
        for n, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise self.bad(f"{path}[{n}] is {shown(entry)}, not an object")
        return [(f"{path}[{n}]", entry) for n, entry in enumerate(entries)]

    def time(self, parent: Mapping[str, Any], where: str, key: str) -> float | None:
        """A timestamp (RFC 3339) as Unix seconds: None if absent; MalformedObject if it is not one."""
        text = self.get(parent, where, key, str)
        moment = parse_time(text)
        if text is not None and moment is None:
            raise self.bad(f"{where}.{key} is {shown(text)}, not a time")
        return moment

    def bad(self, what: str) -> MalformedObject:
        who = f"{self.kind} {shown(self.name)}" if self.name else f"a {self.kind}"
        return MalformedObject(f"{self.context}{who}: {what}", self.key)


def _condition(f: Fields, status: Mapping[str, Any], kind: str) -> tuple[str, Mapping[str, Any]] | None:
    for path, cond in f.items(status, "status", "conditions"):
        if f.get(cond, path, "type", str) == kind:
            return path, cond
    return None


def _container(f: Fields, spec: Mapping[str, Any], status: Mapping[str, Any], name: str | None, resource: str
               ) -> tuple[str, int, int]:
    """The worker container's name, GPUs and restarts: the one named ``name``; else the one with a ``resource``
    limit, else the one named ``worker``, else the first (a sidecar may come first)."""
    containers = []
    for path, spec_of in f.items(spec, "spec", "containers"):
        resources = f.get(spec_of, path, "resources", Mapping, {})
        limits = f.get(resources, f"{path}.resources", "limits", Mapping, {})
        containers.append((f.get(spec_of, path, "name", str, ""), _gpus(limits, resource)))
    containers = containers or [("", 0)]
    named = next((c for c in containers if c[0] == name), None) if name else None
    chosen, gpus = (named or next((c for c in containers if c[1] > 0), None)
                    or next((c for c in containers if c[0] == "worker"), containers[0]))
    for path, state in f.items(status, "status", "containerStatuses"):
        if f.get(state, path, "name", str, "") == chosen:
            return chosen, gpus, f.get(state, path, "restartCount", int, 0)
    return chosen, gpus, 0


def _gpus(limits: Mapping[str, Any], resource: str) -> int:
    try:
        return int(str(limits.get(resource, "0")).strip() or 0)
    except ValueError:
        return 0


def _address(f: Fields, status: Mapping[str, Any]) -> str | None:
    """``status.podIP``, unless it is IPv6 and ``status.podIPs`` has an IPv4 entry (dual-stack, IPv6 first)."""
    primary = f.get(status, "status", "podIP", str) or None
    if primary is None or ":" not in primary:
        return primary
    ips = (f.get(entry, path, "ip", str) for path, entry in f.items(status, "status", "podIPs"))
    return next((ip for ip in ips if ip and ":" not in ip), primary)


def _annotated_slots(text: str) -> int | None:
    """The annotation's slots, or None unless it is a whole number in 1..MAX_SLOTS_PER_HOST (ASCII digits only:
    ``int`` takes other scripts' digits, and refuses more than 4300 of them)."""
    if not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > len(str(MAX_SLOTS_PER_HOST)):
        return None
    return int(text) if 0 < int(text) <= MAX_SLOTS_PER_HOST else None


def _slots_refusal(text: str) -> str:
    if text.isascii() and text.isdigit() and text.strip("0"):
        return f"more than the {MAX_SLOTS_PER_HOST} slots a host may have"
    return "not a positive whole number of slots"


def pod_record(pod: Any, *, container: str | None = None, gpu_resource: str = "nvidia.com/gpu",
               slots_per_host: int | None = None) -> PodRecord:
    """Read one pod, in the API's JSON, into a :class:`PodRecord`; :class:`MalformedObject` for a field the
    record reads that has a type the API never sends, or a ``deletionTimestamp`` that is not a time."""
    f = Fields("pod", pod)
    meta = f.get(pod, "", "metadata", Mapping, {})
    f.key = f.get(meta, "metadata", "uid", str, "")
    f.name = f.get(meta, "metadata", "name", str, "")
    spec = f.get(pod, "", "spec", Mapping, {})
    status = f.get(pod, "", "status", Mapping, {})
    annotations = f.get(meta, "metadata", "annotations", Mapping, {})
    annotation = f.get(annotations, "metadata.annotations", SLOTS_ANNOTATION, str, "").strip()
    worker, gpus, restarts = _container(f, spec, status, container, gpu_resource)
    slots: int | None
    if slots_per_host is not None:
        slots = slots_per_host
    elif gpus > 0:
        slots = gpus
    elif annotation:
        slots = _annotated_slots(annotation)
    else:
        slots = 1
    ready = _condition(f, status, "Ready")
    disrupted = _condition(f, status, "DisruptionTarget")
    disruption = None
    if disrupted is not None and f.get(disrupted[1], disrupted[0], "status", str) == "True":
        why = f.get(disrupted[1], disrupted[0], "reason", str) or "DisruptionTarget"
        disruption = (f"DisruptionTarget: {why}", parse_time(f.get(disrupted[1], disrupted[0], "lastTransitionTime",
                                                                   str)))
    grace = f.get(spec, "spec", "terminationGracePeriodSeconds", (int, float), 30)
    return PodRecord(
        name=f.name,
        uid=f.key,
        node=f.get(spec, "spec", "nodeName", str, ""),
        ip=_address(f, status),
        phase=f.get(status, "status", "phase", str, ""),
        ready=ready is not None and f.get(ready[1], ready[0], "status", str) == "True",
        restarts=restarts,
        slots=slots,
        slots_text=annotation,
        created=f.get(meta, "metadata", "creationTimestamp", str, ""),
        deleted_at=f.time(meta, "metadata", "deletionTimestamp"),
        grace_s=float(grace),
        disruption=disruption,
        container=worker,
    )


def node_record(node: Any) -> NodeRecord:
    """Read one node, in the API's JSON, into a :class:`NodeRecord`; :class:`MalformedObject` for a field the
    record reads that has a type the API never sends."""
    f = Fields("node", node)
    f.name = f.get(f.get(node, "", "metadata", Mapping, {}), "metadata", "name", str, "")
    f.key = f.name
    spec = f.get(node, "", "spec", Mapping, {})
    taints = []
    for path, taint in f.items(spec, "spec", "taints"):
        key = f.get(taint, path, "key", str)
        if key:
            taints.append((key, parse_time(f.get(taint, path, "timeAdded", str))))
    return NodeRecord(f.name, tuple(sorted(taints, key=lambda t: (t[0], t[1] or 0.0))),
                      f.get(spec, "spec", "unschedulable", bool, False))


class ReadList(list):
    """Objects of a list already read by :meth:`ClusterView.read`: (record or None, key) pairs."""


class ClusterView:
    """The pods (by uid) and nodes (by name) the watchers have seen, and the snapshot they make.

    ``drain_taints`` adds the user's taint keys to :data:`DRAIN_TAINTS`. Each
    ``apply``/``replace`` returns whether the snapshot may have changed, so a
    watcher wakes the driver only for news that matters to it. Not thread-safe:
    the provider holds one lock around every call.
    """

    def __init__(self, label: str, *, drain_taints: Iterable[str] = (), container: str | None = None,
                 gpu_resource: str = "nvidia.com/gpu", slots_per_host: int | None = None,
                 drain_soft: bool = False, nodes_selected: bool = False) -> None:
        self.label = label
        self.drain_soft = drain_soft
        #: The nodes watch has a label selector (``-o node_selector``): a node that stops matching it leaves the
        #: view as a deleted one does (a DELETED event, a relist without it), so a node gone is not taken for a
        #: node deleted (its pods would drain while it runs on).
        self.nodes_selected = nodes_selected
        #: Raised by every change that may change the snapshot (the provider caches it per version).
        self.version = 0
        self.hard = {**DRAIN_TAINTS, **{key: f"taint {key}" for key in drain_taints if key not in DRAIN_TAINTS}}
        self._read_pod = {"container": container, "gpu_resource": gpu_resource, "slots_per_host": slots_per_host}
        self.pods: dict[str, PodRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self._first_seen: dict[str, float] = {}  # pod uid -> when a disruption without a time was first seen
        self._taint_seen: dict[tuple[str, str], float] = {}  # (node, key) -> when a timeless taint was first seen
        #: Node name -> when a snapshot first saw it deleted (None until one has): see _verdict.
        self._nodes_gone: dict[str, float | None] = {}
        self._once = OnceLog(_log, logging.WARNING)
        #: (kind, key) -> the message last warned for a malformed pod or node (key None: one whose key is unreadable)
        self._malformed: dict[tuple[str, str | None], str] = {}

    # -- feeding -------------------------------------------------------------------------

    def replace_pods(self, pods: Iterable[Any]) -> bool:
        """A complete list of pods (a list or a relist): what was not listed is gone, and so is a malformed pod
        (:meth:`_record`)."""
        fresh = self._read_all("pod", pods)
        changed = fresh != self.pods
        self.pods = fresh
        return self._bump(changed)

    def apply_pod(self, kind: str, pod: Any) -> bool:
        """One watch event (``ADDED``, ``MODIFIED`` or ``DELETED``) for a pod. A malformed pod is dropped, if its
        uid can be read: what the update that does not read says may be its deletion."""
        record, uid = self._record("pod", pod)
        if kind == "DELETED" or record is None:
            if kind == "DELETED":
                self._malformed.pop(("pod", uid), None)
            return self._bump(uid is not None and self.pods.pop(uid, None) is not None)
        changed = self.pods.get(record.uid) != record
        self.pods[record.uid] = record
        return self._bump(changed)

    def replace_nodes(self, nodes: Iterable[Any]) -> bool:
        """A complete list of nodes, less the malformed ones; True if a node our pods run on changed."""
        fresh = self._read_all("node", nodes)
        ours = {p.node for p in self.pods.values()}
        changed = any(fresh.get(n) != self.nodes.get(n) for n in ours)
        unread = {key for kind, key in self._malformed if kind == "node"}  # in the list, but malformed: not gone
        for name in set() if self.nodes_selected else set(self.nodes) - set(fresh) - unread:
            self._nodes_gone.setdefault(name, None)
        for name in fresh:
            self._nodes_gone.pop(name, None)
        self.nodes = fresh
        return self._bump(changed)

    def apply_node(self, kind: str, node: Any) -> bool:
        """One watch event for a node; True if one of our pods runs there and its taints or cordon changed. A
        malformed node is dropped, if its name can be read."""
        record, name = self._record("node", node)
        if name is None:
            return False
        old, was_gone = self.nodes.get(name), name in self._nodes_gone
        if kind == "DELETED" or record is None:
            self.nodes.pop(name, None)
            record = None
            if kind == "DELETED" and not self.nodes_selected:
                self._nodes_gone.setdefault(name, None)
        else:
            self.nodes[name] = record
            self._nodes_gone.pop(name, None)  # a node of that name registered (again)
        if old == record and was_gone == (name in self._nodes_gone):
            return False
        return self._bump(any(p.node == name for p in self.pods.values()))

    def _record(self, kind: str, obj: Any) -> tuple[Any, str | None]:
        """(the record, its key: a pod's uid, a node's name) of one object from the API server.

        (None, the key or None if even that does not read) for a malformed object (:class:`MalformedObject`):
        it is left out, with one WARNING that names it and the field, again only if it changes or comes back
        after it was sent readable. A pod or node that does not read is one object the API server (or a proxy)
        got wrong: failing the list or the watch for it would leave the whole view stale and end a healthy
        job (a watch resumed from its kept version is sent the same event again)."""
        try:
            record = pod_record(obj, **self._read_pod) if kind == "pod" else node_record(obj)
        except MalformedObject as exc:
            if self._malformed.get((kind, exc.key)) != str(exc):
                self._malformed[(kind, exc.key)] = str(exc)
                _log.warning("%s: %s (from the API server); %s", self.label, exc, _LEFT_OUT[kind])
            return None, exc.key
        key = record.uid if isinstance(record, PodRecord) else record.name
        self._malformed.pop((kind, key), None)
        return record, key

    def read(self, kind: str, objs: Iterable[Any]) -> "ReadList":
        """The objects of one page of a list, each read into (its record, or None if malformed; its key), for
        :meth:`replace_pods` or :meth:`replace_nodes` once the list is complete. A list reads each page as it
        comes, so it keeps these small records, not every page's JSON (a 16,000-node cluster's realistic nodes
        of ~19 KiB each held 1 GiB until the last page came: review s64 rvK finding 3)."""
        return ReadList(self._record(kind, obj) for obj in objs)

    def _read_all(self, kind: str, objs: Iterable[Any]) -> dict[str, Any]:
        """A complete list's records by key (``objs``: the objects, or a :class:`ReadList` of them already read),
        the malformed objects left out; those of ``kind`` no longer in the list are forgotten (warned again if
        they come back)."""
        fresh, bad = {}, set()
        for record, key in objs if isinstance(objs, ReadList) else (self._record(kind, obj) for obj in objs):
            if record is None:
                bad.add((kind, key))
            else:
                fresh[key] = record
        self._malformed = {k: v for k, v in self._malformed.items() if k[0] != kind or k in bad}
        return fresh

    def _bump(self, changed: bool) -> bool:
        if changed:
            self.version += 1
        return changed

    # -- reading -------------------------------------------------------------------------

    def snapshot(self, now: float) -> DiscoveredHosts:
        """The hosts as the view stands (see the module docstring), oldest pod first."""
        builder = SnapshotBuilder(self.label)
        soft: dict[str, str] = {}
        uids = set()
        live = {pod.ip for pod in self.pods.values() if pod.ip and pod.phase == "Running" and not self._doomed(pod)}
        for pod in self.pods.values():
            uids.add(pod.uid)
            if not pod.ip or pod.phase != "Running":
                continue
            if self._doomed(pod) and pod.ip in live:
                continue  # its address was given to a live pod: the terminating one no longer has it
            if not self._readable(pod):
                continue
            verdict = self._verdict(pod, now)
            if verdict.kind == "ready" and pod.slots is None:
                self._once.note(("slots", pod.uid, pod.slots_text), "%s: pod %s has annotation %s=%r, which is %s; "
                                "the pod is not used", self.label, pod.name, SLOTS_ANNOTATION, pod.slots_text,
                                _slots_refusal(pod.slots_text))
                continue
            builder.add(pod.ip, verdict, lambda p=pod: p.slots, order=pod.created, instance=pod.instance)
            if verdict.kind == "ready":
                note = self._soft(pod)
                if note:
                    soft[pod.ip] = note
        for uid in set(self._first_seen) - uids:
            del self._first_seen[uid]
        for name in set(self._nodes_gone) - {pod.node for pod in self.pods.values()}:
            del self._nodes_gone[name]  # its pods are gone too
        taints = {(node.name, key) for node in self.nodes.values() for key, _ in node.taints}
        for gone in set(self._taint_seen) - taints:
            del self._taint_seen[gone]
        self._once.cycle()
        snap = builder.build()
        soft = {h: r for h, r in soft.items() if h in snap.ready}
        return DiscoveredHosts(ready=snap.ready, draining=snap.draining, instances=snap.instances, soft=soft)

    def _readable(self, pod: PodRecord) -> bool:
        """Warn (once) of a ``container`` option the pod has no container of, and of a pod with no IPv4 address;
        False for the latter, which is left out."""
        wanted = self._read_pod["container"]
        if wanted and pod.container != wanted:
            self._once.note(("container", wanted), "%s: -o container=%r names no container of pod %s; its "
                            "container %r is read for slots and restarts", self.label, wanted, pod.name, pod.container)
        if ":" in pod.ip:
            self._once.note(("ipv6", pod.uid), "%s: pod %s has no IPv4 address (only %s), and the driver speaks "
                            "IPv4 only; the pod is not used", self.label, pod.name, pod.ip)
            return False
        return True

    def _doomed(self, pod: PodRecord) -> bool:
        """Terminating, or on a deleted node: its address may be given to a live pod."""
        return pod.deleted_at is not None or pod.node in self._nodes_gone

    def _verdict(self, pod: PodRecord, now: float) -> Verdict:
        if pod.node in self._nodes_gone:
            # The node is gone, and its drain taint with it, while its pods read Running and Ready until the
            # pod garbage collector deletes them: draining, with the deadline now, not gone. Gone would make them
            # missing hosts, which the driver keeps for --host-missing-grace (longer, as the last holders of the
            # newest commit), on discovery's word; draining says why, starts nothing there, and removes the
            # workers there one deadline margin after the driver learns of it. No later than now: the instance
            # behind a deleted node is usually gone already.
            since = self._nodes_gone[pod.node]
            if since is None:
                since = self._nodes_gone[pod.node] = now
            return draining(f"node {pod.node} deleted", since)
        if pod.deleted_at is not None:
            return draining("pod deleted", pod.deleted_at)
        if pod.disruption is not None:
            reason, since = pod.disruption
            if since is None:
                since = self._first_seen.setdefault(pod.uid, now)
            return draining(reason, since + pod.grace_s)
        node = self.nodes.get(pod.node)
        if node is not None:
            for key, added in node.taints:
                if key in self.hard:
                    lead = _SPOT_TAINT_LEAD_S.get(key)
                    if lead is not None and added is None:
                        added = self._taint_seen.setdefault((node.name, key), now)
                    deadline = None if lead is None else added + lead
                    return draining(f"node {node.name}: {self.hard[key]}", deadline)
        if pod.ready and self.drain_soft:
            note = self._soft(pod)
            if note:
                return draining(note)
        return READY if pod.ready else ABSENT

    def _soft(self, pod: PodRecord) -> str | None:
        node = self.nodes.get(pod.node)
        if node is None:
            return None
        for key, _ in node.taints:
            if key in SOFT_TAINTS:
                return f"node {node.name}: {SOFT_TAINTS[key]}"
        return f"node {node.name} cordoned" if node.cordoned else None
