"""A fake Kubernetes API server: the pods and nodes the kubernetes provider lists and watches.

Speaks the API's own JSON (https://kubernetes.io/docs/reference/kubernetes-api/):
``GET /api/v1/namespaces/{ns}/pods`` and ``GET /api/v1/nodes``, as lists
(``labelSelector``, ``limit``/``continue`` pages, the list's
``metadata.resourceVersion``) and as watches (``?watch=true&resourceVersion=N``:
a chunked stream of JSON lines ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR,
"object": ...}``, ended at ``timeoutSeconds`` after a ``BOOKMARK`` when
``allowWatchBookmarks`` asks for one). Node taints carry ``timeAdded`` only
when their effect is ``NoExecute``, as on a real cluster. Every change gets the next
resourceVersion and is kept in a history; a watch from a version older than
the history (after :meth:`FakeKubernetes.compact`) gets what the API server
sends for it, an ``ERROR`` event whose Status has code 410 (``Expired``), or with
``gone_as_http`` an HTTP 410. Errors are ``Status`` objects (``kind: Status``,
``reason``, ``code``): 401 without the bearer ``TOKEN``, 403 for what
:meth:`FakeKubernetes.forbid` names, 400 for a selector it cannot parse.
With ``endless_lists``, every list's last page carries a ``continue`` token
back to its first (an API server, or a stranger, whose list never ends).

Tests script pods and nodes with the methods below (add, ready, restart,
disrupt, delete with a grace period, vanish, taint, cordon, an event with a
malformed object: :meth:`FakeKubernetes.send_malformed`), cut every open
watch (:meth:`FakeKubernetes.cut_watches`), refuse new ones for a while
(:meth:`FakeKubernetes.hold_watches`), silence them all
(:meth:`FakeKubernetes.stall_watches`) and count requests with
:meth:`~tests.emulator.httpfake.FakeCloud.count` (a watch is logged as
``<path>?watch``). Not served: field selectors, objects leaving a selector
(the API sends DELETED then; the fake never relabels a pod).
"""

from __future__ import annotations

import base64
import bisect
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.emulator.httpfake import CutStream, FakeCloud, Reply, Request

TOKEN = "k8s-test-token"
SERVICE_ACCOUNT = "system:serviceaccount:ml:cloud-elastic-driver"


def iso(when: float) -> str:
    """Unix seconds as the API writes times (RFC 3339, seconds, UTC)."""
    return datetime.fromtimestamp(int(when), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Pod:
    """One pod as a test scripts it; :meth:`json` renders it as the API does."""

    name: str
    ip: str | None = None
    node: str = "node-a"
    namespace: str = "default"
    labels: dict[str, str] = field(default_factory=lambda: {"app": "llm"})
    annotations: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    phase: str = "Running"
    ready: bool = True
    restarts: int = 0
    grace_s: int = 30
    created: float = 1767225600.0  # 2026-01-01T00:00:00Z
    deletion: float | None = None
    disruption: tuple[str, float] | None = None  # (reason, when)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    version: int = 0

    def json(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                                "resourceVersion": str(self.version), "creationTimestamp": iso(self.created),
                                "labels": dict(self.labels)}
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        if self.deletion is not None:
            meta["deletionTimestamp"] = iso(self.deletion)
            meta["deletionGracePeriodSeconds"] = self.grace_s
        resources: dict[str, Any] = {"requests": {"cpu": "1"}}
        if self.gpus:
            resources["limits"] = {"nvidia.com/gpu": str(self.gpus)}
            resources["requests"]["nvidia.com/gpu"] = str(self.gpus)
        started = iso(self.created + 5)
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": iso(self.created)},
            {"type": "Ready", "status": "True" if self.ready else "False", "lastProbeTime": None,
             "lastTransitionTime": started},
        ]
        if self.disruption is not None:
            reason, when = self.disruption
            conditions.append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                               "lastTransitionTime": iso(when), "reason": reason,
                               "message": f"{reason}: the pod is about to be terminated"})
        running = self.phase == "Running"
        status: dict[str, Any] = {
            "phase": self.phase, "conditions": conditions, "hostIP": "192.168.0.10", "startTime": iso(self.created),
            "qosClass": "Burstable",
            "containerStatuses": [{
                "name": "worker", "ready": self.ready, "restartCount": self.restarts, "started": running,
                "image": "registry.example/llm:1", "imageID": "registry.example/llm@sha256:" + "0" * 64,
                "containerID": f"containerd://{self.uid[:8]}{self.restarts}",
                "state": ({"running": {"startedAt": started}} if running
                          else {"waiting": {"reason": "ContainerCreating"}}),
            }],
        }
        if self.ip:
            status["podIP"] = self.ip
            status["podIPs"] = [{"ip": self.ip}]
        return {
            "kind": "Pod", "apiVersion": "v1", "metadata": meta,
            "spec": {"nodeName": self.node, "terminationGracePeriodSeconds": self.grace_s, "restartPolicy": "Always",
                     "containers": [{"name": "worker", "image": "registry.example/llm:1", "resources": resources}]},
            "status": status,
        }


@dataclass
class Node:
    """One node: its taints (key -> (effect, when added)) and cordon."""

    name: str
    taints: dict[str, tuple[str, float]] = field(default_factory=dict)
    unschedulable: bool = False
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    version: int = 0

    def json(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"providerID": f"aws:///us-east-1a/i-{self.uid[:8]}"}
        # The API server writes timeAdded only for NoExecute taints (the taint manager needs it for
        # tolerationSeconds); a NoSchedule taint, as the node termination handler adds, has none.
        taints = [{"key": k, "effect": e, **({"timeAdded": iso(t)} if e == "NoExecute" else {})}
                  for k, (e, t) in sorted(self.taints.items())]
        if self.unschedulable:
            spec["unschedulable"] = True
            taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
        if taints:
            spec["taints"] = taints
        return {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": self.name, "uid": self.uid, "resourceVersion": str(self.version),
                         "creationTimestamp": iso(1767225600), "labels": {"kubernetes.io/hostname": self.name}},
            "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "lastHeartbeatTime": iso(time.time()), "lastTransitionTime": iso(1767225600)}],
                       "addresses": [{"type": "Hostname", "address": self.name}]},
        }


@pytest.fixture(scope="session")
def kubernetes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator["FakeKubernetes"]:
    """One fake API server for the session, with a kubeconfig for it in ``.kubeconfig``."""
    with FakeKubernetes() as fake:
        fake.kubeconfig = fake.write_kubeconfig(tmp_path_factory.mktemp("kube"))
        yield fake


@pytest.fixture
def kubernetes(kubernetes_server: "FakeKubernetes") -> "FakeKubernetes":
    """The fake API server, its log, faults and refusals cleared."""
    kubernetes_server.reset()
    return kubernetes_server


def kubernetes_options(fake: "FakeKubernetes", namespace: str, selector: str = "app=llm", **extra: str) -> dict:
    """Provider options for pods in ``namespace`` of the fake, through its kubeconfig."""
    return {"selector": selector, "namespace": namespace, "kubeconfig": str(fake.kubeconfig), **extra}


def _status(code: int, reason: str, message: str, kind: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if kind:
        body["details"] = {"kind": kind}
    return body


_REQ = re.compile(r"\s*(?P<neg>!)?\s*(?P<key>[^\s!=(),]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)"
                  r"|\s(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?\s*")


def selector_matcher(selector: str) -> Any:
    """A predicate on labels for ``selector``; ValueError for one the fake cannot parse."""
    tests = []
    for part in re.split(r",(?![^()]*\))", selector) if selector.strip() else ():
        m = _REQ.fullmatch(part)
        if m is None or (m["neg"] and (m["op"] or m["set"])):
            raise ValueError(f"unable to parse requirement: {part.strip()!r}")
        key, op = m["key"], m["op"] or m["set"]
        values = {m["value"]} if m["op"] else {v.strip() for v in (m["values"] or "").split(",")}
        if m["neg"]:
            tests.append(lambda labels, k=key: k not in labels)
        elif op is None:
            tests.append(lambda labels, k=key: k in labels)
        elif op in ("=", "==", "in"):
            tests.append(lambda labels, k=key, v=values: labels.get(k) in v)
        else:
            tests.append(lambda labels, k=key, v=values: labels.get(k) not in v)
    return lambda labels: all(t(labels) for t in tests)


class FakeKubernetes(FakeCloud):
    """The fake API server (see the module docstring). State: ``pods`` ((namespace, name) -> Pod), ``nodes``."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: dict[tuple[str, str], Pod] = {}
        self.nodes: dict[str, Node] = {}
        self.rv = 100
        self.oldest = 0  # a watch from a version below this is answered 410
        self.gone_as_http = False
        self.endless_lists = False
        self.forbidden: set[tuple[str, str | None]] = set()  # (resource, namespace or None for all)
        self._history: list[tuple[int, str, str | None, str, dict]] = []  # (rv, resource, ns, type, object)
        self._versions: list[int] = []
        self._cond = threading.Condition()
        self._cut = 0
        self._held = False
        self._stalled = False
        self._stopping = False
        self.kubeconfig: Path | None = None
        self.route("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods", self._pods)
        self.route("GET", r"/api/v1/nodes", self._nodes)

    # -- scripting -----------------------------------------------------------------------

    def _emit(self, resource: str, kind: str, obj: Pod | Node, edit: Callable[[dict], Any] | None = None) -> None:
        with self._cond:
            self.rv += 1
            obj.version = self.rv
            ns = obj.namespace if isinstance(obj, Pod) else None
            body = obj.json()
            if edit is not None:
                edited = edit(body)
                body = body if edited is None else edited
            self._history.append((self.rv, resource, ns, kind, body))
            self._versions.append(self.rv)
            self._cond.notify_all()

    def add_pod(self, name: str, ip: str | None, **fields: Any) -> Pod:
        pod = Pod(name, ip, **fields)
        with self._cond:
            self.pods[(pod.namespace, name)] = pod
            self._emit("pods", "ADDED", pod)
        return pod

    def change_pod(self, name: str, namespace: str = "default", **fields: Any) -> Pod:
        """Set fields of a pod (``ready=True``, ``ip=...``, ``restarts=1``...) as one MODIFIED event."""
        with self._cond:
            pod = self.pods[(namespace, name)]
            for key, value in fields.items():
                setattr(pod, key, value)
            self._emit("pods", "MODIFIED", pod)
        return pod

    def send_malformed(self, resource: str, name: str, edit: Callable[[dict], Any], namespace: str = "default") -> None:
        """A MODIFIED event for the pod (``resource`` ``pods``) or node ``name`` whose object is its JSON as
        ``edit(json)`` returns it (or leaves it, edited in place, when that returns None): what a broken API server
        or proxy might send. The object itself is unchanged, so its next change sends it readable again; lists
        are unchanged. One whose labels do not read reaches every watch of its kind (and namespace)."""
        with self._cond:
            obj = self.pods[(namespace, name)] if resource == "pods" else self.nodes[name]
            self._emit(resource, "MODIFIED", obj, edit)

    def restart(self, name: str, namespace: str = "default") -> Pod:
        """The worker container restarted (restartCount + 1); the pod keeps its uid and IP."""
        return self.change_pod(name, namespace, restarts=self.pods[(namespace, name)].restarts + 1)

    def disrupt(self, name: str, reason: str = "EvictionByEvictionAPI", when: float | None = None,
                namespace: str = "default") -> Pod:
        """The DisruptionTarget condition, as the eviction API, preemption or the taint manager set it."""
        return self.change_pod(name, namespace, disruption=(reason, time.time() if when is None else when))

    def delete_pod(self, name: str, grace_s: int | None = None, namespace: str = "default") -> Pod:
        """A graceful delete: deletionTimestamp = now + the grace period (the pod stays until it is removed)."""
        pod = self.pods[(namespace, name)]
        grace = pod.grace_s if grace_s is None else grace_s
        return self.change_pod(name, namespace, deletion=time.time() + grace, grace_s=grace)

    def remove_pod(self, name: str, namespace: str = "default") -> None:
        """The pod is gone (DELETED), with no signal before it when nothing else was called."""
        with self._cond:
            pod = self.pods.pop((namespace, name))
            self._emit("pods", "DELETED", pod)

    def add_node(self, name: str, **fields: Any) -> Node:
        node = Node(name, **fields)
        with self._cond:
            self.nodes[name] = node
            self._emit("nodes", "ADDED", node)
        return node

    def taint(self, node: str, key: str, effect: str = "NoSchedule", when: float | None = None) -> None:
        with self._cond:
            self.nodes[node].taints[key] = (effect, time.time() if when is None else when)
            self._emit("nodes", "MODIFIED", self.nodes[node])

    def cordon(self, node: str, on: bool = True) -> None:
        with self._cond:
            self.nodes[node].unschedulable = on
            self._emit("nodes", "MODIFIED", self.nodes[node])

    def touch_node(self, node: str) -> None:
        """A status heartbeat: a MODIFIED event that changes nothing a provider reads."""
        with self._cond:
            self._emit("nodes", "MODIFIED", self.nodes[node])

    def forbid(self, resource: str, namespace: str | None = None) -> None:
        """Answer 403 to lists and watches of ``resource`` (in ``namespace``, or anywhere)."""
        self.forbidden.add((resource, namespace))

    def compact(self) -> None:
        """Forget the history: a watch from any version before now is answered 410 Gone."""
        with self._cond:
            self.oldest = self.rv
            self._history.clear()
            self._versions.clear()

    def cut_watches(self) -> None:
        """Drop every open watch connection mid-stream."""
        with self._cond:
            self._cut += 1
            self._cond.notify_all()

    def hold_watches(self, on: bool) -> None:
        """While held, new watches are answered 503 (and open ones are cut)."""
        with self._cond:
            self._held = on
            if on:
                self._cut += 1
            self._cond.notify_all()

    def stall_watches(self, on: bool) -> None:
        """While stalled, watches get nothing, as over a path that stopped forwarding (no reset, no bytes): open
        ones send no event, bookmark or end, new ones no answer. Ending the stall drops the silent ones."""
        with self._cond:
            self._stalled = on
            if not on:
                self._cut += 1
            self._cond.notify_all()

    def reset(self) -> None:
        """Forget the log, faults, refusals and held or cut watches; pods and nodes stay (tests use their own
        namespaces and node names, so a session's tests share one server)."""
        super().reset()
        with self._cond:
            self.forbidden.clear()
            self.gone_as_http = False
            self.endless_lists = False
            self._held = False
            self._stalled = False
            self._cut += 1
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        super().stop()

    def write_kubeconfig(self, directory: Path, *, namespace: str = "default", token: str = TOKEN) -> Path:
        """A kubeconfig whose current context is this server, with a bearer token."""
        path = Path(directory) / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "driver", "user": {"token": token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "driver", "namespace": namespace}}],
        }))
        return path

    # -- serving -------------------------------------------------------------------------

    def describe(self, request: Request) -> str:
        return request.path + ("?watch" if _true(request.query.get("watch")) else "")

    def authorize(self, request: Request) -> Reply | None:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return Reply(401, _status(401, "Unauthorized", "Unauthorized"))
        return None

    def not_found(self, message: str) -> Reply:
        return Reply(404, _status(404, "NotFound", message))

    def _pods(self, request: Request) -> Reply:
        return self._serve(request, "pods", request.params["ns"])

    def _nodes(self, request: Request) -> Reply:
        return self._serve(request, "nodes", None)

    def _serve(self, request: Request, resource: str, ns: str | None) -> Reply:
        watch = _true(request.query.get("watch"))
        if (resource, ns) in self.forbidden or (resource, None) in self.forbidden:
            verb = "watch" if watch else "list"
            where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
            return Reply(403, _status(403, "Forbidden", f'{resource} is forbidden: User "{SERVICE_ACCOUNT}" cannot '
                                      f'{verb} resource "{resource}" in API group ""{where}', resource))
        try:
            match = selector_matcher(request.query.get("labelSelector", ""))
        except ValueError as exc:
            return Reply(400, _status(400, "BadRequest", str(exc)))
        if watch:
            return self._watch(request, resource, ns, match)
        with self._cond:
            table = self.pods.values() if resource == "pods" else self.nodes.values()
            items = sorted((o for o in table if resource == "nodes" and match(o.json()["metadata"]["labels"])
                            or resource == "pods" and o.namespace == ns and match(o.labels)), key=lambda o: o.name)
            version = self.rv
            token = request.query.get("continue")
            start = json.loads(base64.b64decode(token))["start"] if token else 0
            limit = int(request.query.get("limit") or 0) or len(items) or 1
            page = [o.json() for o in items[start:start + limit]]
        for obj in page:  # items of a list carry no kind or apiVersion
            obj.pop("kind")
            obj.pop("apiVersion")
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if start + limit < len(items) or self.endless_lists:
            after = start + limit if start + limit < len(items) else 0
            meta["continue"] = base64.b64encode(json.dumps({"start": after}).encode()).decode()
        kind = "PodList" if resource == "pods" else "NodeList"
        return Reply(200, {"kind": kind, "apiVersion": "v1", "metadata": meta, "items": page})

    def _watch(self, request: Request, resource: str, ns: str | None, match: Any) -> Reply:
        since = int(request.query.get("resourceVersion") or 0)
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        with self._cond:
            while self._stalled and not self._stopping:  # no answer: the client's read timeout must end it
                self._cond.wait()
            if self._held:
                return Reply(503, _status(503, "ServiceUnavailable", "the server is currently unable to handle "
                                          "the request"))
            expired = since < self.oldest
            generation = self._cut
        if expired and self.gone_as_http:
            return Reply(410, _status(410, "Expired", f"too old resource version: {since} ({self.oldest})"))
        return Reply(200, stream=self._events(resource, ns, match, since, expired, generation, timeout,
                                              _true(request.query.get("allowWatchBookmarks"))))

    def _events(self, resource: str, ns: str | None, match: Any, since: int, expired: bool, generation: int,
                timeout: float, bookmarks: bool) -> Iterator[bytes]:
        if expired:
            yield _line({"type": "ERROR", "object": _status(410, "Expired",
                                                            f"too old resource version: {since} ({self.oldest})")})
            return
        deadline = time.monotonic() + timeout
        position = since
        while True:
            with self._cond:
                while True:
                    if self._cut != generation or self._stopping:
                        raise CutStream()
                    if self._stalled:
                        self._cond.wait()
                        continue
                    index = bisect.bisect_right(self._versions, position)
                    fresh = self._history[index:]
                    if fresh or time.monotonic() >= deadline:
                        break
                    self._cond.wait(min(1.0, max(0.01, deadline - time.monotonic())))
                position = self.rv
            for rv, kind_of, where, kind, obj in fresh:
                meta = obj.get("metadata") if isinstance(obj, dict) else None
                labels = meta.get("labels") or {} if isinstance(meta, dict) else None
                if kind_of == resource and (ns is None or where == ns) and (not isinstance(labels, dict)
                                                                            or match(labels)):
                    yield _line({"type": kind, "object": obj})
            if not fresh:  # the watch's timeoutSeconds: a bookmark, then the end of the stream
                if bookmarks:
                    kind = "Pod" if resource == "pods" else "Node"
                    yield _line({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": "v1",
                                                                "metadata": {"resourceVersion": str(position)}}})
                return


def _true(value: str | None) -> bool:
    """A query flag as the API server reads it (Go's strconv.ParseBool; the Python client sends ``True``)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _line(event: dict) -> bytes:
    return json.dumps(event).encode() + b"\n"
