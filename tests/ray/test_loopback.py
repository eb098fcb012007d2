"""The test cluster talks over loopback only: every node, and the driver, advertise a 127.x address."""

from __future__ import annotations

import pytest


@pytest.mark.ray
def test_every_node_of_the_test_cluster_advertises_a_loopback_address(nodes):
    import ray

    nodes.add(1)
    nodes.add(1, node_ip_address="127.0.0.2")
    alive = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    assert alive == {"127.0.0.1", "127.0.0.2"}  # the head and the first node share the default
    assert ray.util.get_node_ip_address() == "127.0.0.1"


@pytest.mark.ray
def test_the_check_fails_on_a_node_advertising_the_machine_s_interface_address(nodes, monkeypatch):
    import ray

    real = ray.nodes()
    monkeypatch.setattr(ray, "nodes", lambda: [*real, {"NodeManagerAddress": "192.0.2.2", "Alive": True}])
    with pytest.raises(AssertionError, match=r"non-loopback addresses \['192.0.2.2'\]"):
        nodes.check_loopback()
