"""The kubernetes provider through the real ``kubernetes`` client, over HTTP, against the fake API server.

Each test uses a namespace and node names of its own on the session's fake
(``fake_kubernetes.py``). Changes after the first find() reach the provider
through its watches only; the tests wait for the provider's wake-up call (what
the driver's poller waits for), never for a fixed time.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from cloud_elastic.driver.job.hosts import Blacklist, HostManager, Slot
from cloud_elastic.errors import ConfigError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers._common import parse_time
from cloud_elastic.providers.api import DiscoveredHosts, Drain
from tests.emulator.fake_kubernetes import Node, Pod, kubernetes, kubernetes_options, kubernetes_server  # noqa: F401
from tests.emulator.fixtures import provider

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(60)]


class Watched:
    """A provider after its first find(), with the driver's wake-up call recorded."""

    def __init__(self, fake, namespace: str, **extra: str) -> None:
        self.discovery = provider("kubernetes", kubernetes_options(fake, namespace, **extra))
        self.first = self.discovery.find()
        self._woken = threading.Condition()
        self._wakes = 0
        self.discovery.wake_on_news(self._wake)

    def _wake(self) -> None:
        with self._woken:
            self._wakes += 1
            self._woken.notify_all()

    def until(self, predicate, timeout: float = 15.0) -> DiscoveredHosts:
        """The first snapshot for which ``predicate`` holds, taken after each wake-up."""
        deadline = time.monotonic() + timeout
        while True:
            snapshot = self.discovery.find()
            if predicate(snapshot):
                return snapshot
            with self._woken:
                seen = self._wakes
                while self._wakes == seen:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise AssertionError(f"no such snapshot within {timeout}s; last: {snapshot}")
                    self._woken.wait(left)

    def close(self) -> None:
        self.discovery.close()


@pytest.fixture
def watched(kubernetes):
    made: list[Watched] = []

    def make(namespace: str, **extra: str) -> Watched:
        made.append(Watched(kubernetes, namespace, **extra))
        return made[-1]

    yield make
    for w in made:
        w.close()


def test_ready_running_pods_are_hosts_at_their_ip_with_their_gpus_or_annotated_slots(kubernetes, watched):
    ns = "ns-ready"
    kubernetes.add_node("ready-n1")
    kubernetes.add_pod("gpu", "10.60.0.1", namespace=ns, node="ready-n1", gpus=4, created=100.0)
    kubernetes.add_pod("cpu", "10.60.0.2", namespace=ns, node="ready-n1", annotations={"cloud-elastic.io/slots": "2"},
                       created=200.0)
    kubernetes.add_pod("plain", "10.60.0.3", namespace=ns, node="ready-n1", created=300.0)
    kubernetes.add_pod("starting", "10.60.0.4", namespace=ns, node="ready-n1", ready=False)
    kubernetes.add_pod("no-ip-yet", None, namespace=ns, node="ready-n1", phase="Pending", ready=False)
    kubernetes.add_pod("other-app", "10.60.0.5", namespace=ns, node="ready-n1", labels={"app": "web"})
    kubernetes.add_pod("finished", "10.60.0.6", namespace=ns, node="ready-n1", phase="Succeeded", ready=False)
    w = watched(ns)
    assert dict(w.first.ready) == {"10.60.0.1": 4, "10.60.0.2": 2, "10.60.0.3": 1}
    assert list(w.first.ready) == ["10.60.0.1", "10.60.0.2", "10.60.0.3"]  # oldest pod first
    assert not w.first.draining and not w.first.soft

    # The pending pod gets its IP and becomes Ready: it joins through the watch alone.
    kubernetes.change_pod("no-ip-yet", ns, ip="10.60.0.7", phase="Running")
    assert "10.60.0.7" not in w.until(lambda s: True).ready  # running, not ready yet: not a host
    kubernetes.change_pod("no-ip-yet", ns, ready=True)
    snapshot = w.until(lambda s: "10.60.0.7" in s.ready)
    assert snapshot.ready["10.60.0.7"] == 1
    lists = kubernetes.count(f"/namespaces/{ns}/pods$")
    assert lists == 1, "after the first list, changes come from the watch"


def test_each_cluster_signal_drains_with_its_deadline_and_reason(kubernetes, watched):
    ns = "ns-signals"
    hard = ["karpenter.sh/disrupted", "aws-node-termination-handler/spot-itn",
            "aws-node-termination-handler/asg-lifecycle-termination",
            "aws-node-termination-handler/scheduled-maintenance", "cloud.google.com/impending-node-termination",
            "example.com/going-away"]
    soft = ["aws-node-termination-handler/rebalance-recommendation", "cordon"]
    for i, _ in enumerate(hard + soft):
        kubernetes.add_node(f"sig-n{i}")
        kubernetes.add_pod(f"p{i}", f"10.61.0.{i + 1}", namespace=ns, node=f"sig-n{i}", created=float(i))
    kubernetes.add_node("sig-pods")
    kubernetes.add_pod("deleted", "10.61.1.1", namespace=ns, node="sig-pods", created=50.0)
    kubernetes.add_pod("evicted", "10.61.1.2", namespace=ns, node="sig-pods", grace_s=45, created=51.0)
    kubernetes.add_node("sig-spot-noexecute")
    kubernetes.add_pod("spot-ne", "10.61.1.3", namespace=ns, node="sig-spot-noexecute", created=52.0)
    w = watched(ns, drain_taints="example.com/going-away")
    assert len(w.first.ready) == len(hard) + len(soft) + 3

    added = time.time() - 3
    for i, key in enumerate(hard + soft):
        if key == "cordon":
            kubernetes.cordon(f"sig-n{i}")
        else:
            kubernetes.taint(f"sig-n{i}", key, when=added)
    kubernetes.taint("sig-spot-noexecute", "aws-node-termination-handler/spot-itn", "NoExecute", when=added)
    deleted = kubernetes.delete_pod("deleted", grace_s=10, namespace=ns).deletion
    kubernetes.disrupt("evicted", "PreemptionByScheduler", when=1767225700.0, namespace=ns)
    snapshot = w.until(lambda s: len(s.draining) == len(hard) + 3 and len(s.soft) == len(soft))
    seen = time.time()

    assert snapshot.draining["10.61.1.1"] == Drain(float(int(deleted)), "pod deleted")
    assert snapshot.draining["10.61.1.2"] == Drain(1767225700.0 + 45, "DisruptionTarget: PreemptionByScheduler")
    # The termination handler's taint is NoSchedule, so the API gives it no timeAdded: its two minutes count from
    # when the provider saw it. A NoExecute one (the handler's taintEffect option) carries its own time.
    spot = snapshot.draining["10.61.0.2"]
    assert added + 120 < spot.deadline <= seen + 120 and "spot interruption" in spot.reason
    assert snapshot.draining["10.61.1.3"].deadline == float(int(added)) + 120
    for i, key in enumerate(hard):
        drain = snapshot.draining[f"10.61.0.{i + 1}"]
        assert drain.reason.startswith(f"node sig-n{i}: ")
        assert drain.deadline is None or key.endswith("spot-itn")
    assert snapshot.draining["10.61.0.6"].reason == "node sig-n5: taint example.com/going-away"
    rebalance, cordoned = f"10.61.0.{len(hard) + 1}", f"10.61.0.{len(hard) + 2}"
    assert set(snapshot.ready) == {rebalance, cordoned}  # soft: the workers stay, nothing new goes there
    assert snapshot.soft == {rebalance: f"node sig-n{len(hard)}: rebalance recommendation (node termination handler)",
                             cordoned: f"node sig-n{len(hard) + 1} cordoned"}

    # With drain_on_rebalance the soft signals drain too, without a deadline.
    eager = watched(ns, drain_taints="example.com/going-away", drain_on_rebalance="true")
    assert eager.first.draining[rebalance] == Drain(None, snapshot.soft[rebalance])
    assert eager.first.draining[cordoned] == Drain(None, snapshot.soft[cordoned])


def test_a_node_heartbeat_wakes_nobody_and_a_signal_on_another_node_leaves_our_pods_ready(kubernetes, watched):
    ns = "ns-quiet"
    kubernetes.add_node("quiet-ours")
    kubernetes.add_node("quiet-other")
    kubernetes.add_pod("p", "10.62.0.1", namespace=ns, node="quiet-ours")
    w = watched(ns)
    kubernetes.touch_node("quiet-ours")
    kubernetes.taint("quiet-other", "karpenter.sh/disrupted")
    kubernetes.cordon("quiet-ours")  # the one change that matters, after the two that do not
    snapshot = w.until(lambda s: s.soft)
    assert w._wakes == 1
    assert dict(snapshot.ready) == {"10.62.0.1": 1} and not snapshot.draining


def test_a_cut_watch_then_410_relists_and_nothing_is_missed_or_doubled(kubernetes, watched):
    ns = "ns-relist"
    kubernetes.add_node("relist-n")
    for i in range(3):
        kubernetes.add_pod(f"p{i}", f"10.63.0.{i + 1}", namespace=ns, node="relist-n", created=float(i))
    w = watched(ns)
    before = dict(w.first.instances)
    lists = kubernetes.count(f"/namespaces/{ns}/pods$")

    kubernetes.hold_watches(True)  # the open watches are cut, and reconnecting fails meanwhile
    kubernetes.remove_pod("p0", ns)  # gone while nobody watched
    kubernetes.add_pod("p3", "10.63.0.4", namespace=ns, node="relist-n", created=3.0)  # new meanwhile
    kubernetes.disrupt("p1", namespace=ns, when=1767225600.0)
    kubernetes.compact()  # the provider's resourceVersion is now too old: 410 Gone
    kubernetes.hold_watches(False)

    snapshot = w.until(lambda s: "10.63.0.4" in s.ready)
    assert dict(snapshot.ready) == {"10.63.0.3": 1, "10.63.0.4": 1}
    assert dict(snapshot.draining) == {"10.63.0.2": Drain(1767225630.0, "DisruptionTarget: EvictionByEvictionAPI")}
    assert snapshot.instances["10.63.0.3"] == before["10.63.0.3"]  # unchanged pods keep their identity
    assert kubernetes.count(f"/namespaces/{ns}/pods$") == lists + 1  # one relist, not one per retry
    # And the watch goes on from the relist: a later change arrives without another list.
    kubernetes.change_pod("p2", ns, ready=False)
    assert "10.63.0.3" not in w.until(lambda s: "10.63.0.3" not in s.ready).ready
    assert kubernetes.count(f"/namespaces/{ns}/pods$") == lists + 1


def test_410_as_the_watch_requests_status_relists_too(kubernetes, watched):
    ns = "ns-gone-http"
    kubernetes.add_pod("p0", "10.64.0.1", namespace=ns, node="gone-n")
    w = watched(ns)
    kubernetes.gone_as_http = True
    kubernetes.hold_watches(True)
    kubernetes.add_pod("p1", "10.64.0.2", namespace=ns, node="gone-n")
    kubernetes.compact()
    kubernetes.hold_watches(False)
    assert set(w.until(lambda s: len(s.ready) == 2).ready) == {"10.64.0.1", "10.64.0.2"}


def test_a_restarted_or_recreated_pod_is_a_new_instance_and_inherits_no_blacklisting(kubernetes, watched):
    ns = "ns-restart"
    kubernetes.add_pod("p0", "10.65.0.1", namespace=ns, node="restart-n", gpus=2)
    w = watched(ns)
    hosts = HostManager(Blacklist((10.0, 60.0)))
    hosts.update(w.first, now=0.0)
    first = w.first.instances["10.65.0.1"]
    hosts.blacklist.record_failure(Slot("10.65.0.1", 1), now=0.0)  # its worker failed with the old container
    assert hosts.available_slots(now=1.0) == [Slot("10.65.0.1", 0)]

    kubernetes.restart("p0", ns)
    restarted = w.until(lambda s: s.instances.get("10.65.0.1") != first)
    assert restarted.instances["10.65.0.1"] != first and dict(restarted.ready) == {"10.65.0.1": 2}
    hosts.update(restarted, now=1.0)
    assert hosts.available_slots(now=1.0) == [Slot("10.65.0.1", 0), Slot("10.65.0.1", 1)]

    kubernetes.remove_pod("p0", ns)
    kubernetes.add_pod("p0", "10.65.0.1", namespace=ns, node="restart-n", gpus=2)  # same name and IP, new uid
    recreated = w.until(lambda s: s.instances.get("10.65.0.1") not in (None, first, restarted.instances["10.65.0.1"]))
    assert recreated.instances["10.65.0.1"].startswith("p0/")


def test_a_namespace_that_may_not_be_read_is_one_fatal_line(kubernetes):
    kubernetes.forbid("pods", "secret-ns")
    discovery = provider("kubernetes", kubernetes_options(kubernetes, "secret-ns"))
    with pytest.raises(FatalDiscoveryError) as err:
        discovery.find()
    discovery.close()
    message = str(err.value)
    assert "\n" not in message
    assert "may not list pods in namespace 'secret-ns'" in message and "cannot list resource" in message


def test_nodes_refused_by_rbac_warn_once_and_pod_signals_still_drain(kubernetes, watched, caplog):
    ns = "ns-no-nodes"
    kubernetes.forbid("nodes")
    kubernetes.add_pod("p0", "10.66.0.1", namespace=ns, node="nonodes-n")
    kubernetes.add_pod("p1", "10.66.0.2", namespace=ns, node="nonodes-n")
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.providers.kubernetes"):
        w = watched(ns)
        assert set(w.first.ready) == {"10.66.0.1", "10.66.0.2"}
        kubernetes.delete_pod("p1", grace_s=10, namespace=ns)
        assert "10.66.0.2" in w.until(lambda s: s.draining).draining
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "may not list nodes" in warnings[0] and "pod signals" in warnings[0]
    assert [x.what for x in w.discovery.watches] == ["pods"]


def test_a_bad_selector_is_one_line_locally_and_from_the_api_server(kubernetes):
    with pytest.raises(ConfigError) as err:
        provider("kubernetes", kubernetes_options(kubernetes, "ns-bad", selector="app in llm"))
    assert "--k8s-selector 'app in llm' is not a label selector" in str(err.value)
    # One the local check lets through but the server refuses (a newer server's rule, say): one fatal line.
    kubernetes.fail(r"/namespaces/ns-bad/pods$", 1, 400,
                    {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 400,
                     "reason": "BadRequest", "message": "unable to parse requirement: invalid label value"})
    discovery = provider("kubernetes", kubernetes_options(kubernetes, "ns-bad"))
    with pytest.raises(FatalDiscoveryError) as err:
        discovery.find()
    discovery.close()
    assert str(err.value) == ("kubernetes pods 'app=llm': the API server refused the pods query: unable to parse "
                              "requirement: invalid label value")


def test_bad_namespace_taint_and_credentials_are_one_line(kubernetes, tmp_path):
    with pytest.raises(ConfigError, match="--k8s-namespace 'ML_Team' is not a namespace name"):
        provider("kubernetes", kubernetes_options(kubernetes, "ML_Team"))
    with pytest.raises(ConfigError, match="--k8s-drain-taint 'bad key!' is not a taint key"):
        provider("kubernetes", kubernetes_options(kubernetes, "ns", drain_taints="ok/key,bad key!"))
    wrong = kubernetes.write_kubeconfig(tmp_path, token="stale-token")
    discovery = provider("kubernetes", {**kubernetes_options(kubernetes, "ns"), "kubeconfig": str(wrong)})
    with pytest.raises(FatalDiscoveryError, match=r"refused the credentials \(401 Unauthorized\)"):
        discovery.find()
    missing = provider("kubernetes", {**kubernetes_options(kubernetes, "ns"), "kubeconfig": str(tmp_path / "none")})
    with pytest.raises(FatalDiscoveryError) as err:
        missing.find()
    # Review h30: "cannot load ...: Invalid kube-config file. No configuration found." of a file that is not there.
    assert str(err.value) == f"kubernetes pods 'app=llm': the kubeconfig {tmp_path / 'none'} (--kubeconfig) does not exist"


def test_a_continue_token_expired_during_the_first_list_is_retried_not_fatal(kubernetes):
    """Review h30: a 410 (an expired continue token, after an etcd compaction) ended the job at its first list,
    where the same 410 to a watch relists."""
    ns = "ns-expired"
    kubernetes.add_pod("p0", "10.72.0.1", namespace=ns, node="expired-n")
    kubernetes.fail(rf"^/api/v1/namespaces/{ns}/pods$", 1, 410, {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 410, "reason": "Expired",
        "message": "The provided continue parameter is too old to display a consistent list result."})
    discovery = provider("kubernetes", kubernetes_options(kubernetes, ns))
    try:
        with pytest.raises(RetryableDiscoveryError, match="listing pods: HTTP 410 The provided continue parameter"):
            discovery.find()
        assert dict(discovery.find().ready) == {"10.72.0.1": 1}
    finally:
        discovery.close()


@pytest.mark.parametrize("timeout_s, waited", [("10", 125.0), ("2", 29.0)])
def test_the_driver_waits_for_the_first_discoverys_two_lists_not_just_discovery_timeout(kubernetes, timeout_s, waited):
    """Review h30: the first find() lists pods then nodes, each within 6 x timeout_s, but the driver waited only
    --discovery-timeout (30 s) for it: a 1,600-node cluster listed in 32 s failed "gave no answer" at start."""
    from cloud_elastic.providers.multi import call_limit_s
    discovery = provider("kubernetes", {**kubernetes_options(kubernetes, "ns"), "timeout_s": timeout_s})
    assert call_limit_s(discovery, 10.0) == waited
    assert call_limit_s(discovery, 300.0) == 300.0  # never less than --discovery-timeout


def test_a_first_discovery_that_fails_halfway_keeps_nothing_and_the_next_one_starts_over(kubernetes, watched):
    ns = "ns-halfway"
    kubernetes.add_node("halfway-n", taints={"karpenter.sh/disrupted": ("NoSchedule", 0.0)})
    kubernetes.add_pod("p0", "10.69.0.1", namespace=ns, node="halfway-n")
    kubernetes.fail(r"^/api/v1/nodes$", 1, 503, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                 "status": "Failure", "code": 503, "reason": "ServiceUnavailable",
                                                 "message": "etcd leader changed"})
    discovery = provider("kubernetes", kubernetes_options(kubernetes, ns))
    try:
        with pytest.raises(RetryableDiscoveryError, match="listing nodes: HTTP 503 etcd leader changed"):
            discovery.find()
        snapshot = discovery.find()  # pods and nodes listed again: the taint is seen
        assert snapshot.draining == {"10.69.0.1": Drain(None, "node halfway-n: Karpenter disruption")}
        assert kubernetes.count(f"/namespaces/{ns}/pods$") == 2
    finally:
        discovery.close()


def test_without_a_namespace_the_kubeconfig_contexts_is_used(kubernetes, tmp_path):
    kubernetes.add_pod("p0", "10.69.1.1", namespace="ns-from-context", node="context-n")
    config = kubernetes.write_kubeconfig(tmp_path, namespace="ns-from-context")
    discovery = provider("kubernetes", {"selector": "app=llm", "kubeconfig": str(config)})
    try:
        assert dict(discovery.find().ready) == {"10.69.1.1": 1}
    finally:
        discovery.close()


def test_no_credentials_anywhere_is_one_line_naming_the_flag(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    discovery = provider("kubernetes", {"selector": "app=llm"})
    with pytest.raises(FatalDiscoveryError) as err:
        discovery.find()
    assert str(err.value) == (f"kubernetes pods 'app=llm': no Kubernetes credentials: not in a pod "
                              f"(KUBERNETES_SERVICE_HOST unset) and no kubeconfig at {tmp_path}/.kube/config; "
                              "pass --kubeconfig PATH")


def test_an_unreachable_api_server_is_retryable(kubernetes, tmp_path):
    config = json.loads(kubernetes.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"
    path = tmp_path / "closed"
    path.write_text(json.dumps(config))
    discovery = provider("kubernetes", {**kubernetes_options(kubernetes, "ns"), "kubeconfig": str(path),
                                        "timeout_s": "2"})
    with pytest.raises(RetryableDiscoveryError, match="cannot reach the API server http://127.0.0.1:9"):
        discovery.find()


def test_a_watch_down_past_stale_after_s_fails_discovery_until_it_is_back(kubernetes, watched):
    ns = "ns-stale"
    kubernetes.add_pod("p0", "10.67.0.1", namespace=ns, node="stale-n")
    w = watched(ns, stale_after_s="1")
    kubernetes.hold_watches(True)
    deadline = time.monotonic() + 20
    while True:  # bounded: the watch is down from now on, so find() must fail within stale_after_s + a retry
        try:
            w.discovery.find()
        except RetryableDiscoveryError as exc:
            assert "the pods watch has been down for" in str(exc) and "503" in str(exc)
            break
        assert time.monotonic() < deadline, "find() kept answering from a view nobody updates"
        time.sleep(0.2)
    kubernetes.hold_watches(False)
    kubernetes.change_pod("p0", ns, ready=False)
    deadline = time.monotonic() + 40  # the back-off after a 1 s outage is at most a few seconds
    while True:
        try:
            if not w.discovery.find().ready:
                break  # the watch is back, and what changed meanwhile arrived
        except RetryableDiscoveryError:
            pass
        assert time.monotonic() < deadline, "the watch never came back"
        time.sleep(0.2)


def test_a_list_that_never_ends_is_one_fatal_line_not_a_hang(kubernetes):
    ns = "ns-endless"
    kubernetes.add_pod("p0", "10.71.0.1", namespace=ns, node="endless-n")
    kubernetes.endless_lists = True  # every page ends with a continue token back to the first
    discovery = provider("kubernetes", kubernetes_options(kubernetes, ns))
    with pytest.raises(FatalDiscoveryError, match="listing pods: no end after 100 pages"):
        discovery.find()
    assert kubernetes.count(f"/namespaces/{ns}/pods$") == 100


def test_a_silent_watch_fails_discovery_within_its_silence_bound_and_catches_up_after(kubernetes, watched):
    """A path that stops forwarding (no reset, no bytes) is noticed by its silence alone: each watch asks for
    bookmarks and lasts watch_s, so nothing for watch_s + min(10, watch_s) (here 2 s) is trouble, counted from
    the last word. Before, only a failed request counted: the 16 s read timeout, then stale_after_s."""
    ns = "ns-silent"
    kubernetes.add_pod("p0", "10.69.0.1", namespace=ns, node="silent-n")
    w = watched(ns, watch_s="1", stale_after_s="1")
    socket_options = w.discovery._api.rest_client.pool_manager.connection_pool_kw["socket_options"]
    assert (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1) in socket_options  # a vanished peer fails the read too
    kubernetes.stall_watches(True)
    kubernetes.delete_pod("p0", grace_s=120, namespace=ns)
    deadline = time.monotonic() + 10
    while True:  # bounded: the silence bound is 2 s; the old rule took 17 s
        try:
            snapshot = w.discovery.find()
        except RetryableDiscoveryError as exc:
            assert "the pods watch has been down for" in str(exc)
            break
        assert "10.69.0.1" in snapshot.ready  # the deletion is not seen: the view is stale
        assert time.monotonic() < deadline, "find() kept answering from a view nobody updates"
        time.sleep(0.2)
    kubernetes.stall_watches(False)
    deadline = time.monotonic() + 30  # the back-off after a short outage is a few seconds
    while True:
        try:
            if "10.69.0.1" in w.discovery.find().draining:
                break  # the watch is back, from its kept version: the deletion arrived
        except RetryableDiscoveryError:
            pass
        assert time.monotonic() < deadline, "the watch never came back"
        time.sleep(0.2)


def _normal(value):
    """JSON with times as Unix seconds and null fields dropped, to compare what two writers meant."""
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, str) and len(value) >= 20 and value[4:5] == "-" and value[10:11] == "T":
        return parse_time(value)
    return value


def test_the_fakes_json_reads_as_the_clients_models():
    """The fake's pods and nodes, events and errors deserialize into the client's own models, field for field."""
    from kubernetes.client import ApiClient

    api = ApiClient()

    def model(obj, kind):
        return api.deserialize(SimpleNamespace(data=json.dumps(obj)), kind)

    pod = Pod("p0", "10.68.0.1", node="n1", gpus=8, restarts=2, grace_s=45, deletion=1767225700.0,
              disruption=("DeletionByTaintManager", 1767225650.0), annotations={"cloud-elastic.io/slots": "3"})
    raw = pod.json()
    v1 = model(raw, "V1Pod")
    assert v1.metadata.name == "p0" and v1.metadata.uid == pod.uid
    assert v1.metadata.deletion_timestamp.timestamp() == 1767225700
    assert v1.spec.node_name == "n1" and v1.spec.termination_grace_period_seconds == 45
    assert v1.spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}
    assert v1.status.pod_ip == "10.68.0.1" and v1.status.phase == "Running"
    assert v1.status.container_statuses[0].restart_count == 2
    conditions = {c.type: c for c in v1.status.conditions}
    assert conditions["Ready"].status == "True" and conditions["DisruptionTarget"].reason == "DeletionByTaintManager"
    # Nothing the model does not know, nothing lost (times written as +00:00, nulls dropped: same values).
    assert _normal(api.sanitize_for_serialization(v1)) == _normal(raw)

    node = Node("n1", taints={"karpenter.sh/disrupted": ("NoSchedule", 1767225600.0),
                              "node.kubernetes.io/not-ready": ("NoExecute", 1767225700.0)}, unschedulable=True)
    raw_node = node.json()
    v1node = model(raw_node, "V1Node")
    assert v1node.spec.unschedulable is True
    assert [(t.key, t.effect) for t in v1node.spec.taints] == [("karpenter.sh/disrupted", "NoSchedule"),
                                                               ("node.kubernetes.io/not-ready", "NoExecute"),
                                                               ("node.kubernetes.io/unschedulable", "NoSchedule")]
    # The API server writes timeAdded only for NoExecute taints.
    assert [t.time_added and t.time_added.timestamp() for t in v1node.spec.taints] == [None, 1767225700, None]
    assert _normal(api.sanitize_for_serialization(v1node)) == _normal(raw_node)

    from tests.emulator.fake_kubernetes import _status
    status = model(_status(410, "Expired", "too old resource version: 1 (2)"), "V1Status")
    assert status.code == 410 and status.reason == "Expired"
    listing = model({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7", "continue": "x"},
                     "items": [{k: v for k, v in raw.items() if k not in ("kind", "apiVersion")}]}, "V1PodList")
    assert listing.metadata.resource_version == "7" and listing.items[0].status.pod_ip == "10.68.0.1"
    event = model({"type": "MODIFIED", "object": raw}, "V1WatchEvent")
    assert event.type == "MODIFIED"


def test_watches_cut_after_serving_events_reconnect_at_once_not_after_a_growing_back_off(kubernetes, watched):
    """A proxy or an API server under an event flood cuts long streams that were serving fine. The back-off kept
    doubling across such cuts (it was reset only by a stream's clean end): after seven, a reconnect waited 30 s
    and more, and a pod's deletion reached the view 34 s late, past GKE's 15 s Spot grace."""
    ns = "ns-cut-often"
    kubernetes.add_node("cut-n")
    kubernetes.add_pod("w0", "10.66.0.1", namespace=ns, node="cut-n")
    w = watched(ns)
    pods = w.discovery.watches[0]
    for restarts in range(1, 8):
        kubernetes.change_pod("w0", ns, restarts=restarts)  # the stream serves an event: the server is healthy
        w.until(lambda s, r=restarts: s.instances.get("10.66.0.1", "").endswith(f"/{r}"))
        opened = pods.watches
        kubernetes.cut_watches()
        # Each reconnect waits the first back-off (0.5 s, jittered); doubling, the sixth waited 16 s, the seventh 30.
        deadline = time.monotonic() + 8
        while pods.watches == opened and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pods.watches > opened, f"no reconnect within 8 s of cut {restarts}"
