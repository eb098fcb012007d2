"""The kubernetes provider's pure parts: how a pod and its node read (the view's table), the selector check,
and that configuring it imports nothing. The provider over HTTP is in tests/emulator/test_kubernetes.py."""

from __future__ import annotations

import logging
import queue
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from cloud_elastic.errors import ConfigError, MissingDependencyError
from cloud_elastic.providers import kubernetes_watch, registry
from cloud_elastic.providers.api import MAX_SLOTS_PER_HOST, Drain
from cloud_elastic.providers.kubernetes import check_selector
from cloud_elastic.providers.kubernetes_view import ClusterView, pod_record
from cloud_elastic.providers.kubernetes_watch import ResourceWatch, silence_s
from tests.emulator.fake_kubernetes import Node, Pod


def view(*pods: Pod, nodes: tuple[Node, ...] = (), **options) -> ClusterView:
    v = ClusterView("test", **options)
    v.replace_pods(p.json() for p in pods)
    v.replace_nodes(n.json() for n in nodes)
    return v


def test_slots_come_from_the_gpu_limit_then_the_annotation_then_one():
    assert pod_record(Pod("a", "10.0.0.1", gpus=8).json()).slots == 8
    annotated = Pod("b", "10.0.0.2", annotations={"cloud-elastic.io/slots": "4"}).json()
    assert pod_record(annotated).slots == 4
    assert pod_record(Pod("c", "10.0.0.3").json()).slots == 1
    assert pod_record(Pod("d", "10.0.0.4", gpus=2).json(), slots_per_host=3).slots == 3  # --slots-per-host wins
    assert pod_record(Pod("e", "10.0.0.5", gpus=2).json(), gpu_resource="amd.com/gpu").slots == 1


def test_an_unreadable_slots_annotation_leaves_the_pod_out():
    snapshot = view(Pod("a", "10.0.0.1", annotations={"cloud-elastic.io/slots": "four"}),
                    Pod("b", "10.0.0.2")).snapshot(now=0.0)
    assert dict(snapshot.ready) == {"10.0.0.2": 1}


def test_too_many_annotated_slots_leave_the_pod_out_with_one_warning_and_the_job_goes_on(caplog):
    """One pod's typo must not end the job: past MAX_SLOTS_PER_HOST it is left out, like an unreadable value."""
    pods = [Pod("huge", "10.0.0.1", annotations={"cloud-elastic.io/slots": "100000"}),
            Pod("digits", "10.0.0.2", annotations={"cloud-elastic.io/slots": "9" * 5000}),
            Pod("superscript", "10.0.0.3", annotations={"cloud-elastic.io/slots": "\u00b2"}),
            Pod("at-limit", "10.0.0.4", annotations={"cloud-elastic.io/slots": str(MAX_SLOTS_PER_HOST)}),
            Pod("fine", "10.0.0.5")]
    v = view(*pods)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.providers.kubernetes_view"):
        assert dict(v.snapshot(now=0.0).ready) == {"10.0.0.4": MAX_SLOTS_PER_HOST, "10.0.0.5": 1}
        assert dict(v.snapshot(now=1.0).ready) == {"10.0.0.4": MAX_SLOTS_PER_HOST, "10.0.0.5": 1}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3  # once per pod, not once per snapshot
    assert f"pod huge has annotation cloud-elastic.io/slots='100000', which is more than the {MAX_SLOTS_PER_HOST} " \
           "slots a host may have; the pod is not used" in warnings[0]
    assert f"more than the {MAX_SLOTS_PER_HOST} slots" in warnings[1]
    assert "pod superscript" in warnings[2] and "not a positive whole number" in warnings[2]


def test_a_spot_taint_without_time_added_is_timed_from_its_first_sighting_and_forgotten_when_lifted():
    """The termination handler's spot-itn taint is NoSchedule: the API gives it no timeAdded."""
    spot = Node("n", taints={"aws-node-termination-handler/spot-itn": ("NoSchedule", 0.0)})
    assert "timeAdded" not in spot.json()["spec"]["taints"][0]
    v = view(Pod("a", "10.0.0.1", node="n"), nodes=(spot,))
    assert v.snapshot(now=100.0).draining["10.0.0.1"] == Drain(220.0, "node n: spot interruption (node termination "
                                                                     "handler)")
    assert v.snapshot(now=150.0).draining["10.0.0.1"].deadline == 220.0  # not pushed back by later looks
    v.apply_node("MODIFIED", Node("n").json())
    assert "10.0.0.1" in v.snapshot(now=160.0).ready
    v.apply_node("MODIFIED", spot.json())  # a new interruption notice: a new two minutes
    assert v.snapshot(now=400.0).draining["10.0.0.1"].deadline == 520.0


def test_deletion_wins_over_disruption_and_disruption_over_a_node_taint():
    node = Node("n", taints={"karpenter.sh/disrupted": ("NoSchedule", 1000.0)})
    both = Pod("a", "10.0.0.1", node="n", deletion=2000.0, disruption=("EvictionByEvictionAPI", 1500.0))
    disrupted = Pod("b", "10.0.0.2", node="n", disruption=("PreemptionByScheduler", 1500.0), grace_s=20)
    tainted = Pod("c", "10.0.0.3", node="n")
    snapshot = view(both, disrupted, tainted, nodes=(node,)).snapshot(now=0.0)
    assert snapshot.draining == {"10.0.0.1": Drain(2000.0, "pod deleted"),
                                 "10.0.0.2": Drain(1520.0, "DisruptionTarget: PreemptionByScheduler"),
                                 "10.0.0.3": Drain(None, "node n: Karpenter disruption")}


def test_a_disruption_without_a_time_is_timed_from_its_first_sighting_and_stays_put():
    raw = Pod("a", "10.0.0.1", disruption=("TerminationByKubelet", 0.0), grace_s=30).json()
    for cond in raw["status"]["conditions"]:
        cond.pop("lastTransitionTime")
    v = ClusterView("test")
    v.replace_pods([raw])
    assert v.snapshot(now=100.0).draining["10.0.0.1"].deadline == 130.0
    assert v.snapshot(now=105.0).draining["10.0.0.1"].deadline == 130.0


def test_soft_signals_keep_the_pod_ready_unless_they_drain():
    nodes = (Node("cordoned", unschedulable=True),
             Node("advised", taints={"aws-node-termination-handler/rebalance-recommendation": ("PreferNoSchedule", 0)}))
    pods = (Pod("a", "10.0.0.1", node="cordoned"), Pod("b", "10.0.0.2", node="advised"))
    soft = view(*pods, nodes=nodes).snapshot(now=0.0)
    assert set(soft.ready) == {"10.0.0.1", "10.0.0.2"} and set(soft.soft) == {"10.0.0.1", "10.0.0.2"}
    eager = view(*pods, nodes=nodes, drain_soft=True).snapshot(now=0.0)
    assert not eager.ready and eager.draining["10.0.0.1"] == Drain(None, "node cordoned cordoned")


def test_only_changes_that_matter_report_news():
    pod = Pod("a", "10.0.0.1", node="ours")
    v = view(pod, nodes=(Node("ours"), Node("theirs")))
    assert not v.apply_node("MODIFIED", Node("ours").json())  # a status heartbeat
    assert not v.apply_node("MODIFIED", Node("theirs", unschedulable=True).json())  # no pod of ours there
    assert v.apply_node("MODIFIED", Node("ours", unschedulable=True).json())
    raw = pod.json()
    raw["metadata"]["labels"]["team"] = "x"  # nothing the view reads
    assert not v.apply_pod("MODIFIED", raw)
    raw["status"]["conditions"][1]["status"] = "False"  # not Ready any more
    assert v.apply_pod("MODIFIED", raw)


def test_a_restart_changes_the_instance_and_a_new_uid_too():
    pod = Pod("a", "10.0.0.1")
    first = view(pod).snapshot(now=0.0).instances["10.0.0.1"]
    pod.restarts = 1
    restarted = view(pod).snapshot(now=0.0).instances["10.0.0.1"]
    recreated = view(Pod("a", "10.0.0.1")).snapshot(now=0.0).instances["10.0.0.1"]
    assert len({first, restarted, recreated}) == 3 and all(i.startswith("a/") for i in (first, restarted, recreated))


def test_a_dual_stack_pod_is_used_at_its_ipv4_address_and_an_ipv6_only_pod_is_left_out_with_one_warning(caplog):
    """IPv6 first (podIP IPv6, podIPs both): the IPv4 entry; no IPv4 at all: one warning, and the job goes on."""
    dual, v6_only, v4 = Pod("dual", "fd00::5").json(), Pod("v6", "fd00::6").json(), Pod("v4", "10.0.0.7").json()
    dual["status"]["podIPs"] = [{"ip": "fd00::5"}, {"ip": "10.0.0.5"}]
    v = ClusterView("test")
    v.replace_pods([dual, v6_only, v4])
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.providers.kubernetes_view"):
        for now in (0.0, 1.0):
            snapshot = v.snapshot(now=now)
            assert dict(snapshot.ready) == {"10.0.0.5": 1, "10.0.0.7": 1}
            assert snapshot.instances["10.0.0.5"].startswith("dual/")
    assert [r.getMessage() for r in caplog.records] == [
        "test: pod v6 has no IPv4 address (only fd00::6), and the driver speaks IPv4 only; the pod is not used"]


def with_sidecar(pod: Pod) -> dict:
    """The pod with a mesh proxy injected as its first container (Linkerd's default), restarted 5 times."""
    raw = pod.json()
    raw["spec"]["containers"].insert(0, {"name": "linkerd-proxy", "resources": {"limits": {"memory": "250Mi"}}})
    raw["status"]["containerStatuses"].insert(0, {"name": "linkerd-proxy", "restartCount": 5})
    return raw


def test_a_sidecar_before_the_worker_container_is_not_read_for_slots_or_identity():
    gpu = pod_record(with_sidecar(Pod("a", "10.0.0.1", gpus=8, restarts=2)))
    assert (gpu.slots, gpu.restarts, gpu.container) == (8, 2, "worker")
    cpu = pod_record(with_sidecar(Pod("b", "10.0.0.2", annotations={"cloud-elastic.io/slots": "4"})))
    assert (cpu.slots, cpu.restarts) == (4, 0)  # no GPU limit: the container named worker
    chosen = pod_record(with_sidecar(Pod("c", "10.0.0.3", gpus=8)), container="linkerd-proxy")
    assert (chosen.slots, chosen.restarts) == (1, 5)  # -o container wins


def test_a_container_option_no_container_has_warns_once_and_reads_the_default(caplog):
    v = ClusterView("test", container="wroker")
    v.replace_pods([with_sidecar(Pod("a", "10.0.0.1", gpus=8)), with_sidecar(Pod("b", "10.0.0.2", gpus=8))])
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.providers.kubernetes_view"):
        assert dict(v.snapshot(now=0.0).ready) == {"10.0.0.1": 8, "10.0.0.2": 8}
        assert dict(v.snapshot(now=1.0).ready) == {"10.0.0.1": 8, "10.0.0.2": 8}
    assert [r.getMessage() for r in caplog.records] == [
        "test: -o container='wroker' names no container of pod a; its container 'worker' is read for slots and "
        "restarts"]


@pytest.mark.parametrize("selector", ["app=llm", "app==llm,tier!=cpu", "app in (llm, llm-spot)", "!canary",
                                      "example.com/team notin (a,b)", "app", "app="])
def test_selectors_the_api_accepts_pass(selector):
    check_selector(selector)


@pytest.mark.parametrize("selector,why", [("", "empty"), ("app in llm", "cannot read"), ("a=b=c", "cannot read"),
                                          ("app in ()", "no values"), ("-bad=x", "not a label key"),
                                          ("app=" + "x" * 64, "not a label value")])
def test_selectors_the_api_refuses_are_one_line(selector, why):
    with pytest.raises(ConfigError, match=why):
        check_selector(selector)


def test_a_missing_client_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")] or ["kubernetes"]:
        monkeypatch.setitem(sys.modules, name, None)
    discovery = registry.load("kubernetes").from_options({"selector": "app=llm", "kubeconfig": "/nonexistent"})
    with pytest.raises(MissingDependencyError, match=r"pip install 'cloud-elastic\[kubernetes\]'"):
        discovery.find()


def test_configuring_the_provider_imports_no_client():
    code = ("import sys\nfrom cloud_elastic.providers import registry\n"
            "registry.load('kubernetes').from_options({'selector': 'app=llm', 'namespace': 'ml'})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'urllib3')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_deleted_pods_deadline_is_enforced_by_the_driver_a_margin_before_it():
    """The provider's drain goes the way every drain goes: a member still in its round 5 s before the
    pod's deletion timestamp is removed by force (driver/job/leaving.py), not left to vanish under the job."""
    from cloud_elastic.driver.job.leaving import Leavers
    from cloud_elastic.driver.job.actions import Phase
    from tests.unit.job_view import T0, FakeJob, S

    job = FakeJob(2, min_np=1, max_np=4)
    pods = (Pod("a", "10.0.0.1", created=1.0), Pod("b", "10.0.0.2", created=2.0))
    job.hosts.update(view(*pods).snapshot(now=T0), T0)
    job.phase, job.round = Phase.RUNNING, 1
    leavers = Leavers(job)
    leaver = job.worker("10.0.0.2", 0, S.RUNNING, round_=1, rank=1)
    job.worker("10.0.0.1", 0, S.RUNNING, round_=1, rank=0)
    pods[1].deletion = T0 + 30 + job.wall_offset  # the default terminationGracePeriodSeconds
    job.hosts.update(view(*pods).snapshot(now=T0), T0)
    leavers.mark()
    assert leaver.state is S.DRAINING and "pod deleted" in leaver.why
    leavers.enforce_deadlines(T0)  # the job steps on the snapshot: it sees the deadline now
    leavers.enforce_deadlines(T0 + 24.9)
    assert leaver.state is S.DRAINING
    leavers.enforce_deadlines(T0 + 25)
    assert leaver.state is S.LOST and "removed by force" in leaver.why


class _WatchRequest:
    """One watch request as the API server sees it: answered (or refused) and ended when the test says."""

    def __init__(self) -> None:
        self._answered = threading.Event()
        self._ended = threading.Event()
        self.streaming = threading.Event()
        self._refusal: Exception | None = None
        self._failure: Exception | None = None

    def answer(self, refusal: Exception | None = None) -> None:
        self._refusal = refusal
        self._answered.set()

    def end(self, failure: Exception | None = None) -> None:
        self._failure = failure
        self._ended.set()

    def respond(self) -> "_WatchRequest":
        self._answered.wait()
        if self._refusal is not None:
            raise self._refusal
        return self

    # The response, as the watch reads it.
    chunked = True

    def stream(self, amt=None, decode_content=False):
        self.streaming.set()
        self._ended.wait()
        if self._failure is not None:
            raise self._failure
        yield from ()

    def close(self) -> None:
        self._ended.set()

    def release_conn(self) -> None:
        pass


class _Refused(Exception):
    status, reason = 503, "Service Unavailable"


def test_a_reconnect_after_a_quiet_healthy_stretch_is_down_from_the_failure_and_a_silent_one_goes_on_from_it(
        monkeypatch):
    """A real API server writes nothing on a quiet cluster until its bookmark ~2 s before the watch ends, so the
    last word can be 28 s old when a healthy watch is cut: a 2 s reconnect is 2 s down, not 30 (stale_after_s).
    A reconnect that then says nothing goes on with that outage, and the next reconnect does not hide it again."""
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(kubernetes_watch, "time", SimpleNamespace(time=lambda: clock.now, monotonic=time.monotonic))
    monkeypatch.setattr(kubernetes_watch, "_BACKOFF_FIRST_S", 0.001)
    requests: queue.Queue[_WatchRequest] = queue.Queue()
    made: list[_WatchRequest] = []
    closing, queueing = threading.Event(), threading.Lock()

    def call(**_):
        with queueing:  # once closing, no request is left unanswered
            if closing.is_set():
                raise _Refused()
            request = _WatchRequest()
            made.append(request)
            requests.put(request)
        return request.respond()

    watch = ResourceWatch("pods", call, replace=lambda items: False, apply=lambda kind, obj: False,
                          lock=threading.Lock(), on_news=lambda: None, watch_s=30.0)
    assert silence_s(30.0) == 40.0
    watch.start()
    try:
        first = requests.get(timeout=10)
        first.answer()
        first.streaming.wait(10)
        clock.now = 1028.0  # a quiet, healthy cluster: no word for 28 s
        assert watch.trouble() is None
        first.end(ConnectionResetError("connection reset by peer"))  # the API server restarts
        reconnect = requests.get(timeout=10)
        clock.now = 1030.0
        reset = "ConnectionResetError: connection reset by peer"
        assert watch.trouble() == (1028.0, reset), "down 2 s, not since the last word"

        reconnect.answer()  # back, quiet as a healthy stream is until its bookmark: not reported meanwhile
        reconnect.streaming.wait(10)
        assert watch.trouble() is None
        clock.now = 1071.0  # a stalled path: no byte for longer than any healthy watch is quiet
        assert watch.trouble() == (1028.0, "no word from the API server for 41 s since it reconnected after: "
                                           + reset), "the outage it was to end goes on, from its start"
        reconnect.end(TimeoutError("read timed out"))  # the read timeout ends it
        again = requests.get(timeout=10)
        assert watch.trouble() == (1028.0, "TimeoutError: read timed out"), "retrying does not restart the clock"
        again.answer()  # accepted again, and quiet: this one no longer hides the outage
        again.streaming.wait(10)
        assert watch.trouble() == (1028.0, "TimeoutError: read timed out")
    finally:
        with queueing:
            closing.set()
        for request in made:
            request.answer(_Refused())
            request.end()
        watch.stop()
