"""Node signals as a user of find() sees them: through the real ``kubernetes`` client, over HTTP, against the fake API
server (``tests/emulator/fake_kubernetes.py``).

Review h3: a pod draining for its node's taint read Ready again once the Node object was deleted (the taint went with
it, the pod stays listed Running and Ready until the pod garbage collector deletes it, ~40 s), so the driver would
start workers at a dead address; and a 403 on nodes at the first list turned node signals off for the driver's life,
where a 403 later in a running watch is retried.
"""

from __future__ import annotations

import logging
import time

import pytest
import yaml

from cloud_elastic.errors import FatalDiscoveryError
from tests.emulator.fake_kubernetes import kubernetes, kubernetes_options, kubernetes_server  # noqa: F401
from tests.emulator.fixtures import hermetic_cloud_env, provider  # noqa: F401
from tests.emulator.test_kubernetes import watched  # noqa: F401

from .manifests import DEPLOY

pytestmark = pytest.mark.timeout(60)

SPOT_ITN = "aws-node-termination-handler/spot-itn"


def delete_node(fake, name: str) -> None:
    """The Node object is deleted (the cloud controller removes the node of an instance that is gone): DELETED."""
    with fake._cond:
        fake._emit("nodes", "DELETED", fake.nodes.pop(name))


def test_the_pods_of_a_deleted_node_drain_at_once_until_they_go(kubernetes, watched):
    ns = "ns-node-deleted"
    kubernetes.add_node("del-n1")
    kubernetes.add_node("del-n2")
    kubernetes.add_pod("p0", "10.74.0.1", namespace=ns, node="del-n1")
    kubernetes.add_pod("p1", "10.74.0.2", namespace=ns, node="del-n2")
    w = watched(ns)
    assert set(w.first.ready) == {"10.74.0.1", "10.74.0.2"}

    kubernetes.taint("del-n1", SPOT_ITN)
    w.until(lambda s: "10.74.0.1" in s.draining)
    before = time.time()
    delete_node(kubernetes, "del-n1")
    snapshot = w.until(lambda s: "10.74.0.1" in s.ready or "deleted" in getattr(s.draining.get("10.74.0.1"),
                                                                                   "reason", ""))
    assert "10.74.0.1" not in snapshot.ready, "a pod of a deleted node is offered to the driver"
    drain = snapshot.draining["10.74.0.1"]
    assert drain.reason == "node del-n1 deleted"
    assert before - 1 <= drain.deadline <= time.time() + 1  # now: the instance behind it is gone
    assert dict(snapshot.ready) == {"10.74.0.2": 1}
    assert w.discovery.find().draining["10.74.0.1"].deadline == drain.deadline  # not moved on by later finds

    kubernetes.remove_pod("p0", ns)  # the pod garbage collector deletes it
    gone = w.until(lambda s: "10.74.0.1" not in s.draining)
    assert "10.74.0.1" not in gone.ready and dict(gone.ready) == {"10.74.0.2": 1}


def test_a_node_missing_from_a_relist_drains_its_pods_and_one_listed_again_has_them_back(kubernetes, watched):
    ns = "ns-node-relisted"
    kubernetes.add_node("rel-n1")
    kubernetes.add_pod("p0", "10.74.1.1", namespace=ns, node="rel-n1")
    w = watched(ns)
    assert set(w.first.ready) == {"10.74.1.1"}
    with kubernetes._cond:  # deleted while no watch could tell: only the relist after 410 Gone shows it
        kubernetes.nodes.pop("rel-n1")
    kubernetes.add_pod("elsewhere", "10.74.1.9", namespace=f"{ns}-other")  # a version the watches never saw...
    kubernetes.compact()  # ...and no history before it: their next watch is answered 410, and they relist
    kubernetes.cut_watches()
    snapshot = w.until(lambda s: "10.74.1.1" in s.draining)
    assert snapshot.draining["10.74.1.1"].reason == "node rel-n1 deleted" and not snapshot.ready

    kubernetes.add_node("rel-n1")  # the node registered again
    assert dict(w.until(lambda s: "10.74.1.1" in s.ready).ready) == {"10.74.1.1": 1}


def test_nodes_refused_at_the_first_list_are_listed_again_and_a_later_grant_turns_node_signals_on(
        kubernetes, watched, caplog):
    ns = "ns-nodes-granted"
    kubernetes.add_node("grant-n1")
    kubernetes.add_pod("p0", "10.74.2.1", namespace=ns, node="grant-n1")
    kubernetes.forbid("nodes")
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.providers.kubernetes"):
        w = watched(ns)
    assert set(w.first.ready) == {"10.74.2.1"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "may not list nodes" in warnings[0] and "retried" in warnings[0], warnings
    assert [x.what for x in w.discovery.watches] == ["pods"]

    kubernetes.forbidden.clear()  # the ClusterRoleBinding applies (or the RBAC cache catches up)
    kubernetes.taint("grant-n1", "karpenter.sh/disrupted")
    snapshot = w.until(lambda s: "10.74.2.1" in s.draining, timeout=20)
    assert snapshot.draining["10.74.2.1"].reason == "node grant-n1: Karpenter disruption"
    assert [x.what for x in w.discovery.watches] == ["pods", "nodes"]


def test_the_fatal_403_on_pods_asks_for_the_verbs_the_shipped_rbac_grants(kubernetes):
    """The shipped Role grants list and watch on pods, never get (the driver reads no pod by name): the error must
    not send a user to grant what the manifests deliberately leave out."""
    granted = {verb for doc in yaml.safe_load_all((DEPLOY / "base" / "rbac.yaml").read_text())
               if doc and doc["kind"] == "Role" for rule in doc["rules"] for verb in rule["verbs"]}
    kubernetes.forbid("pods", "ns-rbac-verbs")
    discovery = provider("kubernetes", kubernetes_options(kubernetes, "ns-rbac-verbs"))
    with pytest.raises(FatalDiscoveryError) as err:
        discovery.find()
    discovery.close()
    assert granted == {"list", "watch"}
    assert "(the driver needs list and watch on pods; see docs/providers.md)" in str(err.value), str(err.value)


def test_under_a_node_selector_a_node_leaving_the_watch_is_not_taken_for_a_deleted_one(kubernetes, watched):
    """Review h8: a watch with a label selector says DELETED of a node relabelled out of it, as of a node deleted,
    while the node and its pods run on; its pods must not drain for it (the rule above needs the nodes unselected)."""
    ns = "ns-node-selected"
    kubernetes.add_node("sel-n1")
    kubernetes.add_pod("p0", "10.74.3.1", namespace=ns, node="sel-n1")
    w = watched(ns, node_selector="kubernetes.io/hostname")
    assert set(w.first.ready) == {"10.74.3.1"}
    delete_node(kubernetes, "sel-n1")  # what the watch says of a node relabelled out of the selector
    kubernetes.add_pod("p1", "10.74.3.2", namespace=ns, node="sel-n1")  # a later event the driver sees
    snapshot = w.until(lambda s: "10.74.3.2" in s.ready)
    assert dict(snapshot.ready) == {"10.74.3.1": 1, "10.74.3.2": 1} and not snapshot.draining
