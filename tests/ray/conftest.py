"""A small multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``).

The head node has no CPUs, so it is never a host: every host is a worker node
the test adds (one CPU each, one slot each) and may remove. One cluster per
test module (starting Ray costs seconds); each test removes the nodes it added.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_STORE = 80 * 1024 * 1024


class RayCluster:
    """The running cluster, with helpers to add and remove one-CPU nodes."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.nodes: list = []

    def add(self, count: int = 1, **node_args) -> list:
        """Add ``count`` one-CPU nodes (``node_args`` go to ``Cluster.add_node``, e.g. ``node_ip_address``)."""
        added = [self.cluster.add_node(num_cpus=1, object_store_memory=_STORE, **node_args) for _ in range(count)]
        self.cluster.wait_for_nodes()
        self.nodes.extend(added)
        return added

    def remove(self, node) -> None:
        self.nodes.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)

    def clear(self) -> None:
        for node in list(self.nodes):
            self.remove(node)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'cloud-elastic[ray]')")
    from ray.cluster_utils import Cluster

    # Workers import this checkout (and the tests' helpers) like the driver does.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    cluster = Cluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=0, include_dashboard=False, object_store_memory=_STORE),
    )
    ray.init(address=cluster.address, log_to_driver=True)
    rc = RayCluster(cluster)
    try:
        yield rc
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def nodes(ray_cluster):
    """The module's cluster; nodes a test added are removed after it."""
    yield ray_cluster
    ray_cluster.clear()


def load_example(engine: str = "ray"):
    """``examples/elastic_anywhere.py`` as a module whose functions the engine (ray, pyspark) ships by value."""
    import importlib
    import importlib.util
    import sys

    cloudpickle = importlib.import_module(f"{engine}.cloudpickle")
    spec = importlib.util.spec_from_file_location("elastic_anywhere", REPO / "examples" / "elastic_anywhere.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.2):
    """Poll ``condition()`` until it returns something truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
