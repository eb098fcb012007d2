"""Kubernetes discovery (``--k8s-selector app=llm``): pods as hosts, cluster signals as drains.

The provider **watches** instead of polling: its first :meth:`~KubernetesPods.find`
lists the pods that match ``selector`` in ``namespace`` and every node (pages
of 500); from the next find(), or as soon as the driver asks for news, two
daemon threads watch them from the lists' ``resourceVersion``
(:mod:`cloud_elastic.providers.kubernetes_watch`: relist on ``410 Gone``,
reconnect with back-off; a one-shot ``cloud-elastic discover`` starts none).
Each find() after the first answers from the in-memory
view, a complete snapshot built by :mod:`cloud_elastic.providers.kubernetes_view`
(which holds the table of what each pod and node state means), and costs no
request. A watch event that changes the snapshot wakes the driver's poller
(:meth:`~KubernetesPods.wake_on_news`), so a signal reaches the driver within
one event, not at the next ``--discovery-interval``.

A host is a pod that is ``Running`` and ``Ready``, at its pod IP; workers are
started in it over SSH (the driver needs no ``kubectl``). Slots: the worker
container's ``nvidia.com/gpu`` limit (``gpu_resource``), else the pod's
``cloud-elastic.io/slots`` annotation, else 1; ``--slots-per-host`` wins.

Signals (see the view's table): ``deletionTimestamp`` and the
``DisruptionTarget`` condition drain the pod, with the deletion time (or the
condition's time + ``terminationGracePeriodSeconds``) as the deadline; the
termination taints of Karpenter, the AWS node termination handler and GKE,
and any key in ``drain_taints``, drain every pod of the node; a cordon and the
termination handler's rebalance-recommendation taint are soft notices (drains
with ``drain_on_rebalance`` or ``--drain-on-rebalance``).

Credentials: ``kubeconfig`` (a path; ``context`` picks a context), else the
pod's service account when running in a cluster (``KUBERNETES_SERVICE_HOST``),
else ``$KUBECONFIG`` or ``~/.kube/config``. Errors at the first find() are
one line: a refused selector (400/422), pods that may not be listed (403),
bad credentials (401) or an unreadable kubeconfig are fatal; an unreachable
API server, 429 and 5xx are retryable. Nodes that may not be read (403) are
not fatal: one warning, and the job goes on without node signals (pod signals
still work) while the nodes list is retried, with the watches' back-off (0.5 s
doubling to 30 s), for the job's life: RBAC granted later (an RBAC cache that
lagged the apply, a binding fixed) turns them on. A pod or node of the wrong
shape (a field of a type the API never
sends) is one warning naming it and the field, and is left out; a list page of
the wrong shape is retryable, in one line naming the field. Of an error answer
(not 2xx) to a list or a watch, at most 64 KiB of the body is read
(:class:`~cloud_elastic.providers.kubernetes_stream.BoundedErrors`), within
``timeout_s``: the client would read all of it, however large. A list is
bounded (see the watch module): more than
``MAX_HOSTS`` objects, 100 pages or a 64 MiB page is fatal (a cluster of more
nodes than that needs ``node_selector``, and the error says so), one that has
not ended within 6 × ``timeout_s`` on the wall clock is retryable.
The client's urllib3 retries nothing: a 429 or 503 with ``Retry-After`` is
waited for here, at most 30 s (a first list is not asked again before then,
a watch reconnects after it), and the error says so.

Staleness: later, a pods watch down for ``stale_after_s`` (30 s) makes find()
raise RetryableDiscoveryError until it is back. A watch that fails (cut,
refused, 5xx) is down from the failure; the outage ends when a stream shows
it is healthy (an event, a bookmark, a proper end) or a relist succeeds, not
at a 200, so a watch accepted and then failed (an ``ERROR`` event, a cut
after the headers) goes on from the first failure instead of restarting the
clock at each retry. Three watches in a row ended with nothing in
them before their timeout (a proxy that will not hold one) are an outage from the first, warned
once. One that goes silent (a stalled path:
no reset, no bytes) is down from its last word (event, bookmark, end of
stream) once nothing has come for ``watch_s`` + 10 s, failed or not: each
watch asks for bookmarks and lasts ``watch_s`` (30 s), so the server always
writes within it. A quiet cluster's last word can be 28 s old when a healthy
watch is cut, so a short reconnect is not an outage. A reconnect the server accepts hides the outage only when it follows the
outage's first failure, and that failure was not the end of a silence: a
healthy reconnected stream on a quiet cluster says nothing until its
bookmark, so it is only called down ``watch_s`` + 10 s after it was answered
(then from the failure). Any later reconnect leaves the outage reported until
a stream shows it is healthy. So, with the defaults, a change (a deletion, a
taint) that the view misses is either seen or reported as an error within
40 s of the last word when the path stalls, and at worst about 81 s: a
failure after nearly 40 s of silence, a reconnect 0.5 s (+ 25% jitter) later
that is accepted and then silent for 40 s; plus one
``--discovery-interval``: inside a pod's grace period. TCP keepalive
on the client's sockets (15 s idle, 3 probes 5 s apart) fails a read on a
peer that is gone within 30 s. A stream that is never quiet but never
useful counts the same: one still open ``watch_s`` + 10 s after it opened
(a trickle of blank lines resets any read timeout) is cut as a failure, and
an answer that is not a watch event (a List from a proxy that drops
``?watch=true``) is a failure with one WARNING.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Mapping

from cloud_elastic.errors import ConfigError, DiscoveryError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers._common import CloudGroupProvider, OptionReader, error_for_status, one_line
from cloud_elastic.providers.api import DiscoveredHosts, ProviderOption, parse_bool
from cloud_elastic.providers.kubernetes_stream import BoundedErrors, retry_after
from cloud_elastic.providers.kubernetes_view import ClusterView
from cloud_elastic.providers.kubernetes_watch import LIST_TIMEOUTS, ListTooLarge, ResourceWatch, keepalive_options

__all__ = ["KubernetesPods", "check_selector"]

_log = logging.getLogger(__name__)

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: Beyond the first find()'s two lists' bounds, for connecting and building the view (find_limit_s).
_LIST_MARGIN_S = 5.0
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}")
_VALUE = re.compile(rf"({_NAME})?")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_REQUIREMENT = re.compile(r"\s*(?P<key>[^\s!=(),]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)"
                          r"|\s(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?\s*")


def check_selector(selector: str, flag: str = "--k8s-selector") -> None:
    """Refuse a label selector the API server would refuse, with one line (ConfigError).

    The grammar of ``kubectl get -l``: requirements separated by commas, each
    ``key``, ``!key``, ``key=value``, ``key==value``, ``key!=value``,
    ``key in (a,b)`` or ``key notin (a,b)``; keys are ``[prefix/]name``, names
    and values at most 63 characters of ``[A-Za-z0-9-_.]``, starting and
    ending alphanumeric.
    """
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{flag} {selector!r} is not a label selector: {why} "
                           "(e.g. app=llm, or app in (llm,llm-spot),tier!=cpu)")

    if not selector.strip():
        raise bad("it is empty")
    for part in re.split(r",(?![^()]*\))", selector):
        text = part.strip()
        if text.startswith("!"):
            if not _KEY.fullmatch(text[1:].strip()):
                raise bad(f"{text!r} is not '!key'")
            continue
        match = _REQUIREMENT.fullmatch(text)
        if match is None or not text:
            raise bad(f"cannot read {text!r}")
        if not _KEY.fullmatch(match["key"]):
            raise bad(f"{match['key']!r} is not a label key")
        values = [match["value"]] if match["op"] else [v.strip() for v in (match["values"] or "").split(",")] \
            if match["set"] else []
        if match["set"] and not any(values):
            raise bad(f"{text!r} lists no values")
        for value in values:
            if value is not None and not _VALUE.fullmatch(value):
                raise bad(f"{value!r} is not a label value")


class KubernetesPods(CloudGroupProvider):
    """Running, Ready pods that match a label selector, and the pods the cluster is taking away."""

    name = "kubernetes"
    description = "pods matching a label selector (--k8s-selector), watched; needs cloud-elastic[kubernetes]"
    requires = ("kubernetes",)
    extra = "kubernetes"
    sdk_package = "kubernetes"
    sdk_modules = {"client": "kubernetes.client", "config": "kubernetes.config",
                   "urllib3": "urllib3"}
    options = (
        ProviderOption("selector", "label selector of the worker pods, e.g. app=llm", required=True),
        ProviderOption("namespace", "namespace of the pods (default: the kubeconfig context's, in a pod the "
                       "service account's, else 'default')"),
        ProviderOption("kubeconfig", "kubeconfig file (default: the service account in a pod, else $KUBECONFIG "
                       "or ~/.kube/config)"),
        ProviderOption("context", "kubeconfig context (default: its current-context)"),
        ProviderOption("drain_taints", "more node taint keys that drain a node's pods, comma-separated "
                       "(--k8s-drain-taint, repeatable)"),
        ProviderOption("drain_on_rebalance", "drain on a cordon or a rebalance-recommendation taint instead of "
                       "only keeping new workers off", default="false"),
        ProviderOption("container", "the container workers run in: its GPU limit and restarts count (default: "
                       "the one with a gpu_resource limit, else the one named 'worker', else the pod's first)"),
        ProviderOption("gpu_resource", "the resource whose limit gives a pod's slots", default="nvidia.com/gpu"),
        ProviderOption("node_selector", "label selector of the nodes to watch (default: all nodes)"),
        ProviderOption("timeout_s", "connect/read timeout of one list request, seconds", default="10"),
        ProviderOption("watch_s", "how long one watch request lasts before it is renewed, seconds; a watch silent "
                       "for this + 10 s is down", default="30"),
        ProviderOption("stale_after_s", "a pods watch down (failed, or silent past watch_s + 10 s) this long "
                       "makes discovery fail (retryable), seconds", default="30"),
    )

    def __init__(self, selector: str, *, namespace: str | None = None, kubeconfig: str | None = None,
                 context: str | None = None, drain_taints: tuple[str, ...] = (), drain_on_rebalance: bool = False,
                 container: str | None = None, gpu_resource: str = "nvidia.com/gpu",
                 node_selector: str | None = None, timeout_s: float = 10.0, watch_s: float = 30.0,
                 stale_after_s: float = 30.0, slots_per_host: int | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.selector = selector
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.context = context
        self.node_selector = node_selector
        self.timeout_s = timeout_s
        self.watch_s = watch_s
        self.stale_after_s = stale_after_s
        self.label = f"kubernetes pods {selector!r}"
        self._clock = clock
        self._lock = threading.Lock()
        self._view = ClusterView(self.label, drain_taints=drain_taints, container=container,
                                 gpu_resource=gpu_resource, slots_per_host=slots_per_host,
                                 drain_soft=drain_on_rebalance, nodes_selected=bool(node_selector))
        self._api: Any = None
        self._watches: list[ResourceWatch] = []
        self._watching = False
        self._wake: Callable[[], None] | None = None
        self._cached: tuple[int, DiscoveredHosts] | None = None
        self._nodes_refused = False
        self._nodes_warned: float | None = None  # when the nodes watch outage last warned about began
        #: A first list answered 429/503 with Retry-After: (not before this time.monotonic(), its error) .
        self._throttled: tuple[float, DiscoveryError] | None = None
        self._server = ""

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "KubernetesPods":
        read = OptionReader(cls, options)
        selector = read.text("selector") or ""
        check_selector(selector)
        node_selector = read.text("node_selector")
        if node_selector:
            check_selector(node_selector, "-o node_selector")
        namespace = read.text("namespace")
        if namespace is not None and not _NAMESPACE.fullmatch(namespace):
            raise ConfigError(f"--k8s-namespace {namespace!r} is not a namespace name (lower-case letters, digits "
                              "and '-', at most 63)")
        taints = tuple(t.strip() for t in (read.text("drain_taints") or "").split(",") if t.strip())
        for taint in taints:
            if not re.fullmatch(_KEY.pattern, taint):
                raise ConfigError(f"--k8s-drain-taint {taint!r} is not a taint key ([prefix/]name)")
        return cls(
            selector, namespace=namespace, kubeconfig=read.text("kubeconfig"), context=read.text("context"),
            drain_taints=taints,
            drain_on_rebalance=parse_bool("drain_on_rebalance", read.text("drain_on_rebalance") or "false"),
            container=read.text("container"), gpu_resource=read.text("gpu_resource") or "nvidia.com/gpu",
            node_selector=node_selector, timeout_s=read.seconds("timeout_s"), watch_s=read.seconds("watch_s"),
            stale_after_s=read.seconds("stale_after_s"), slots_per_host=slots_per_host,
        )

    # -- the client ----------------------------------------------------------------------

    def _connect(self) -> Any:
        """Build the API client from the kubeconfig or the service account; learn the namespace."""
        client, config = self.sdk["client"], self.sdk["config"]
        cfg = client.Configuration()
        in_cluster = not self.kubeconfig and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        try:
            if in_cluster:
                config.load_incluster_config(client_configuration=cfg)
                namespace = _read(_SA_NAMESPACE)
            else:
                path = self.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
                if self.kubeconfig and not os.path.exists(self.kubeconfig):
                    raise FatalDiscoveryError(f"{self.label}: the kubeconfig {self.kubeconfig} (--kubeconfig) does "
                                              "not exist")
                if not self.kubeconfig and not os.environ.get("KUBECONFIG") and not os.path.exists(path):
                    raise FatalDiscoveryError(f"{self.label}: no Kubernetes credentials: not in a pod "
                                              f"(KUBERNETES_SERVICE_HOST unset) and no kubeconfig at {path}; "
                                              "pass --kubeconfig PATH")
                config.load_kube_config(config_file=path, context=self.context, client_configuration=cfg,
                                        persist_config=False)
                namespace = self._context_namespace(config, path)
        except config.ConfigException as exc:
            where = "the service account" if in_cluster else (self.kubeconfig or "the kubeconfig")
            raise FatalDiscoveryError(f"{self.label}: cannot load {where}: {one_line(exc)}") from exc
        if self.namespace is None:
            self.namespace = namespace or "default"
        cfg.socket_options = keepalive_options(self.sdk["urllib3"].connection.HTTPConnection.default_socket_options)
        # No retries inside urllib3: its default Retry(3) slept a 429's Retry-After (an hour, if asked) where stop()
        # cannot end it, reported it as a stalled connection, and made one timeout_s four. The watches back off
        # and honour Retry-After themselves (within 30 s), and find() is retried by the driver's poller.
        cfg.retries = self.sdk["urllib3"].Retry(total=0, redirect=0, respect_retry_after_header=False)
        self._server = cfg.host
        api = client.ApiClient(cfg)
        api.rest_client.pool_manager = BoundedErrors(api.rest_client.pool_manager, self.timeout_s)
        return api

    def _context_namespace(self, config: Any, path: str) -> str | None:
        try:
            contexts, active = config.list_kube_config_contexts(config_file=path)
        except Exception:  # the loader above already read it; a namespace is only a default
            return None
        chosen = next((c for c in contexts or () if c.get("name") == self.context), None) if self.context else active
        return ((chosen or {}).get("context") or {}).get("namespace")

    # -- discovery -----------------------------------------------------------------------

    def _discover(self) -> DiscoveredHosts:
        if self._api is None:
            if self._throttled is not None and time.monotonic() < self._throttled[0]:
                raise self._throttled[1]  # the server asked for a wait: not asked again before it ends
            self._first_sync()
        else:
            self._watch()
            self._check_watches()
        with self._lock:
            version = self._view.version
            if self._cached is None or self._cached[0] != version:
                self._cached = (version, self._view.snapshot(self._clock()))
            return self._cached[1]

    def _first_sync(self) -> None:
        """List pods and nodes; on any failure nothing is kept, so the next find() starts over."""
        try:
            self._list_first()
        except BaseException:
            self._disconnect()
            self._nodes_refused = False
            raise

    def _list_first(self) -> None:
        self._api = self._connect()
        core = self.sdk["client"].CoreV1Api(self._api)
        pods = ResourceWatch(
            "pods", lambda **kw: core.list_namespaced_pod(self.namespace, **kw), replace=self._view.replace_pods,
            apply=self._view.apply_pod, lock=self._lock, on_news=self._news, selector=self.selector,
            timeout_s=self.timeout_s, watch_s=self.watch_s, narrow="narrow --k8s-selector",
            read=lambda objs: self._view.read("pod", objs))
        try:
            pods.sync()
        except Exception as exc:
            raise self._first_error(exc, "pods") from exc
        self._watches = [pods]
        nodes = ResourceWatch(
            "nodes", core.list_node, replace=self._view.replace_nodes, apply=self._view.apply_node,
            lock=self._lock, on_news=self._news, selector=self.node_selector, timeout_s=self.timeout_s,
            read=lambda objs: self._view.read("node", objs), watch_s=self.watch_s, narrow="-o node_selector=LABELS watches only the nodes it selects, e.g. the "
            "workers' node pool" if not self.node_selector else "narrow -o node_selector")
        try:
            nodes.sync()
        except Exception as exc:
            if getattr(exc, "status", None) != 403:
                raise self._first_error(exc, "nodes") from exc
            self._nodes_refused = True
            # Its thread lists again with back-off until a list succeeds (start()): one warning for this outage.
            self._nodes_warned = nodes.refused(f"may not list nodes: 403 {_message(exc)}")
            _log.warning("%s: may not list nodes (403 %s); going on without node signals (taints, cordons) until "
                         "a list succeeds (it will be retried with back-off, up to every 30 s, for the job's life): "
                         "pod signals (DisruptionTarget, deletion) still drain. Grant list and watch on nodes (a "
                         "ClusterRole) to see them", self.label, _message(exc))
        self._watches.append(nodes)
        _log.log(logging.INFO if self._view.pods else logging.WARNING,
                 "%s: %d pod(s) match in namespace %s%s, %s", self.label, len(self._view.pods), self.namespace,
                 "" if self._view.pods else " (yet: waiting for them)",
                 "node signals off" if self._nodes_refused else f"{len(self._view.nodes)} node(s)")

    def _watch(self) -> None:
        """Start the watches, from the first lists' versions (once: at the second find() or wake_on_news()).

        Not at the first find(): ``cloud-elastic discover`` makes one and closes, and needs no thread.
        Nothing is missed meanwhile: the watches start from the lists' resourceVersion.
        """
        if self._watching or self._api is None:
            return
        self._watching = True
        for watch in self._watches:
            watch.start()
        _log.debug("%s: watching %s", self.label, ", ".join(w.what for w in self._watches))

    def _first_error(self, exc: Exception, what: str) -> DiscoveryError:
        status = getattr(exc, "status", None)
        message = _message(exc)
        if isinstance(exc, ListTooLarge):
            return FatalDiscoveryError(f"{self.label}: {exc}")
        if status == 403:
            where = f"in namespace {self.namespace!r}" if what == "pods" else "(cluster-scoped)"
            return FatalDiscoveryError(f"{self.label}: may not list {what} {where}: {message} (the driver needs list "
                                       f"and watch on {what}; see docs/providers.md)")
        if status == 401:
            return FatalDiscoveryError(f"{self.label}: the API server {self._server} refused the credentials "
                                       f"(401 Unauthorized): {message}")
        if status in (400, 422):
            return FatalDiscoveryError(f"{self.label}: the API server refused the {what} query: {message}")
        if status == 410:  # a list's continue token expired (etcd compacted): a new list starts over, as a watch's does
            return RetryableDiscoveryError(f"{self.label}: listing {what}: HTTP 410 {message} (the list is started "
                                           "over)")
        asked = retry_after(exc)
        if asked is not None:  # the client's urllib3 no longer sleeps it (retries=0, see _connect): we wait here
            error = RetryableDiscoveryError(f"{self.label}: listing {what}: HTTP {status} {message} (throttled: the "
                                            f"API server asks to retry after {asked[0]:g} s; asked again in "
                                            f"{asked[1]:g} s)")
            self._throttled = (time.monotonic() + asked[1], error)
            return error
        if status is not None:
            return error_for_status(status, f"{self.label}: listing {what}: HTTP {status} {message}")
        translated = self._translate(exc, self.sdk)
        return translated if translated is not None else RetryableDiscoveryError(f"{self.label}: {one_line(exc)}")

    def _check_watches(self) -> None:
        """A pods watch down past ``stale_after_s`` fails discovery (retryable): the view may be stale.

        A nodes watch down that long costs only node signals (pods still come and go, and pod signals
        still drain), so it is one warning per outage, not a failed discovery.
        """
        now = time.time()
        for watch in self._watches:
            trouble = watch.trouble()
            if trouble is None or now - trouble[0] < self.stale_after_s:
                if watch.what == "nodes" and trouble is None:
                    self._nodes_warned = None
                continue
            if watch.what == "pods":  # a message the same at every call of an outage: one line, not one a call
                since = time.strftime("%H:%M:%S UTC", time.gmtime(trouble[0]))
                raise RetryableDiscoveryError(f"{self.label}: the pods watch has been down for over "
                                              f"{self.stale_after_s:g} s, since {since}: {trouble[1]}")
            if self._nodes_warned != trouble[0]:
                self._nodes_warned = trouble[0]
                _log.warning("%s: the nodes watch has been down for %.0f s (%s); node signals (taints, cordons) "
                             "are not seen until it is back", self.label, now - trouble[0], trouble[1])

    def _news(self) -> None:
        wake = self._wake
        if wake is not None:
            wake()

    def _translate(self, exc: Exception, sdk: Mapping[str, Any]) -> DiscoveryError | None:
        urllib3 = sdk["urllib3"]
        if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
            return RetryableDiscoveryError(f"{self.label}: cannot reach the API server {self._server}: "
                                           f"{one_line(exc)}")
        status = getattr(exc, "status", None)
        if isinstance(exc, sdk["client"].ApiException) and status is not None:
            return error_for_status(status, f"{self.label}: HTTP {status} {_message(exc)}")
        return None

    def find_limit_s(self, timeout_s: float) -> float:
        """The first find() lists pods, then nodes, each within ``LIST_TIMEOUTS`` x ``-o timeout_s`` (60 s at the
        default), so the driver waits for both (a review's cluster of 1,600 nodes on a slow API server listed in
        32 s, past the 30 s of --discovery-timeout: "gave no answer" at start while the list went on). Later ones
        read the watches' cache at once."""
        return 2 * LIST_TIMEOUTS * self.timeout_s + _LIST_MARGIN_S

    def wake_on_news(self, wake: Callable[[], None]) -> None:
        """Wake the driver's poller whenever a watch event changes the snapshot (from the watch threads).

        Starts the watches now if a find() has succeeded (else at the next find()).
        """
        self._wake = wake
        self._watch()

    def close(self) -> None:
        self._wake = None
        self._disconnect()

    def _disconnect(self) -> None:
        for watch in self._watches:
            watch.stop()
        self._watches = []
        self._watching = False
        if self._api is not None:
            try:
                self._api.close()
            except Exception:  # a pool already gone; nothing left to release
                pass
            self._api = None

    @property
    def watches(self) -> tuple[ResourceWatch, ...]:
        """The watches that have listed (pods, then nodes once a list of them succeeded), for tests and
        benchmarks."""
        return tuple(w for w in self._watches if w.lists)


def _message(exc: BaseException) -> str:
    """The API's own message (a Status body's ``message``), else the exception's, on one line."""
    body = getattr(exc, "body", None)
    if body:
        try:
            return one_line(json.loads(body).get("message") or body)
        except (ValueError, AttributeError):
            return one_line(body)
    return one_line(getattr(exc, "reason", None) or exc)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None
