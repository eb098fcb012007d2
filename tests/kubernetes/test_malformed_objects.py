"""Pods and nodes of the wrong shape from the API server, as a user of find() sees them: through the real
``kubernetes`` client, over HTTP, against the fake API server (``tests/emulator/fake_kubernetes.py``).

Review s62 rvH2 (finding T): a pod whose metadata was a string, or whose podIP was a number, failed discovery with
Python's own message (``'str' object has no attribute 'get'``), naming neither the pod nor the field; and in the
watch, the same event came again after each reconnect, so one such pod kept the pods watch down and, past
--elastic-timeout, would have ended a healthy job. Now such an object is left out, with one WARNING naming it and
the field, and everything else goes on.
"""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.errors import RetryableDiscoveryError
from tests.emulator.fake_kubernetes import kubernetes, kubernetes_options, kubernetes_server  # noqa: F401
from tests.emulator.fixtures import hermetic_cloud_env, provider  # noqa: F401
from tests.emulator.test_kubernetes import watched  # noqa: F401

pytestmark = pytest.mark.timeout(60)

_VIEW = "cloud_elastic.providers.kubernetes_view"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == _VIEW]


def _with_items(kubernetes, monkeypatch, ns: str, extra: list) -> None:
    """The pods lists of ``ns`` (not its watches) also hold ``extra``, as they are."""
    serve = kubernetes._serve

    def broken(request, resource, where):
        reply = serve(request, resource, where)
        if resource == "pods" and where == ns and request.query.get("watch") is None:
            reply.body["items"] = reply.body["items"] + extra
        return reply

    monkeypatch.setattr(kubernetes, "_serve", broken)


def test_malformed_pods_in_a_list_are_left_out_with_one_warning_each_naming_the_pod_and_field(
        kubernetes, monkeypatch, caplog):
    ns = "ns-malformed-list"
    kubernetes.add_pod("p0", "10.81.0.1", namespace=ns, node="malformed-n")
    bad = [{"metadata": "x"},
           {"metadata": {"name": "ip-a-number", "uid": "u1"}, "status": {"phase": "Running", "podIP": 5}},
           {"metadata": {"name": "restarts-text", "uid": "u2"}, "spec": {"containers": [{"name": "worker"}]},
            "status": {"containerStatuses": [{"name": "worker", "restartCount": "many"}]}},
           {"metadata": {"name": "deleted-when", "uid": "u3", "deletionTimestamp": "soon"}},
           "a pod that is a string"]
    _with_items(kubernetes, monkeypatch, ns, bad)
    caplog.set_level(logging.WARNING, logger=_VIEW)
    discovery = provider("kubernetes", kubernetes_options(kubernetes, ns))
    try:
        assert dict(discovery.find().ready) == {"10.81.0.1": 1}
        first = _warnings(caplog)
        discovery.find()
    finally:
        discovery.close()
    left_out = "(from the API server); the pod is left out until the API server sends it readable"
    assert first == [f"kubernetes pods 'app=llm': {what} {left_out}" for what in (
        "a pod: metadata is 'x', not an object",
        "pod 'ip-a-number': status.podIP is 5, not a string",
        "pod 'restarts-text': status.containerStatuses[0].restartCount is 'many', not a whole number",
        "pod 'deleted-when': metadata.deletionTimestamp is 'soon', not a time",
        "a pod that is 'a pod that is a string', not an object")]
    assert _warnings(caplog) == first  # once, not at every find()


def test_a_list_page_of_the_wrong_shape_fails_discovery_in_one_line_naming_the_field(kubernetes, monkeypatch):
    ns = "ns-malformed-page"
    kubernetes.add_pod("p0", "10.82.0.1", namespace=ns, node="malformed-n")
    serve = kubernetes._serve

    def broken(request, resource, where):
        reply = serve(request, resource, where)
        if resource == "pods" and where == ns:
            reply.body["items"] = {"a": 1}
        return reply

    monkeypatch.setattr(kubernetes, "_serve", broken)
    discovery = provider("kubernetes", kubernetes_options(kubernetes, ns))
    try:
        with pytest.raises(RetryableDiscoveryError) as err:
            discovery.find()
    finally:
        discovery.close()
    assert str(err.value) == "kubernetes pods 'app=llm': listing pods: a page: items is {'a': 1}, not a list"


def test_a_malformed_pod_in_the_watch_is_left_out_with_one_warning_and_the_watch_goes_on(kubernetes, watched,
                                                                                        caplog):
    ns = "ns-malformed-event"
    kubernetes.add_pod("p0", "10.83.0.1", namespace=ns, node="malformed-n", created=100.0)
    kubernetes.add_pod("p1", "10.83.0.2", namespace=ns, node="malformed-n", created=200.0)
    caplog.set_level(logging.WARNING, logger=_VIEW)
    w = watched(ns)
    assert dict(w.first.ready) == {"10.83.0.1": 1, "10.83.0.2": 1}

    kubernetes.send_malformed("pods", "p0", lambda pod: pod["status"].update(podIP=5), namespace=ns)
    kubernetes.send_malformed("pods", "p1", lambda pod: "a pod that is a string", namespace=ns)
    kubernetes.add_pod("p2", "10.83.0.3", namespace=ns, node="malformed-n", created=300.0)  # behind them
    # An update that does not read may be the pod's deletion: p0 is left out (missing, to the driver) until it
    # reads again. p1's event names no pod: p1 stays as it was.
    snapshot = w.until(lambda s: "10.83.0.3" in s.ready)
    assert dict(snapshot.ready) == {"10.83.0.2": 1, "10.83.0.3": 1}
    assert w.discovery.watches[0].trouble() is None
    kubernetes.change_pod("p0", namespace=ns, ready=True)  # readable again
    snapshot = w.until(lambda s: "10.83.0.1" in s.ready)
    assert list(snapshot.ready) == ["10.83.0.1", "10.83.0.2", "10.83.0.3"]
    assert w.discovery.watches[0].trouble() is None
    assert _warnings(caplog) == [
        "kubernetes pods 'app=llm': pod 'p0': status.podIP is 5, not a string (from the API server); the pod is "
        "left out until the API server sends it readable",
        "kubernetes pods 'app=llm': a pod that is 'a pod that is a string', not an object (from the API server); "
        "the pod is left out until the API server sends it readable"]


def test_a_malformed_node_in_the_watch_is_left_out_with_one_warning_and_its_next_taint_still_drains(
        kubernetes, watched, caplog):
    ns = "ns-malformed-node"
    kubernetes.add_node("malformed-node-n")
    kubernetes.add_pod("p0", "10.84.0.1", namespace=ns, node="malformed-node-n")
    caplog.set_level(logging.WARNING, logger=_VIEW)
    w = watched(ns)
    kubernetes.send_malformed("nodes", "malformed-node-n", lambda node: node["spec"].update(taints="all of them"))
    kubernetes.taint("malformed-node-n", "karpenter.sh/disrupted")
    snapshot = w.until(lambda s: "10.84.0.1" in s.draining)
    assert snapshot.draining["10.84.0.1"].reason == "node malformed-node-n: Karpenter disruption"
    assert all(watch.trouble() is None for watch in w.discovery.watches)
    assert _warnings(caplog) == [
        "kubernetes pods 'app=llm': node 'malformed-node-n': spec.taints is 'all of them', not a list (from the "
        "API server); its taints and cordon are not seen until the API server sends it readable"]
