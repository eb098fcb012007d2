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

__all__ = ["DRAIN_TAINTS", "SOFT_TAINTS", "SLOTS_ANNOTATION", "PodRecord", "NodeRecord", "ClusterView",
           "pod_record", "node_record"]

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


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == kind:
            return cond
    return None


def _container(spec: Mapping[str, Any], status: Mapping[str, Any], name: str | None, resource: str
               ) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The worker container's spec and status: the one named ``name``; else the one with a ``resource``
    limit, else the one named ``worker``, else the first (a sidecar may come first)."""
    containers = spec.get("containers") or [{}]
    named = next((c for c in containers if c.get("name") == name), None) if name else None
    chosen = (named or next((c for c in containers if _gpus(c, resource) > 0), None)
              or next((c for c in containers if c.get("name") == "worker"), containers[0]))
    statuses = status.get("containerStatuses") or ()
    state = next((s for s in statuses if s.get("name") == chosen.get("name")), {})
    return chosen, state


def _gpus(container: Mapping[str, Any], resource: str) -> int:
    limits = (container.get("resources") or {}).get("limits") or {}
    try:
        return int(str(limits.get(resource, "0")).strip() or 0)
    except ValueError:
        return 0


def _address(status: Mapping[str, Any]) -> str | None:
    """``status.podIP``, unless it is IPv6 and ``status.podIPs`` has an IPv4 entry (dual-stack, IPv6 first)."""
    primary = status.get("podIP") or None
    if primary is None or ":" not in primary:
        return primary
    ips = (entry.get("ip") for entry in status.get("podIPs") or () if isinstance(entry, Mapping))
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


def pod_record(pod: Mapping[str, Any], *, container: str | None = None, gpu_resource: str = "nvidia.com/gpu",
               slots_per_host: int | None = None) -> PodRecord:
    """Read one pod, in the API's JSON, into a :class:`PodRecord`."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    worker, worker_status = _container(spec, status, container, gpu_resource)
    annotation = str((meta.get("annotations") or {}).get(SLOTS_ANNOTATION, "")).strip()
    slots: int | None
    if slots_per_host is not None:
        slots = slots_per_host
    elif _gpus(worker, gpu_resource) > 0:
        slots = _gpus(worker, gpu_resource)
    elif annotation:
        slots = _annotated_slots(annotation)
    else:
        slots = 1
    ready = _condition(status, "Ready")
    disrupted = _condition(status, "DisruptionTarget")
    disruption = None
    if disrupted is not None and disrupted.get("status") == "True":
        why = disrupted.get("reason") or "DisruptionTarget"
        disruption = (f"DisruptionTarget: {why}", parse_time(disrupted.get("lastTransitionTime")))
    grace = spec.get("terminationGracePeriodSeconds")
    return PodRecord(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=str(spec.get("nodeName") or ""),
        ip=_address(status),
        phase=str(status.get("phase", "")),
        ready=ready is not None and ready.get("status") == "True",
        restarts=int(worker_status.get("restartCount") or 0),
        slots=slots,
        slots_text=annotation,
        created=str(meta.get("creationTimestamp") or ""),
        deleted_at=parse_time(meta.get("deletionTimestamp")),
        grace_s=float(grace if isinstance(grace, (int, float)) else 30),
        disruption=disruption,
        container=str(worker.get("name") or ""),
    )


def node_record(node: Mapping[str, Any]) -> NodeRecord:
    """Read one node, in the API's JSON, into a :class:`NodeRecord`."""
    spec = node.get("spec") or {}
    taints = tuple(sorted((str(t.get("key", "")), parse_time(t.get("timeAdded")))
                          for t in spec.get("taints") or () if t.get("key")))
    return NodeRecord(str((node.get("metadata") or {}).get("name", "")), taints, bool(spec.get("unschedulable")))


class ClusterView:
    """The pods (by uid) and nodes (by name) the watchers have seen, and the snapshot they make.

    ``drain_taints`` adds the user's taint keys to :data:`DRAIN_TAINTS`. Each
    ``apply``/``replace`` returns whether the snapshot may have changed, so a
    watcher wakes the driver only for news that matters to it. Not thread-safe:
    the provider holds one lock around every call.
    """

    def __init__(self, label: str, *, drain_taints: Iterable[str] = (), container: str | None = None,
                 gpu_resource: str = "nvidia.com/gpu", slots_per_host: int | None = None,
                 drain_soft: bool = False) -> None:
        self.label = label
        self.drain_soft = drain_soft
        #: Raised by every change that may change the snapshot (the provider caches it per version).
        self.version = 0
        self.hard = {**DRAIN_TAINTS, **{key: f"taint {key}" for key in drain_taints if key not in DRAIN_TAINTS}}
        self._read_pod = {"container": container, "gpu_resource": gpu_resource, "slots_per_host": slots_per_host}
        self.pods: dict[str, PodRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self._first_seen: dict[str, float] = {}  # pod uid -> when a disruption without a time was first seen
        self._taint_seen: dict[tuple[str, str], float] = {}  # (node, key) -> when a timeless taint was first seen
        self._once = OnceLog(_log, logging.WARNING)

    # -- feeding -------------------------------------------------------------------------

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> bool:
        """A complete list of pods (a list or a relist): what was not listed is gone."""
        fresh = {}
        for pod in pods:
            record = pod_record(pod, **self._read_pod)
            fresh[record.uid] = record
        changed = fresh != self.pods
        self.pods = fresh
        return self._bump(changed)

    def apply_pod(self, kind: str, pod: Mapping[str, Any]) -> bool:
        """One watch event (``ADDED``, ``MODIFIED`` or ``DELETED``) for a pod."""
        record = pod_record(pod, **self._read_pod)
        if kind == "DELETED":
            return self._bump(self.pods.pop(record.uid, None) is not None)
        changed = self.pods.get(record.uid) != record
        self.pods[record.uid] = record
        return self._bump(changed)

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> bool:
        """A complete list of nodes; True if a node our pods run on changed."""
        fresh = {r.name: r for r in map(node_record, nodes)}
        ours = {p.node for p in self.pods.values()}
        changed = any(fresh.get(n) != self.nodes.get(n) for n in ours)
        self.nodes = fresh
        return self._bump(changed)

    def apply_node(self, kind: str, node: Mapping[str, Any]) -> bool:
        """One watch event for a node; True if one of our pods runs there and its taints or cordon changed."""
        record = node_record(node)
        old = self.nodes.get(record.name)
        if kind == "DELETED":
            self.nodes.pop(record.name, None)
        else:
            self.nodes[record.name] = record
        if old == (None if kind == "DELETED" else record):
            return False
        return self._bump(any(p.node == record.name for p in self.pods.values()))

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
        live = {pod.ip for pod in self.pods.values() if pod.ip and pod.phase == "Running" and pod.deleted_at is None}
        for pod in self.pods.values():
            uids.add(pod.uid)
            if not pod.ip or pod.phase != "Running":
                continue
            if pod.deleted_at is not None and pod.ip in live:
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

    def _verdict(self, pod: PodRecord, now: float) -> Verdict:
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
