"""RayHostDiscovery: pure rules on ray.nodes()-shaped input, then the real thing on a local cluster."""

from __future__ import annotations

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.api import Drain
from cloud_elastic.ray import RayHostDiscovery

pytestmark = pytest.mark.timeout(120)


def _node(node_id: str, alive: bool = True, **resources: float) -> dict:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "10.0.0.1", "Resources": resources}


def test_slots_come_from_total_cpus_or_gpus_and_empty_or_dead_nodes_are_left_out():
    nodes = [_node("a", CPU=8.0), _node("b", CPU=3.0), _node("head", CPU=0.0), _node("dead", alive=False, CPU=8.0)]
    snap = RayHostDiscovery(cpus_per_slot=2).snapshot(nodes, {})
    assert dict(snap.ready) == {"a": 4, "b": 1}
    assert dict(snap.instances) == {"a": "a", "b": "b"}
    gpu = RayHostDiscovery(use_gpu=True, cpus_per_slot=2).snapshot(
        [_node("g", CPU=16.0, GPU=4.0), _node("few-cpus", CPU=2.0, GPU=4.0), _node("cpu-only", CPU=64.0)], {}
    )
    assert dict(gpu.ready) == {"g": 4, "few-cpus": 1}


def test_a_draining_node_is_draining_with_ray_s_deadline():
    snap = RayHostDiscovery().snapshot([_node("a", CPU=1.0), _node("b", CPU=1.0), _node("c", CPU=1.0)],
                                       {"b": 1_700_000_000_500, "c": 0})
    assert dict(snap.ready) == {"a": 1}
    assert snap.draining["b"] == Drain(1_700_000_000.5, "ray is draining the node")
    assert snap.draining["c"].deadline is None


def test_bad_options_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="cpus_per_slot must be > 0"):
        RayHostDiscovery(cpus_per_slot=0)
    with pytest.raises(ConfigError, match="option 'cpus_per_slot' must be a number"):
        RayHostDiscovery.from_options({"cpus_per_slot": "two"})
    with pytest.raises(ConfigError, match="has no option 'zone'"):
        RayHostDiscovery.from_options({"zone": "x"})


@pytest.mark.ray
def test_find_reports_the_cluster_s_worker_nodes(nodes):
    a, b = nodes.add(2)
    snap = RayHostDiscovery().find()
    assert dict(snap.ready) == {a.node_id: 1, b.node_id: 1}  # the CPU-less head is not a host
