"""Render the Kustomize overlays of deploy/kubernetes/ and check the properties a user relies on.

Each check takes the rendered objects of one overlay and the overlay's :class:`Spec`, and returns a
list of problems (empty when the property holds), so the same function serves the real tree
(``test_manifests.py``) and copies broken on purpose (``test_mutations.py``, which shows that
each check can fail).

The expected values (RBAC verbs, spot labels and taints, the drain taints) are the specification
from issue 40 and the clouds' documentation, written here once.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from cloud_elastic.providers.kubernetes_view import DRAIN_TAINTS as PROVIDER_DRAIN_TAINTS
from cloud_elastic.providers.kubernetes_view import SLOTS_ANNOTATION, SOFT_TAINTS

from .objects import (GPU, can_land_on, container, driver_job, flag, kind_name, of_kind, pod_spec, resolved_args,
                      selector_matches, slots_per_pod, strings, tolerates, workers)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"

#: Kubernetes versions whose API schemas every rendered object must satisfy (kubernetes-validate,
#: strict: unknown fields are errors). The oldest minor the managed clusters still run, and the
#: newest kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")

#: Fail instead of skipping when kubectl is missing (CI always does).
REQUIRE_ENV = "CLOUD_ELASTIC_REQUIRE_KUBECTL"

NAMESPACE = "cloud-elastic"
READ_VERBS = {"list", "watch"}

#: Taints that announce a node's end or advise leaving it: the provider's own (hard and soft), the
#: older Karpenter's, a cordon's and an unready node's. A worker pod must tolerate none of them: a
#: NoSchedule one would let a new pod land on a node being drained.
DRAIN_TAINTS = (
    *((key, "NoSchedule") for key in (*PROVIDER_DRAIN_TAINTS, *SOFT_TAINTS)),
    ("karpenter.sh/disruption", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ("node.kubernetes.io/not-ready", "NoExecute"),
)

#: Every spot label the overlays know: the driver must avoid all of them.
SPOT_LABELS = {
    "karpenter.sh/capacity-type": "spot",
    "eks.amazonaws.com/capacityType": "SPOT",
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
    "kubernetes.azure.com/scalesetpriority": "spot",
}


@dataclass(frozen=True)
class Spec:
    """What one overlay promises: where its workers run and how big the job is."""

    name: str
    spot_label: tuple[str, str] | None  # the node label that selects spot capacity
    spot_taint: tuple[str, str, str] | None  # key, value, effect the workers must tolerate
    gpus: bool  # workers have a GPU limit (else the slots annotation)
    image: str  # what `images:` sets
    min_grace_s: int  # a step plus a commit plus margin
    on_demand_labels: dict[str, str]  # an on-demand CPU node's labels: the driver must fit there
    checkpoints: bool = False  # the driver has --checkpoint-dir (components/checkpoints), and only then restarts


OVERLAYS = {
    "eks-karpenter": Spec("eks-karpenter", ("karpenter.sh/capacity-type", "spot"),
                          ("karpenter.sh/capacity-type", "spot", "NoSchedule"), True,
                          "123456789012.dkr.ecr.us-east-1.amazonaws.com/cloud-elastic:v1", 60,
                          {"karpenter.sh/capacity-type": "on-demand"}, checkpoints=True),
    "gke-spot": Spec("gke-spot", ("cloud.google.com/gke-spot", "true"),
                     ("cloud.google.com/gke-spot", "true", "NoSchedule"), True,
                     "us-docker.pkg.dev/my-project/cloud-elastic/cloud-elastic:v1", 60, {}, checkpoints=True),
    "aks-spot": Spec("aks-spot", ("kubernetes.azure.com/scalesetpriority", "spot"),
                     ("kubernetes.azure.com/scalesetpriority", "spot", "NoSchedule"), True,
                     "myregistry.azurecr.io/cloud-elastic:v1", 60, {}, checkpoints=True),
    "kind": Spec("kind", None, None, False, "cloud-elastic:dev", 30, {}),
}


# --- rendering -------------------------------------------------------------------------------


def find_kubectl() -> str | None:
    return shutil.which("kubectl") or next((p for p in ("/usr/bin/kubectl", "/usr/local/bin/kubectl")
                                            if os.access(p, os.X_OK)), None)


#: The oldest kubectl whose kustomize (v5) renders the overlays.
MIN_KUBECTL_MINOR = 27


def kubectl_minor(kubectl: str) -> int | None:
    """The client's minor version (``32`` for 1.32.4), or None when it cannot say."""
    try:
        out = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL).stdout
        return int(re.match(r"\d+", json.loads(out)["clientVersion"]["minor"])[0])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return None


def required() -> bool:
    """Whether a missing kubectl (or kubernetes-validate) fails the tests rather than skipping them."""
    return bool(os.environ.get("CI")) or os.environ.get(REQUIRE_ENV, "") not in ("", "0")


class RenderError(Exception):
    """``kubectl kustomize`` refused an overlay; the message is its output."""


def render(kubectl: str, overlay_dir: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize DIR`` prints: offline, nothing is sent anywhere."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["KUBECONFIG"] = os.devnull
    result = subprocess.run([kubectl, "kustomize", str(overlay_dir)], capture_output=True, text=True,
                            timeout=60, env=env, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise RenderError(f"kubectl kustomize {overlay_dir} failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def schema_problems(objects: list[dict[str, Any]], versions=KUBERNETES_VERSIONS) -> list[str]:
    """Each object against the API schema of each version (kubernetes-validate, strict)."""
    problems = []
    for version in versions:
        for obj in objects:
            problem = _schema_problem(version, json.dumps(obj, sort_keys=True))
            if problem is not None:
                problems.append(f"{version} {kind_name(obj)}: {problem}")
    return problems


@functools.lru_cache(maxsize=4096)
def _schema_problem(version: str, obj_json: str) -> str | None:
    """One object (as sorted JSON) against one version's schema: None, or what is wrong.

    Cached: a mutation changes one object of an overlay's dozen, and kubernetes-validate parses its
    schema files again at every call (a megabyte of ``_definitions.json``, about 0.15 s an object), which
    made the mutation tests minutes of a test run (the files are parsed once, below). The same object always gets the same answer."""
    import kubernetes_validate

    if not hasattr(kubernetes_validate.utils.schema_contents, "cache_info"):
        # It reads and parses the schema file of the object's kind and the whole _definitions.json at every
        # call; the files do not change during a run, so each is parsed once (nothing else differs).
        kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=64)(
            kubernetes_validate.utils.schema_contents)
    try:
        kubernetes_validate.validate(json.loads(obj_json), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"{exc.message} (at {where or 'top level'})"
    except kubernetes_validate.utils.SchemaNotFoundError as exc:
        return f"no schema ({exc})"
    return None


# --- the properties -----------------------------------------------------------------------------

Check = Callable[[list[dict[str, Any]], Spec], list[str]]
CHECKS: dict[str, Check] = {}


def check(fn: Check) -> Check:
    CHECKS[fn.__name__] = fn
    return fn


@check
def rbac_least(objects, spec: Spec) -> list[str]:
    """Pods list/watch in the namespace (Role), nodes list/watch (ClusterRole), bound to the
    driver's ServiceAccount, and nothing else: no other role, no other verb, resource or group."""
    problems = []
    roles, cluster_roles = of_kind(objects, "Role"), of_kind(objects, "ClusterRole")
    if len(roles) != 1 or len(cluster_roles) != 1:
        return [f"expected one Role and one ClusterRole, found {len(roles)} and {len(cluster_roles)}"]
    for role, resource in ((roles[0], "pods"), (cluster_roles[0], "nodes")):
        rules = role.get("rules", [])
        if role.get("aggregationRule"):
            problems.append(f"{kind_name(role)} aggregates other roles")
        wanted = [{"apiGroups": [""], "resources": [resource], "verbs": sorted(READ_VERBS)}]
        got = [{"apiGroups": r.get("apiGroups"), "resources": r.get("resources"), "verbs": sorted(r.get("verbs", [])),
                **({"resourceNames": r["resourceNames"]} if "resourceNames" in r else {}),
                **({"nonResourceURLs": r["nonResourceURLs"]} if "nonResourceURLs" in r else {})} for r in rules]
        if got != wanted:
            problems.append(f"{kind_name(role)} grants {got}; it must grant exactly {wanted}")
    sa = of_kind(objects, "ServiceAccount")
    job = driver_job(objects)
    if len(sa) != 1 or job is None:
        return problems + ["expected one ServiceAccount and the driver Job"]
    account, namespace = sa[0]["metadata"]["name"], sa[0]["metadata"].get("namespace")
    if pod_spec(job).get("serviceAccountName") != account:
        problems.append(f"the driver runs as {pod_spec(job).get('serviceAccountName')!r}, not {account!r}")
    for kind, role in (("RoleBinding", roles[0]), ("ClusterRoleBinding", cluster_roles[0])):
        bindings = of_kind(objects, kind)
        if len(bindings) != 1:
            problems.append(f"expected one {kind}, found {len(bindings)}")
            continue
        b = bindings[0]
        if b["roleRef"] != {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"], "name": role["metadata"]["name"]}:
            problems.append(f"{kind_name(b)} binds {b['roleRef']}, not {kind_name(role)}")
        subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        if [dict(s) for s in b.get("subjects", [])] != [subject]:
            problems.append(f"{kind_name(b)} binds {b.get('subjects')}; it must bind exactly {subject}")
    ss = workers(objects)
    if ss is not None and pod_spec(ss).get("automountServiceAccountToken") is not False:
        problems.append("the worker pods mount a service account token: they need no API access")
    return problems


@check
def cluster_names_per_job(objects, spec: Spec) -> list[str]:
    """The ClusterRole and ClusterRoleBinding, whose names the whole cluster shares, end with the job's namespace
    (its ServiceAccount's): a job in another namespace then has a pair of its own, instead of rebinding this
    one's to its account when applied and taking node access from both when deleted (review s61 rvK)."""
    accounts = of_kind(objects, "ServiceAccount")
    namespace = accounts[0]["metadata"].get("namespace") if len(accounts) == 1 else None
    return [f"{kind_name(o)} does not end with the job's namespace ({namespace}): a job in another namespace "
            "would share it" for o in [*of_kind(objects, "ClusterRole"), *of_kind(objects, "ClusterRoleBinding")]
            if not namespace or not o["metadata"]["name"].endswith(f"-{namespace}")]


@check
def one_driver(objects, spec: Spec) -> list[str]:
    """One driver pod at a time, never beside its replacement, never started again once done."""
    jobs = [o for o in objects if o.get("kind") in ("Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Pod")
            and any("run" in (c.get("command", []) + c.get("args", []))[:2] and "cloud-elastic" in c.get("command", [])[:1]
                    for c in (o["spec"].get("template", {}).get("spec", o["spec"]).get("containers", [])))]
    if len(jobs) != 1 or jobs[0]["kind"] != "Job":
        return [f"the driver must be exactly one Job; found {[kind_name(j) for j in jobs]}"]
    job, problems = jobs[0], []
    for field, wanted in (("parallelism", 1), ("completions", 1), ("podReplacementPolicy", "Failed")):
        if job["spec"].get(field) != wanted:
            problems.append(f"the driver Job's {field} is {job['spec'].get(field)!r}, not {wanted!r}")
    return problems


#: Checkpoint URLs that the driver and the worker pods share (a path would be each pod's own disk).
SHARED_STORAGE = ("s3://", "gs://", "gcs://", "az://", "abfs://", "abfss://")


@check
def driver_restarts_only_with_checkpoints(objects, spec: Spec) -> list[str]:
    """The driver is restarted (in place, or in a new pod) only when it has a --checkpoint-dir in object storage:
    only then does a restarted driver adopt its workers or wait for them and resume. Without one it would train a
    new job from initial weights beside the running ones. A restart in place must give it a new pid (a shared
    PID namespace), or, as PID 1 again, it takes its predecessor's recorded pid for a live driver and refuses."""
    job = driver_job(objects)
    if job is None:
        return ["no driver Job"]
    pod, problems = pod_spec(job), []
    policy, backoff = pod.get("restartPolicy"), job["spec"].get("backoffLimit", 6)  # the API's default: 6
    url = flag(resolved_args(objects, job), "--checkpoint-dir")
    if (url is not None) != spec.checkpoints:
        problems.append(f"the driver's --checkpoint-dir is {url!r}; the {spec.name} overlay "
                        f"{'has' if spec.checkpoints else 'has none'} (components/checkpoints)")
    if url is None:
        if policy != "Never" or backoff != 0:
            problems.append(f"the driver is restarted (restartPolicy {policy}, backoffLimit {backoff}) without "
                            "--checkpoint-dir: it would train a new job from initial weights beside the workers")
        return problems
    if not url.startswith(SHARED_STORAGE):
        problems.append(f"--checkpoint-dir {url!r} is not object storage that the driver and the worker pods share")
    if policy != "OnFailure" or not isinstance(backoff, int) or backoff < 1:
        problems.append(f"the driver with --checkpoint-dir is not restarted in place (restartPolicy {policy}, "
                        f"backoffLimit {backoff}): its crash ends a job it could adopt or resume")
    if pod.get("shareProcessNamespace") is not True:
        problems.append("the driver pod has no shared PID namespace: restarted as PID 1, the driver takes its "
                        "predecessor's pid (1) for a live driver of the job and refuses to start")
    return problems


@check
def driver_on_demand(objects, spec: Spec) -> list[str]:
    """The driver never lands on spot capacity: no node with any known spot label admits it, and it
    tolerates no spot taint."""
    job = driver_job(objects)
    if job is None:
        return ["no driver Job"]
    problems, pod = [], pod_spec(job)
    if not can_land_on(pod, {**spec.on_demand_labels, "kubernetes.io/hostname": "n1"}):
        problems.append(f"the driver fits no on-demand node (labels {spec.on_demand_labels})")
    for key, value in SPOT_LABELS.items():
        if can_land_on(pod, {key: value}):
            problems.append(f"the driver can be scheduled on a node labelled {key}={value}")
    for name, s in OVERLAYS.items():
        if s.spot_taint and tolerates(pod.get("tolerations", []), *s.spot_taint):
            problems.append(f"the driver tolerates the spot taint {s.spot_taint} ({name})")
    return problems


@check
def workers_on_spot(objects, spec: Spec) -> list[str]:
    """Workers run only on the overlay's spot capacity, tolerate its taint, and tolerate no drain
    taint (nor everything)."""
    ss = workers(objects)
    if ss is None:
        return ["no worker StatefulSet"]
    problems, pod = [], pod_spec(ss)
    tolerations = pod.get("tolerations", [])
    if spec.spot_label:
        key, value = spec.spot_label
        if not can_land_on(pod, {key: value}):
            problems.append(f"workers cannot be scheduled on spot nodes ({key}={value})")
        if can_land_on(pod, {}) or can_land_on(pod, {key: "on-demand"}):
            problems.append(f"workers can be scheduled off spot capacity (they do not require {key}={value})")
    if spec.spot_taint and not tolerates(tolerations, *spec.spot_taint):
        problems.append(f"workers do not tolerate the spot taint {spec.spot_taint}")
    if spec.gpus and not tolerates(tolerations, GPU, "present", "NoSchedule"):
        problems.append(f"workers do not tolerate the {GPU} taint of GPU node pools")
    for key, effect in DRAIN_TAINTS:
        if tolerates(tolerations, key, "", effect) or tolerates(tolerations, key, "true", effect):
            problems.append(f"workers tolerate the drain taint {key}:{effect}")
    return problems


@check
def grace_period(objects, spec: Spec) -> list[str]:
    """The workers' terminationGracePeriodSeconds is set and covers a step plus a commit."""
    ss = workers(objects)
    if ss is None:
        return ["no worker StatefulSet"]
    grace = pod_spec(ss).get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or grace < spec.min_grace_s:
        return [f"workers' terminationGracePeriodSeconds is {grace!r}; at least {spec.min_grace_s} s "
                "(a step plus a commit plus a margin)"]
    return []


@check
def gpu_limits(objects, spec: Spec) -> list[str]:
    """Each worker pod asks for whole GPUs (its slots), or, without GPUs, carries its slots as an
    annotation."""
    ss = workers(objects)
    if ss is None or container(ss, "worker") is None:
        return ["no worker StatefulSet with a 'worker' container"]
    resources = container(ss, "worker").get("resources", {})
    limit = resources.get("limits", {}).get(GPU)
    annotation = ss["spec"]["template"].get("metadata", {}).get("annotations", {}).get(SLOTS_ANNOTATION)
    if spec.gpus:
        if not isinstance(limit, int) or limit < 1:
            return [f"workers' {GPU} limit is {limit!r}, not a whole number of GPUs >= 1"]
        if resources.get("requests", {}).get(GPU, limit) != limit:
            return [f"workers' {GPU} request differs from its limit"]
        if annotation is not None:
            return [f"GPU workers also carry {SLOTS_ANNOTATION}; the GPU limit is their slots"]
        return []
    if limit is not None:
        return [f"the CPU overlay's workers ask for {GPU}"]
    if annotation is None or not str(annotation).isdigit() or int(annotation) < 1:
        return [f"CPU workers' {SLOTS_ANNOTATION} annotation is {annotation!r}, not a positive number"]
    return []


#: What a 4-vCPU/16-GiB GPU node (g5.xlarge; GKE's g2-standard-4 and AKS's Standard_NC4as_T4_v3 have 4 vCPU too)
#: offers pods, its allocatable (about 3920m everywhere; memory about 14.5 GiB on EKS, 13.3 GiB on GKE, whose
#: reservation is the largest), less room for the node's DaemonSets (an estimate: 400m and 1 GiB).
SMALL_NODE_CPU_M, SMALL_NODE_MEMORY = 3920 - 400, (13.3 - 1) * 2**30
MEMORY_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
                "Ti": 2**40}


def quantity(value: Any, memory: bool) -> float | None:
    """A resource quantity as a number: millicores (``"3"``, ``"500m"``), or bytes (``"12Gi"``); None if unreadable."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(m|[kMGT]i?|)", str(value).strip())
    if match is None:
        return None
    number, unit = float(match[1]), match[2]
    if not memory:
        return number if unit == "m" else number * 1000 if unit == "" else None
    return number * MEMORY_UNITS[unit] if unit in MEMORY_UNITS else None


@check
def workers_fit_a_node(objects, spec: Spec) -> list[str]:
    """A worker pod's requests fit a 4-vCPU/16-GiB node's allocatable with room for its DaemonSets: a pod that
    fits no node stays Pending for good. A limit without a request is the request."""
    ss = workers(objects)
    if ss is None or container(ss, "worker") is None:
        return ["no worker StatefulSet with a 'worker' container"]
    resources, problems = container(ss, "worker").get("resources", {}), []
    for name, most, memory in (("cpu", SMALL_NODE_CPU_M, False), ("memory", SMALL_NODE_MEMORY, True)):
        asked = resources.get("requests", {}).get(name, resources.get("limits", {}).get(name))
        amount = 0.0 if asked is None else quantity(asked, memory)
        if amount is None or amount > most:
            room = f"{most / 2**30:.1f} GiB" if memory else f"{most:.0f}m"
            problems.append(f"workers request {name} {asked!r}: more than a 4-vCPU/16-GiB node offers pods "
                            f"(at most {room})")
    return problems


@check
def one_pod_per_node(objects, spec: Spec) -> list[str]:
    """A required pod anti-affinity on the node's hostname against the workers' own labels."""
    ss = workers(objects)
    if ss is None:
        return ["no worker StatefulSet"]
    labels = ss["spec"]["template"]["metadata"].get("labels", {})
    terms = (pod_spec(ss).get("affinity", {}).get("podAntiAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    for term in terms:
        selector = term.get("labelSelector", {})
        if (term.get("topologyKey") == "kubernetes.io/hostname" and not selector.get("matchExpressions")
                and selector.get("matchLabels") and selector_matches(
                    ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items()), labels)
                and not term.get("namespaceSelector") and not term.get("namespaces")):
            return []
    return ["workers have no required podAntiAffinity on kubernetes.io/hostname that matches their own labels"]


@check
def drains_one_pod_at_a_time(objects, spec: Spec) -> list[str]:
    """One PodDisruptionBudget over the worker pods, in their namespace: a voluntary disruption (a drain, an upgrade,
    Karpenter's consolidation) evicts at most one at a time, and never waits on a pod that is not Ready (review h30:
    several drains at once took every worker together)."""
    ss, budgets = workers(objects), of_kind(objects, "PodDisruptionBudget")
    if ss is None or len(budgets) != 1:
        return [f"expected one PodDisruptionBudget over the workers, found {len(budgets)}"]
    b, labels = budgets[0], ss["spec"]["template"]["metadata"].get("labels", {})
    selector, problems = b["spec"].get("selector", {}), []
    if selector.get("matchExpressions") or not selector.get("matchLabels") or not selector_matches(
            ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items()), labels):
        problems.append(f"{kind_name(b)} selects {selector}, not the worker pods {labels}")
    if b["metadata"].get("namespace") != ss["metadata"].get("namespace"):
        problems.append(f"{kind_name(b)} is in namespace {b['metadata'].get('namespace')}, not the workers'")
    if b["spec"].get("maxUnavailable") != 1 or "minAvailable" in b["spec"]:
        problems.append(f"{kind_name(b)} lets {b['spec'].get('maxUnavailable', b['spec'].get('minAvailable'))!r} "
                        "go at once (maxUnavailable), not 1")
    if b["spec"].get("unhealthyPodEvictionPolicy") != "AlwaysAllow":
        problems.append(f"{kind_name(b)} holds drains up for pods that are not Ready (unhealthyPodEvictionPolicy)")
    return problems


PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----|\b(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+) AAAA")
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|PRIVATE|CREDENTIAL|API_?KEY", re.I)


@check
def no_inline_secret(objects, spec: Spec) -> list[str]:
    """No key material or secret value is written in any manifest: no Secret object, no key text,
    no literal env value under a secret's name. The driver gets only the private key, the workers
    only the public one."""
    problems = []
    for obj in objects:
        if obj.get("kind") == "Secret":
            problems.append(f"{kind_name(obj)} is in the manifests: create it from your key files instead")
        for s in strings(obj):
            if PRIVATE_KEY.search(s):
                problems.append(f"{kind_name(obj)} contains key material")
                break
        template = obj.get("spec", {}).get("template", {}).get("spec", {})
        for c in [*template.get("containers", []), *template.get("initContainers", [])]:
            for var in c.get("env", []):
                if "value" in var and SECRET_NAME.search(var["name"]):
                    problems.append(f"{kind_name(obj)} sets {var['name']} inline")
    for workload, key, other in ((driver_job(objects), "id_ed25519", "authorized_keys"),
                                 (workers(objects), "authorized_keys", "id_ed25519")):
        if workload is None:
            continue
        items = [item["key"] for v in pod_spec(workload).get("volumes", []) if "secret" in v
                 for item in v["secret"].get("items") or [{"key": "(every key)"}]]
        if items != [key]:
            problems.append(f"{kind_name(workload)} mounts {items} of the SSH Secret; it needs {key!r} only")
    return problems


@check
def selector_finds_workers(objects, spec: Spec) -> list[str]:
    """The driver's --k8s-selector selects the worker pods (and not the driver), in the namespace the
    workers are in."""
    job, ss = driver_job(objects), workers(objects)
    if job is None or ss is None:
        return ["no driver Job or worker StatefulSet"]
    args = resolved_args(objects, job)
    selector, namespace = flag(args, "--k8s-selector"), flag(args, "--k8s-namespace")
    problems = []
    if not selector:
        return [f"the driver's command has no --k8s-selector: {args}"]
    if not selector_matches(selector, ss["spec"]["template"]["metadata"].get("labels", {})):
        problems.append(f"--k8s-selector {selector} does not select the worker pods")
    if selector_matches(selector, job["spec"]["template"]["metadata"].get("labels", {})):
        problems.append(f"--k8s-selector {selector} also selects the driver's own pod")
    if namespace is not None and namespace != ss["metadata"].get("namespace"):
        problems.append(f"--k8s-namespace {namespace} is not the workers' namespace {ss['metadata'].get('namespace')}")
    return problems


@check
def sizes_agree(objects, spec: Spec) -> list[str]:
    """min-np <= np <= max-np, and the workers' replicas times their slots are max-np: fewer pods
    never reach it, more hold GPUs the job cannot use."""
    job, ss = driver_job(objects), workers(objects)
    if job is None or ss is None:
        return ["no driver Job or worker StatefulSet"]
    args = resolved_args(objects, job)
    values = {f: flag(args, f) for f in ("-np", "--min-np", "--max-np")}
    if not all(v is not None and v.isdigit() for v in values.values()):
        return [f"the driver's -np/--min-np/--max-np do not resolve to numbers: {values}"]
    np_, min_np, max_np = (int(values[f]) for f in ("-np", "--min-np", "--max-np"))
    problems = []
    if not 1 <= min_np <= np_ <= max_np:
        problems.append(f"expected 1 <= --min-np ({min_np}) <= -np ({np_}) <= --max-np ({max_np})")
    slots, replicas = slots_per_pod(ss), ss["spec"].get("replicas", 1)
    if slots is None or replicas * slots != max_np:
        problems.append(f"{replicas} worker pods x {slots} slots != --max-np {max_np}")
    return problems


@check
def ssh_agrees(objects, spec: Spec) -> list[str]:
    """The driver reaches sshd where it listens, as the user the pods run as, with the key file it
    mounts."""
    job, ss = driver_job(objects), workers(objects)
    if job is None or ss is None:
        return ["no driver Job or worker StatefulSet"]
    args, worker = resolved_args(objects, job), container(ss, "worker") or {}
    problems = []
    port = flag(args, "--ssh-port") or "22"
    env = {v["name"]: str(v.get("value")) for v in worker.get("env", [])}
    ports = {str(p["containerPort"]) for p in worker.get("ports", []) if p.get("name") == "ssh"}
    if env.get("CLOUD_ELASTIC_SSHD_PORT", "2222") != port or ports != {port}:
        problems.append(f"the driver connects to port {port}; sshd listens on {env.get('CLOUD_ELASTIC_SSHD_PORT')} "
                        f"and the container declares {sorted(ports)}")
    # start-sshd.sh keeps <its directory>/ready while sshd listens; its directory must be the
    # emptyDir mounted for it.
    sshd_dir = env.get("CLOUD_ELASTIC_SSHD_DIR", "/run/cloud-elastic/sshd")
    mounts = {m["mountPath"].rstrip("/") for m in worker.get("volumeMounts", [])
              if any(v["name"] == m["name"] and "emptyDir" in v for v in pod_spec(ss).get("volumes", []))}
    probe = worker.get("readinessProbe", {}).get("exec", {}).get("command")
    if probe != ["test", "-e", f"{sshd_dir}/ready"] or sshd_dir not in mounts:
        problems.append(f"the workers' readiness probe runs {probe!r}; it must test {sshd_dir}/ready, "
                        f"in an emptyDir (mounted: {sorted(mounts)})")
    identity = flag(args, "--ssh-identity-file")
    driver = container(job, "driver") or {}
    mounted = {f"{m['mountPath'].rstrip('/')}/{item['path']}"
               for m in driver.get("volumeMounts", [])
               for v in pod_spec(job).get("volumes", []) if v["name"] == m["name"] and "secret" in v
               for item in v["secret"].get("items", [])}
    if identity not in mounted:
        problems.append(f"--ssh-identity-file {identity} is not the key the driver mounts ({sorted(mounted)})")
    if pod_spec(job).get("securityContext", {}).get("runAsUser") != pod_spec(ss).get("securityContext", {}).get("runAsUser"):
        problems.append("the driver and the workers run as different users (the image installs one, uid 1000)")
    if pod_spec(ss).get("securityContext", {}).get("runAsNonRoot") is not True:
        problems.append("the worker pods may run as root")
    return problems


@check
def image_set(objects, spec: Spec) -> list[str]:
    """Every container runs the image the overlay names with `images:`."""
    problems = []
    for obj in objects:
        template = obj.get("spec", {}).get("template", {}).get("spec", {})
        for c in [*template.get("containers", []), *template.get("initContainers", [])]:
            if c.get("image") != spec.image:
                problems.append(f"{kind_name(obj)} container {c.get('name')} runs {c.get('image')!r}, not {spec.image!r}")
    return problems


@check
def one_namespace(objects, spec: Spec) -> list[str]:
    """Every namespaced object is in the overlay's namespace, which the overlay creates."""
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    problems = [f"{kind_name(o)} is in namespace {o['metadata'].get('namespace')!r}" for o in objects
                if o["kind"] not in cluster_scoped and o["metadata"].get("namespace") != NAMESPACE]
    if [o["metadata"]["name"] for o in of_kind(objects, "Namespace")] != [NAMESPACE]:
        problems.append(f"the overlay does not create exactly the namespace {NAMESPACE}")
    return problems
