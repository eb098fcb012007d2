"""The test cluster as the other Ray tests need it: over loopback only (every node, and the driver, advertise a
127.x address), and with its workers at normal CPU priority (see ``conftest``: at Ray's nice 15 they starved beside
the other test lanes)."""

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


@pytest.mark.ray
def test_the_test_cluster_runs_its_workers_at_normal_priority(nodes):
    import os

    import ray

    nodes.add(1)

    @ray.remote(num_cpus=1)
    def niceness() -> int:
        return os.nice(0)

    # Ray's default is 15 (worker_niceness); conftest's _SYSTEM sets 0.
    assert ray.get(niceness.remote(), timeout=120) == 0
