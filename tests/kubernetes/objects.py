"""Reading the rendered objects of an overlay: finding the driver and the workers, the driver's command
line as the kubelet expands it, and the scheduler's rules for tolerations, node affinity and label
selectors. manifests.py's checks are written with these."""

from __future__ import annotations

import re
from typing import Any, Iterator

from cloud_elastic.providers.kubernetes_view import SLOTS_ANNOTATION

WORKER, DRIVER = "cloud-elastic-worker", "cloud-elastic-driver"
GPU = "nvidia.com/gpu"


def kind_name(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any] | None:
    found = [o for o in of_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    return found[0] if len(found) == 1 else None


def workers(objects) -> dict[str, Any] | None:
    return one(objects, "StatefulSet", WORKER)


def driver_job(objects) -> dict[str, Any] | None:
    return one(objects, "Job", DRIVER)


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def container(workload: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in pod_spec(workload).get("containers", []) if c.get("name") == name), None)


def config_map_data(objects, prefix: str) -> dict[str, str]:
    """The data of the (hash-suffixed) ConfigMap generated as ``prefix``."""
    for cm in of_kind(objects, "ConfigMap"):
        if re.fullmatch(re.escape(prefix) + r"(-[a-z0-9]{10})?", cm["metadata"]["name"]):
            return cm.get("data", {})
    return {}


def resolved_args(objects, job: dict[str, Any]) -> list[str]:
    """The driver's command and arguments with ``$(VAR)`` replaced as the kubelet does: from the
    container's literal env values, ConfigMap keys, and the pod's own namespace."""
    c = container(job, "driver") or {}
    values: dict[str, str] = {}
    namespace = job["metadata"].get("namespace", "")
    for var in c.get("env", []):
        if "value" in var:
            values[var["name"]] = str(var["value"])
            continue
        source = var.get("valueFrom", {})
        if source.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            values[var["name"]] = namespace
        ref = source.get("configMapKeyRef")
        if ref:
            data = next((cm.get("data", {}) for cm in of_kind(objects, "ConfigMap")
                         if cm["metadata"]["name"] == ref["name"]), {})
            if ref["key"] in data:
                values[var["name"]] = data[ref["key"]]
    expand = lambda s: re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m[1], m[0]), str(s))
    return [expand(a) for a in [*c.get("command", []), *c.get("args", [])]]


def flag(args: list[str], name: str) -> str | None:
    """The value of ``name`` among the options, before the training command (``python ...``)."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def tolerates(tolerations: list[dict[str, Any]], key: str, value: str, effect: str) -> bool:
    """Whether any toleration matches the taint ``key=value:effect`` (the scheduler's rule)."""
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != effect:
            continue
        operator = t.get("operator", "Equal")
        if operator == "Exists" and t.get("key") in (None, "", key):
            return True
        if operator == "Equal" and t.get("key") == key and t.get("value", "") == value:
            return True
    return False


def required_node_terms(spec: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The required node affinity's terms (OR of ANDs), the nodeSelector ANDed into each."""
    terms = (spec.get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms") or [{}])
    selector = [{"key": k, "operator": "In", "values": [v]} for k, v in (spec.get("nodeSelector") or {}).items()]
    return [[*term.get("matchExpressions", []), *selector] for term in terms]


def term_admits(term: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies every expression of ``term``."""
    for expr in term:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def can_land_on(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    return any(term_admits(term, labels) for term in required_node_terms(spec))


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """An equality-based label selector (``a=b,c==d,e!=f``) against ``labels``."""
    for part in filter(None, (p.strip() for p in selector.split(","))):
        if "!=" in part:
            key, value = part.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in part:
            key, value = re.split(r"==?", part, maxsplit=1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif part.strip() not in labels:
            return False
    return True


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


def slots_per_pod(ss: dict[str, Any]) -> int | None:
    c = container(ss, "worker") or {}
    gpus = c.get("resources", {}).get("limits", {}).get(GPU)
    if gpus is not None:
        return int(gpus)
    annotation = ss["spec"]["template"].get("metadata", {}).get("annotations", {}).get(SLOTS_ANNOTATION)
    return int(annotation) if annotation is not None and str(annotation).isdigit() else None
