"""A terminating pod never hides the live pod that was given its IP: through the real ``kubernetes`` client,
over HTTP, against the fake API server (``tests/emulator/fake_kubernetes.py``).

A pod kept Terminating (a finalizer, a lost node) still shows its ``podIP`` while the network plugin hands the
address to a new pod. The view drained the address under the old pod's identity, so the new Ready pod was never
offered to the driver.
"""

from __future__ import annotations

import pytest

from tests.emulator.fake_kubernetes import kubernetes, kubernetes_server  # noqa: F401
from tests.emulator.fixtures import hermetic_cloud_env  # noqa: F401
from tests.emulator.test_kubernetes import watched  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def test_a_new_ready_pod_at_a_terminating_pods_ip_is_offered_with_its_own_identity(kubernetes, watched):
    ns = "ns-ip-reuse"
    kubernetes.add_node("reuse-n1")
    kubernetes.add_pod("old", "10.62.0.1", namespace=ns, node="reuse-n1", created=100.0)
    kubernetes.add_pod("other", "10.62.0.2", namespace=ns, node="reuse-n1", created=150.0)
    w = watched(ns)
    old = kubernetes.pods[(ns, "old")]
    assert w.first.instances["10.62.0.1"] == f"old/{old.uid}/0"

    kubernetes.delete_pod("old", grace_s=600, namespace=ns)  # stays Terminating, its podIP still shown
    w.until(lambda s: "10.62.0.1" in s.draining)
    new = kubernetes.add_pod("new", "10.62.0.1", namespace=ns, node="reuse-n1", created=200.0)
    snapshot = w.until(lambda s: "10.62.0.1" in s.ready)
    assert dict(snapshot.ready) == {"10.62.0.1": 1, "10.62.0.2": 1}
    assert "10.62.0.1" not in snapshot.draining
    assert snapshot.instances["10.62.0.1"] == f"new/{new.uid}/0"

    # A fresh list (a driver started now) reads it the same way, whatever order the pods come in.
    assert w.first.instances != snapshot.instances
    again = watched(ns).first
    assert dict(again.ready) == {"10.62.0.1": 1, "10.62.0.2": 1} and not again.draining
    assert again.instances["10.62.0.1"] == f"new/{new.uid}/0"


def test_a_terminating_pod_whose_ip_nobody_took_still_drains(kubernetes, watched):
    ns = "ns-ip-kept"
    kubernetes.add_node("kept-n1")
    kubernetes.add_pod("leaving", "10.62.1.1", namespace=ns, node="kept-n1")
    kubernetes.add_pod("elsewhere", "10.62.1.2", namespace=ns, node="kept-n1")
    kubernetes.delete_pod("leaving", grace_s=600, namespace=ns)
    snapshot = watched(ns).first
    assert snapshot.draining["10.62.1.1"].reason == "pod deleted"
    assert dict(snapshot.ready) == {"10.62.1.2": 1}
