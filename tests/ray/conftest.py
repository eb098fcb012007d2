"""A small multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``).

The head node has no CPUs, so it is never a host: every host is a worker node
the test adds (one CPU each, one slot each) and may remove. One cluster for the
tests/ray package (starting one cost 6-16 s a module on a loaded machine), shut
down after its last test so that its idle daemons do not take CPU from the tests
that follow. A test that adds nodes sees only those: the plain ones a test
leaves are kept for the next test's ``add`` (starting one is a raylet and two
Python agents), which removes those it does not take; the others are removed
when their test ends.

Every node advertises a loopback address (127.0.0.1 unless a test names another
127.x address): left alone, Ray advertises the machine's own interface address
(``ray.util.get_node_ip_address``), and workers, Gloo and the driver would then
talk over it. ``node_ip_address`` pins each node, but ``ray.init`` (here, in the
CLI and in the example, which connect by address) still replaces "127.0.0.1" in
an address by the interface address (``services.resolve_ip_for_localhost``). In
ray 2.60 the one setting that keeps it loopback is
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: then ``get_node_ip_address`` answers
127.0.0.1 (what Ray does on Windows and macOS); it must be in the environment
before ray is imported, and processes the tests start inherit it.
``RayCluster.check_loopback`` fails a test whose cluster has a node, or a driver,
elsewhere; it runs when the cluster starts and after every node added.

Ray's own node health checks are made patient (:data:`_SYSTEM`): by default the GCS
marks a node dead after five missed checks three seconds apart, and on a loaded
2-core CI runner it killed a healthy node's raylet that way in the middle of a test.
Here a node is dead after 20 failed checks, each allowed 10 s, the next one 0.2 s
after the last answer or timeout (``gcs_health_check_manager.cc``): a slow node has
minutes, while a node a test removed refuses each check at once and is found dead
within about 4 s. That matters to every test, not only to those that remove a node:
``Cluster.wait_for_nodes``, after each node added, waits until the live nodes are
exactly those added and not removed, so the first test after one that removed its
nodes (every test did, at its end, before plain nodes were kept) waited for them to be found dead. With checks a
second apart that was 20 s a test, most of the Ray tests' time.

Two of Ray's guards are off, because what they guard is the CI machine's,
not the cluster's: its memory monitor, which kills the newest actor when the
whole machine's memory use passes 95% (the other test lanes run beside this
one), and its disk threshold, which at 95% full refuses object creation and
logs an error every few seconds (the shared disk sits near 95%, and was seen at
99%). The kernel's OOM killer still stands behind them.

And Ray's workers run at nice 0 here. Ray starts its worker processes, so every
actor and every training worker in one, at nice 15 (``worker_niceness``). Beside
the other test lanes, at nice 0, such a worker got almost no CPU: under three
busy loops on this 2-core machine ``import torch`` in an actor took over a
minute, the workers' heartbeats stopped for 5 s, and the driver gave every
worker up before the first round (twice in two tries; at nice 0, the same five
executor tests passed under the same load). It is the likeliest cause of the
Ray tests that failed in two CI runs, where the jobs lane runs beside this one:
there, workers died "not yet ranked" as actors (a starved worker process is also
what Ray's own 60 s registration timeout kills), and turning off the memory
monitor and the disk threshold after the first run did not help. What nice 15
means on a real cluster is in docs/ray.md.
"""

from __future__ import annotations

import ipaddress
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when ray is imported: see the module docstring
_STORE = 80 * 1024 * 1024
LOOPBACK = "127.0.0.1"
#: Ray's node health checks (see the module docstring): 0.2 s apart, each allowed 10 s, dead after 20 failures;
#: no memory monitor, no disk threshold, workers at nice 0 (see the module docstring).
_SYSTEM = {"health_check_period_ms": 200, "health_check_timeout_ms": 10000, "health_check_failure_threshold": 20,
           "memory_monitor_refresh_ms": 0, "local_fs_capacity_threshold": 1.0, "worker_niceness": 0}


class RayCluster:
    """The running cluster, with helpers to add and remove one-CPU nodes.

    A plain node (the default arguments) that a test leaves alive, idle and not draining is kept for the next
    test's :meth:`add` instead of being removed: each node started costs a raylet and two Python agents (about
    5 CPU-s measured, and the wait for it to register), and most tests want one or two plain nodes. A test still sees
    exactly the nodes it added: the first :meth:`add` of a test removes the kept nodes it does not take.
    """

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.nodes: list = []
        self._kept: list = []  # plain nodes the last test left, for this test's first add()
        self._plain: set[str] = set()  # ids of the nodes started with the default arguments

    def add(self, count: int = 1, **node_args) -> list:
        """Add ``count`` one-CPU nodes (``node_args`` go to ``Cluster.add_node``, e.g. ``node_ip_address``,
        which must be a 127.x address; 127.0.0.1 by default). Plain ones may be nodes an earlier test left."""
        node_args.setdefault("node_ip_address", LOOPBACK)
        reused = []
        if node_args == {"node_ip_address": LOOPBACK}:
            while self._kept and len(reused) < count:
                node = self._kept.pop(0)
                if self._idle(node):
                    reused.append(node)
                else:
                    self.cluster.remove_node(node, allow_graceful=False)
        for node in self._kept:  # not asked for: the test sees only its own nodes
            self.cluster.remove_node(node, allow_graceful=False)
        self._kept.clear()
        added = [self.cluster.add_node(num_cpus=1, object_store_memory=_STORE, **node_args)
                 for _ in range(count - len(reused))]
        if node_args == {"node_ip_address": LOOPBACK}:
            self._plain.update(node.node_id for node in added)
        self.cluster.wait_for_nodes()
        self.nodes.extend(reused + added)
        self.check_loopback()
        return reused + added

    @staticmethod
    def _idle(node, timeout_s: float = 30.0) -> bool:
        """Whether ``node`` is alive, not draining, and its CPU free (an actor of a finished job may take a moment
        to release it; one of a failed test may hold it for good)."""
        import ray
        from ray._private.state import state

        deadline = time.monotonic() + timeout_s
        while True:
            alive = any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes())
            if not alive or node.node_id in state.get_draining_nodes():
                return False
            if state.available_resources_per_node().get(node.node_id, {}).get("CPU", 0.0) >= 1.0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def check_loopback(self) -> None:
        """Fail unless every live node, and this driver, advertise an address in 127.0.0.0/8."""
        import ray

        advertised = {node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
        advertised.add(ray.util.get_node_ip_address())
        outside = sorted(a for a in advertised if not ipaddress.ip_address(a).is_loopback)
        assert not outside, f"the test Ray cluster advertises non-loopback addresses {outside} (all: {sorted(advertised)})"

    def remove(self, node) -> None:
        self.nodes.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)

    def clear(self) -> None:
        """End of a test: its plain nodes are kept for the next test (checked when taken), the others removed."""
        for node in list(self.nodes):
            if node.node_id in self._plain:
                self.nodes.remove(node)
                self._kept.append(node)
            else:
                self.remove(node)


@pytest.fixture(scope="package")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'cloud-elastic[ray]')")
    from ray.cluster_utils import Cluster

    # Workers import this checkout (and the tests' helpers) like the driver does.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    cluster = Cluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=0, include_dashboard=False, object_store_memory=_STORE,
                            node_ip_address=LOOPBACK, _system_config=_SYSTEM),
    )
    ray.init(address=cluster.address, log_to_driver=True, _node_ip_address=LOOPBACK)
    rc = RayCluster(cluster)
    try:
        rc.check_loopback()
        yield rc
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def nodes(ray_cluster):
    """The package's cluster; nodes a test added are removed after it, or kept for the next (``RayCluster``)."""
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


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.2, ended=None):
    """Poll ``condition()`` until it returns something truthy; fail naming ``what`` after ``timeout_s``.

    ``ended()``, if given, says why waiting longer is pointless (the job it waits on has ended: a string)
    or returns None; the wait then fails at once with that reason instead of running out its time, so a
    failed job's own reason is in the failure's one line (CI shows little more than that line).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        why = ended() if ended is not None else None
        if why:
            value = condition()  # what the job did just before it ended
            if value:
                return value
            raise AssertionError(f"gave up waiting for {what}: {why}")
        time.sleep(poll_s)
    why = ended() if ended is not None else None
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}" + (f" ({why})" if why else ""))
