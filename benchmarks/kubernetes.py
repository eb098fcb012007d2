"""Kubernetes: a watch event to the provider's view with 1,000 pods, the provider's CPU, and signal to new size.

Three measurements, against the fake API server (``tests/emulator/fake_kubernetes.py``)
in this process, over HTTP through the real ``kubernetes`` client:

* **event -> view**: the kubernetes provider runs in a child process, as in a driver
  (its discovery loop wakes on the provider's news, else polls every second), with
  1,000 pods on 100 nodes listed. A pod gets ``DisruptionTarget``, or a node gets
  ``karpenter.sh/disrupted`` (10 pods): the time from the change in the fake to the
  child's first snapshot that shows it (both clocks are this machine's wall clock);
* **CPU**: the child's CPU time (user + system) while it watches the 1,000 pods,
  idle and under churn (every node's status and every pod's status updated, about
  27 events a second, none of them a signal), as a fraction of one core;
* **signal -> new size**: a job on three loopback pods (``--address-map``; 20 ms
  steps, a commit every 2 steps, ``--discovery-interval 1``) gets each signal for one
  pod (``DisruptionTarget``; a graceful delete, 30 s grace; its node tainted): from
  the change to the survivors' first commit at size 2, and the steps they lost.

Run: ``.venv/bin/python benchmarks/kubernetes.py [--quick] [--runs 5] [--doc PATH]``;
it prints a paragraph and writes it as section ``kubernetes`` of docs/benchmarks.md,
with its glance row.
"""

from __future__ import annotations

import argparse
import json
import queue
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import docsection
from common import PY, REPO, pct, stamp, to_new_size, where

# This file's name is the client's: the client must not import this script. Its folder leaves the path
# once docsection and common are in.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))

PODS, NODES = 1000, 100
STEP_S, COMMIT_EVERY = 0.02, 2
TARGET = ("Kubernetes: a watch event → the provider's view (1,000 pods listed) ≤ 0.5 s; a signal "
          "(DisruptionTarget, delete, taint) → stepping at the new size ≤ 1 s + one step, 0 lost")
SECTION = "Kubernetes: watch and signals"


# ------------------------------------------------------------------------------ the child: a driver's discovery loop
def child(kubeconfig: str, namespace: str) -> None:
    """Find like the driver's poller (woken by news, else every second); print each changed snapshot."""
    from cloud_elastic.providers import registry

    discovery = registry.load("kubernetes").from_options(
        {"selector": "app=llm", "namespace": namespace, "kubeconfig": kubeconfig})
    started = time.perf_counter()
    discovery.sdk  # the client's import, apart from the lists
    imported = time.perf_counter()
    snapshot = discovery.find()
    print(json.dumps({"listed": len(snapshot.ready), "list_s": time.perf_counter() - imported,
                      "import_s": imported - started}), flush=True)
    woken = threading.Event()
    discovery.wake_on_news(woken.set)

    def commands() -> None:
        for line in sys.stdin:
            if line.strip() == "cpu":
                use = resource.getrusage(resource.RUSAGE_SELF)
                print(json.dumps({"cpu": use.ru_utime + use.ru_stime, "wall": time.monotonic()}), flush=True)
        discovery.close()
        sys.exit(0)

    threading.Thread(target=commands, daemon=True).start()
    last = snapshot
    while True:
        woken.wait(1.0)
        woken.clear()
        snapshot = discovery.find()
        if snapshot != last:
            last = snapshot
            print(json.dumps({"t": time.time(), "draining": len(snapshot.draining)}), flush=True)


class Child:
    """The child process and its JSON lines."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.proc = subprocess.Popen([PY, __file__, "--child", str(kubeconfig), namespace], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=REPO)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def next(self, key: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the provider's process gave no {key!r} (exit status {self.proc.poll()})")
                continue
            if key in item:
                return item

    def draining(self, count: int, timeout: float = 30.0) -> float:
        """When the child first saw ``count`` draining hosts."""
        while True:
            item = self.next("draining", timeout)
            if item["draining"] >= count:
                return item["t"]

    def cpu(self) -> tuple[float, float]:
        self.proc.stdin.write("cpu\n")
        self.proc.stdin.flush()
        item = self.next("cpu")
        return item["cpu"], item["wall"]

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def watch_figures(fake, trials: int, idle_s: float, churn_s: float) -> dict:
    ns = "bench-view"
    for n in range(NODES):
        fake.add_node(f"bench-n{n}")
    for i in range(PODS):
        fake.add_pod(f"p{i}", f"10.98.{i // 250}.{i % 250 + 1}", namespace=ns, node=f"bench-n{i % NODES}",
                     gpus=8, created=float(i))
    proc = Child(fake.kubeconfig, ns)
    try:
        listed = proc.next("listed", timeout=120)
        time.sleep(1.0)  # the watches start with the loop's first wake-up call
        pod_s, node_s, draining = [], [], 0
        for k in range(trials):
            sent = time.time()
            fake.disrupt(f"p{k * 7}", namespace=ns)
            draining += 1
            pod_s.append(proc.draining(draining) - sent)
        for k in range(max(1, trials // 4)):
            node = NODES - 1 - k  # pods k*7 (k < trials) are on other nodes for any trials <= 14
            sent = time.time()
            fake.taint(f"bench-n{node}", "karpenter.sh/disrupted")
            draining += sum(1 for i in range(node, PODS, NODES) if i % 7 or i // 7 >= trials)
            node_s.append(proc.draining(draining) - sent)
        cpu0, wall0 = proc.cpu()
        time.sleep(idle_s)
        cpu1, wall1 = proc.cpu()
        events, end = 0, time.monotonic() + churn_s
        while time.monotonic() < end:  # ~27 events/s: each node every ~10 s, each pod every ~60 s
            fake.touch_node(f"bench-n{events % NODES}")
            for _ in range(2):
                fake.change_pod(f"p{(events * 2 + _) % PODS}", ns)
            events += 1
            time.sleep(0.11)
        cpu2, wall2 = proc.cpu()
    finally:
        proc.close()
    return {"list_s": listed["list_s"], "import_s": listed["import_s"], "pod_s": pod_s, "node_s": node_s,
            "idle_core": (cpu1 - cpu0) / (wall1 - wall0), "churn_core": (cpu2 - cpu1) / (wall2 - wall1),
            "churn_rate": events * 3 / churn_s}


# ------------------------------------------------------------------------------ signal -> new size, real jobs
def signal_run(fake, signal: str, run: int, steps: int) -> tuple[float, int]:
    from tests.integration.harness import Job, probe_cmd

    ns, net = f"bench-{signal}-{run}", 97
    for i in range(3):
        fake.add_node(f"{ns}-n{i}")
        fake.add_pod(f"p{i}", f"10.97.{net}.{i + 1}", namespace=ns, node=f"{ns}-n{i}", created=float(i))
    job = Job(["run", "-np", "3", "--min-np", "1", "--discovery-interval", "1", "--k8s-selector", "app=llm",
               "--k8s-namespace", ns, "--kubeconfig", str(fake.kubeconfig),
               "--address-map", f"10.97.{net}.0/24=127.0.{net}.0/24",
               *probe_cmd("--steps", str(steps), "--step-sleep", str(STEP_S), "--commit-every", str(COMMIT_EVERY))])
    try:
        job.wait_event("commit", rank=0, step=40, timeout=120)
        sent = time.monotonic()
        if signal == "disruption":
            fake.disrupt("p2", namespace=ns)
        elif signal == "delete":
            fake.delete_pod("p2", grace_s=30, namespace=ns)
        else:
            fake.taint(f"{ns}-n2", "karpenter.sh/disrupted")
        when, lost = to_new_size(job, 2)
    finally:
        if job.proc.poll() is None:
            job.kill()
    return when - sent, lost


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs=2, metavar=("KUBECONFIG", "NAMESPACE"), help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=None, help="job runs per signal (default 5; 1 with --quick)")
    p.add_argument("--trials", type=int, default=None, help="pod signals on the 1,000 pods (default 12; 4 quick)")
    docsection.add_arguments(p)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    from tests.emulator.fake_kubernetes import FakeKubernetes

    runs, trials = args.runs or (1 if args.quick else 5), args.trials or (4 if args.quick else 12)
    idle_s, churn_s = (3.0, 3.0) if args.quick else (20.0, 20.0)
    with FakeKubernetes() as fake, tempfile.TemporaryDirectory() as tmp:
        fake.kubeconfig = fake.write_kubeconfig(Path(tmp))
        view = watch_figures(fake, trials, idle_s, churn_s)
        print(f"event -> view: pods {view['pod_s']}, nodes {view['node_s']}; CPU idle {view['idle_core']:.4f}, "
              f"churn {view['churn_core']:.4f} core", flush=True)
        signals = {}
        for signal in ("disruption", "delete", "taint"):
            figures = [signal_run(fake, signal, i, 160 if args.quick else 400) for i in range(runs)]
            signals[signal] = figures
            print(f"{signal}: {figures}", flush=True)
    every = view["pod_s"] + view["node_s"]
    view_p95 = pct(every, 0.95)
    budget = 1.0 + STEP_S
    worst = max((pct([f[0] for f in figs], 0.95), name) for name, figs in signals.items())
    most_lost = max(f[1] for figs in signals.values() for f in figs)
    names = {"disruption": "`DisruptionTarget`", "delete": "a graceful delete (30 s grace)",
             "taint": "a node taint (`karpenter.sh/disrupted`)"}

    def p50_p95(values: list[float], digits: int) -> str:
        return f"{statistics.median(values):.{digits}f}/{pct(values, 0.95):.{digits}f} s"

    steps = ", ".join(f"{names[s]} {p50_p95([f[0] for f in figs], 2)}" for s, figs in signals.items())
    text = (
        f"{stamp(f'benchmarks/kubernetes.py --runs {runs} --trials {trials}')} The fake API server "
        f"(`tests/emulator/fake_kubernetes.py`) over HTTP, the real `kubernetes` client; {PODS:,} pods on {NODES} "
        f"nodes listed in {view['list_s']:.2f} s (after {view['import_s']:.2f} s importing the client), the provider "
        "in a child process finding as the driver does. A pod's `DisruptionTarget` reached its view in "
        f"{p50_p95(view['pod_s'], 3)} (p50/p95, {len(view['pod_s'])} signals), a node taint (10 pods) in "
        f"{p50_p95(view['node_s'], 3)} ({len(view['node_s'])}); its CPU watching them: "
        f"{view['idle_core'] * 100:.2f} % of a core idle, {view['churn_core'] * 100:.2f} % at "
        f"{view['churn_rate']:.0f} events/s that are not signals (node and pod status updates). On a job of three "
        f"loopback pods ({STEP_S * 1000:.0f} ms steps, a commit every {COMMIT_EVERY}, `--discovery-interval 1`), "
        f"from the change to stepping at size 2, p50/p95 over {runs} run(s) each: {steps}; {most_lost} steps lost.")
    met = view_p95 <= 0.5 and worst[0] <= budget and most_lost == 0
    glance = [[TARGET, f"view p95 {view_p95:.3f} s ({len(every)} signals); new size p95 {worst[0]:.2f} s "
               f"(slowest: {worst[1]}), {most_lost} lost, {runs} run(s) a signal",
               f"{max(view_p95 / 0.5, worst[0] / budget):.2f}", where(SECTION), docsection.verdict(met)]]
    docsection.publish(args, "kubernetes", SECTION, text, glance)


if __name__ == "__main__":
    main()
