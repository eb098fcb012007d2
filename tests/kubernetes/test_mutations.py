"""Each check can fail: break one property in a copy of deploy/kubernetes/, render the overlay, and
see the check report it (or the schema validation, or kustomize itself, refuse it).

A mutation replaces one exact piece of text, which must occur exactly once, so that it cannot
silently stop applying when a manifest changes. The unbroken tree passing the same checks is
test_manifests.py's job.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from .manifests import CHECKS, DEPLOY, KUBERNETES_VERSIONS, OVERLAYS, RenderError, render, schema_problems

BASE_DRIVER, BASE_WORKERS, BASE_RBAC = "base/driver.yaml", "base/workers.yaml", "base/rbac.yaml"
COMPONENT = "components/checkpoints/kustomization.yaml"
#: Each overlay's block that appends its namespace to the cluster-wide names, from `replacements:` to the end.
OVERLAY_REPLACEMENTS = "replacements:\n" + (DEPLOY / "overlays" / "eks-karpenter" / "kustomization.yaml").read_text(
    ).partition("\nreplacements:\n")[2]


@dataclass(frozen=True)
class Mutation:
    id: str
    overlay: str
    path: str  # relative to deploy/kubernetes/
    old: str
    new: str
    check: str | None  # a name in CHECKS, "schema", or None for a change that must break nothing


BASE_BUDGET = "base/disruption-budget.yaml"

MUTATIONS = [
    # voluntary disruptions take one worker pod at a time
    Mutation("budget-selects-nobody", "gke-spot", BASE_BUDGET, "    matchLabels:\n      app: cloud-elastic-worker",
             "    matchLabels:\n      app: cloud-elastic-workers", "drains_one_pod_at_a_time"),
    Mutation("budget-lets-two-go", "eks-karpenter", BASE_BUDGET, "maxUnavailable: 1", "maxUnavailable: 2",
             "drains_one_pod_at_a_time"),
    Mutation("budget-holds-unready-pods", "aks-spot", BASE_BUDGET, "unhealthyPodEvictionPolicy: AlwaysAllow",
             "unhealthyPodEvictionPolicy: IfHealthyBudget", "drains_one_pod_at_a_time"),
    Mutation("budget-left-out", "kind", "base/kustomization.yaml", "  - disruption-budget.yaml\n", "",
             "drains_one_pod_at_a_time"),
    # RBAC: exactly list/watch on pods (Role) and nodes (ClusterRole); the driver never reads one object by name
    Mutation("role-may-get-pods", "kind", BASE_RBAC, 'resources: ["pods"]\n    verbs: ["list", "watch"]',
             'resources: ["pods"]\n    verbs: ["get", "list", "watch"]', "rbac_least"),
    Mutation("role-may-delete-pods", "eks-karpenter", BASE_RBAC, 'resources: ["pods"]\n    verbs: ["list", "watch"]',
             'resources: ["pods"]\n    verbs: ["list", "watch", "delete"]', "rbac_least"),
    Mutation("role-cannot-watch", "gke-spot", BASE_RBAC, 'resources: ["pods"]\n    verbs: ["list", "watch"]',
             'resources: ["pods"]\n    verbs: ["list"]', "rbac_least"),
    Mutation("role-reads-secrets", "aks-spot", BASE_RBAC, 'resources: ["pods"]', 'resources: ["pods", "secrets"]',
             "rbac_least"),
    Mutation("clusterrole-reads-pods-everywhere", "eks-karpenter", BASE_RBAC, 'resources: ["nodes"]',
             'resources: ["nodes", "pods"]', "rbac_least"),
    Mutation("clusterrole-patches-nodes", "kind", BASE_RBAC, 'resources: ["nodes"]\n    verbs: ["list", "watch"]',
             'resources: ["nodes"]\n    verbs: ["list", "watch", "patch"]', "rbac_least"),
    Mutation("clusterrole-wildcard-group", "gke-spot", BASE_RBAC, '  - apiGroups: [""]\n    resources: ["nodes"]',
             '  - apiGroups: ["*"]\n    resources: ["nodes"]', "rbac_least"),
    Mutation("binding-to-default-account", "eks-karpenter", BASE_RBAC,
             "subjects:\n  - kind: ServiceAccount\n    name: cloud-elastic-driver\n---",
             "subjects:\n  - kind: ServiceAccount\n    name: default\n---", "rbac_least"),
    # the cluster-wide names carry the job's namespace
    Mutation("cluster-names-without-the-block", "eks-karpenter", "overlays/eks-karpenter/kustomization.yaml",
             OVERLAY_REPLACEMENTS, "", "cluster_names_per_job"),
    Mutation("cluster-names-from-the-account-name", "gke-spot", "overlays/gke-spot/kustomization.yaml",
             "fieldPath: metadata.namespace}", "fieldPath: metadata.name}", "cluster_names_per_job"),
    Mutation("driver-default-account", "aks-spot", BASE_DRIVER, "serviceAccountName: cloud-elastic-driver",
             "serviceAccountName: default", "rbac_least"),
    Mutation("workers-get-a-token", "gke-spot", BASE_WORKERS, "automountServiceAccountToken: false",
             "automountServiceAccountToken: true", "rbac_least"),
    # one driver
    Mutation("two-drivers", "eks-karpenter", BASE_DRIVER, "parallelism: 1", "parallelism: 2", "one_driver"),
    Mutation("replacement-beside-the-old-driver", "gke-spot", BASE_DRIVER, "podReplacementPolicy: Failed",
             "podReplacementPolicy: TerminatingOrFailed", "one_driver"),
    # the driver restarts only with checkpoints in object storage, and then with a pid of its own
    Mutation("driver-restarted-without-checkpoints", "kind", BASE_DRIVER, "restartPolicy: Never",
             "restartPolicy: OnFailure", "driver_restarts_only_with_checkpoints"),
    Mutation("driver-retried-without-checkpoints", "kind", BASE_DRIVER, "backoffLimit: 0", "backoffLimit: 3",
             "driver_restarts_only_with_checkpoints"),
    Mutation("gpu-overlay-without-checkpoints", "eks-karpenter", "overlays/eks-karpenter/kustomization.yaml",
             "components:\n  - ../../components/checkpoints\n", "", "driver_restarts_only_with_checkpoints"),
    Mutation("checkpoints-on-the-driver-disk", "gke-spot", "overlays/gke-spot/kustomization.yaml",
             "checkpoint_dir=gs://my-bucket/cloud-elastic/job", "checkpoint_dir=/var/lib/ckpt",
             "driver_restarts_only_with_checkpoints"),
    Mutation("checkpointed-driver-not-restarted", "aks-spot", COMPONENT, "value: OnFailure", "value: Never",
             "driver_restarts_only_with_checkpoints"),
    Mutation("restarted-driver-is-pid-1", "eks-karpenter", BASE_DRIVER, "shareProcessNamespace: true",
             "shareProcessNamespace: false", "driver_restarts_only_with_checkpoints"),
    Mutation("driver-as-deployment", "kind", BASE_DRIVER, "apiVersion: batch/v1\nkind: Job",
             "apiVersion: apps/v1\nkind: Deployment", "schema"),
    # the driver is on on-demand capacity
    Mutation("driver-may-land-on-gke-spot", "gke-spot", BASE_DRIVER,
             '- key: cloud.google.com/gke-spot\n                    operator: NotIn',
             '- key: cloud.google.com/gke-spot\n                    operator: In', "driver_on_demand"),
    Mutation("driver-ignores-aks-spot", "aks-spot", BASE_DRIVER,
             '                  - key: kubernetes.azure.com/scalesetpriority\n                    operator: NotIn\n'
             '                    values: ["spot"]\n', "", "driver_on_demand"),
    Mutation("driver-on-karpenter-spot", "eks-karpenter", "overlays/eks-karpenter/driver.yaml",
             "karpenter.sh/capacity-type: on-demand", "karpenter.sh/capacity-type: spot", "driver_on_demand"),
    Mutation("driver-tolerates-spot", "aks-spot", BASE_DRIVER, "      serviceAccountName: cloud-elastic-driver\n",
             "      serviceAccountName: cloud-elastic-driver\n      tolerations:\n"
             "        - key: kubernetes.azure.com/scalesetpriority\n          operator: Exists\n", "driver_on_demand"),
    # workers on spot, tolerating its taint and no drain taint
    Mutation("eks-workers-on-demand", "eks-karpenter", "overlays/eks-karpenter/workers.yaml",
             "karpenter.sh/capacity-type: spot\n      tolerations", "karpenter.sh/capacity-type: on-demand\n      tolerations",
             "workers_on_spot"),
    Mutation("gke-workers-anywhere", "gke-spot", "overlays/gke-spot/workers.yaml",
             '      nodeSelector:\n        cloud.google.com/gke-spot: "true"\n', "", "workers_on_spot"),
    Mutation("gke-toleration-typo", "gke-spot", "overlays/gke-spot/workers.yaml", "- key: cloud.google.com/gke-spot",
             "- key: cloud.google.com/gke-spot-vm", "workers_on_spot"),
    Mutation("aks-taint-not-tolerated", "aks-spot", "overlays/aks-spot/workers.yaml",
             "        - key: kubernetes.azure.com/scalesetpriority\n          operator: Equal\n          value: spot\n"
             "          effect: NoSchedule\n", "", "workers_on_spot"),
    Mutation("aks-wrong-effect", "aks-spot", "overlays/aks-spot/workers.yaml",
             "value: spot\n          effect: NoSchedule", "value: spot\n          effect: NoExecute", "workers_on_spot"),
    Mutation("gpu-taint-not-tolerated", "eks-karpenter", "overlays/eks-karpenter/workers.yaml",
             "        - key: nvidia.com/gpu\n          operator: Exists\n          effect: NoSchedule\n", "",
             "workers_on_spot"),
    Mutation("workers-tolerate-everything", "aks-spot", "overlays/aks-spot/workers.yaml",
             "      tolerations:\n", "      tolerations:\n        - operator: Exists\n", "workers_on_spot"),
    Mutation("workers-tolerate-karpenter-drain", "eks-karpenter", "overlays/eks-karpenter/workers.yaml",
             "      tolerations:\n", "      tolerations:\n        - key: karpenter.sh/disrupted\n          operator: Exists\n",
             "workers_on_spot"),
    # grace period
    Mutation("eks-grace-too-short", "eks-karpenter", "overlays/eks-karpenter/workers.yaml",
             "terminationGracePeriodSeconds: 120", "terminationGracePeriodSeconds: 10", "grace_period"),
    Mutation("kind-grace-too-short", "kind", "overlays/kind/workers.yaml",
             "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 5", "grace_period"),
    # GPU limits
    Mutation("no-gpu-limit", "gke-spot", BASE_WORKERS, "              nvidia.com/gpu: 1\n", "", "gpu_limits"),
    Mutation("zero-gpus", "aks-spot", BASE_WORKERS, "nvidia.com/gpu: 1", "nvidia.com/gpu: 0", "gpu_limits"),
    Mutation("cpu-overlay-without-slots", "kind", "overlays/kind/workers.yaml", 'cloud-elastic.io/slots: "2"',
             'cloud-elastic.io/slot: "2"', "gpu_limits"),
    # requests that a 4-vCPU/16-GiB node's allocatable holds
    Mutation("workers-ask-every-cpu", "eks-karpenter", BASE_WORKERS, 'cpu: "3"', 'cpu: "4"', "workers_fit_a_node"),
    Mutation("workers-limit-is-their-request", "gke-spot", BASE_WORKERS, "              memory: 12Gi\n", "",
             "workers_fit_a_node"),  # no request: the limit (14Gi) is the request
    # one pod per node
    Mutation("anti-affinity-per-zone", "eks-karpenter", BASE_WORKERS, "topologyKey: kubernetes.io/hostname",
             "topologyKey: topology.kubernetes.io/zone", "one_pod_per_node"),
    Mutation("anti-affinity-preferred", "gke-spot", BASE_WORKERS,
             "        podAntiAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n"
             "            - topologyKey: kubernetes.io/hostname\n",
             "        podAntiAffinity:\n          preferredDuringSchedulingIgnoredDuringExecution:\n"
             "            - weight: 100\n              podAffinityTerm:\n                topologyKey: kubernetes.io/hostname\n",
             "schema"),  # the indentation no longer fits the new shape: the schema refuses it first
    Mutation("anti-affinity-against-other-pods", "aks-spot", BASE_WORKERS,
             "              labelSelector:\n                matchLabels:\n                  app: cloud-elastic-worker",
             "              labelSelector:\n                matchLabels:\n                  app: something-else",
             "one_pod_per_node"),
    # no secret inline
    Mutation("secret-in-env", "eks-karpenter", BASE_DRIVER, "            - name: XDG_RUNTIME_DIR\n",
             "            - name: CLOUD_ELASTIC_SECRET\n              value: hunter2\n            - name: XDG_RUNTIME_DIR\n",
             "no_inline_secret"),
    Mutation("public-key-inline", "gke-spot", BASE_WORKERS, "            - name: CLOUD_ELASTIC_SSHD_PORT\n",
             "            - name: AUTHORIZED\n              value: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI\n"
             "            - name: CLOUD_ELASTIC_SSHD_PORT\n", "no_inline_secret"),
    Mutation("workers-get-the-private-key", "aks-spot", BASE_WORKERS,
             "              - key: authorized_keys\n                path: authorized_keys",
             "              - key: id_ed25519\n                path: authorized_keys", "no_inline_secret"),
    Mutation("driver-gets-every-key", "kind", BASE_DRIVER,
             "            items:\n              - key: id_ed25519\n                path: id_ed25519\n", "",
             "no_inline_secret"),
    # the driver's selector finds the workers
    Mutation("selector-for-other-pods", "eks-karpenter", BASE_DRIVER, "- app=cloud-elastic-worker", "- app=llm",
             "selector_finds_workers"),
    Mutation("selector-matches-everything-ours", "gke-spot", BASE_DRIVER, "- app=cloud-elastic-worker",
             "- app.kubernetes.io/part-of=cloud-elastic", "selector_finds_workers"),
    Mutation("workers-relabelled", "aks-spot", BASE_WORKERS,
             "  template:\n    metadata:\n      labels:\n        app: cloud-elastic-worker",
             "  template:\n    metadata:\n      labels:\n        app: cloud-elastic-worker\n        tier: gpu", None),
    # sizes
    Mutation("replicas-short-of-max-np", "eks-karpenter", "overlays/eks-karpenter/kustomization.yaml",
             "    count: 4", "    count: 3", "sizes_agree"),
    Mutation("np-above-max", "gke-spot", "overlays/gke-spot/kustomization.yaml", "      - np=2", "      - np=8",
             "sizes_agree"),
    Mutation("driver-ignores-the-configmap", "aks-spot", BASE_DRIVER, "            - $(CLOUD_ELASTIC_MAX_NP)",
             "            - $(CLOUD_ELASTIC_MAX)", "sizes_agree"),
    # ssh
    Mutation("driver-dials-port-22", "kind", BASE_DRIVER, '            - --ssh-port\n            - "2222"',
             '            - --ssh-port\n            - "22"', "ssh_agrees"),
    Mutation("identity-file-elsewhere", "eks-karpenter", BASE_DRIVER, "            - /etc/cloud-elastic/ssh/id_ed25519",
             "            - /home/trainer/.ssh/id_ed25519", "ssh_agrees"),
    Mutation("probe-elsewhere", "gke-spot", BASE_WORKERS, '["test", "-e", "/run/cloud-elastic/sshd/ready"]',
             '["test", "-e", "/tmp/ready"]', "ssh_agrees"),
    Mutation("sshd-dir-not-mounted", "eks-karpenter", BASE_WORKERS, "              mountPath: /run/cloud-elastic/sshd",
             "              mountPath: /run/sshd-elsewhere", "ssh_agrees"),
    Mutation("workers-as-root", "aks-spot", BASE_WORKERS,
             "      securityContext:\n        runAsNonRoot: true\n        runAsUser: 1000",
             "      securityContext:\n        runAsNonRoot: false\n        runAsUser: 1000", "ssh_agrees"),
    # image, namespace, schema
    Mutation("image-not-set", "gke-spot", "overlays/gke-spot/kustomization.yaml", "  - name: cloud-elastic\n    newName:",
             "  - name: cloud-elastic-other\n    newName:", "image_set"),
    Mutation("namespace-elsewhere", "aks-spot", "overlays/aks-spot/kustomization.yaml", "namespace: cloud-elastic\n",
             "namespace: ml\n", "one_namespace"),
    # without a namespace the overlay's replacements have no source: kustomize refuses it
    Mutation("namespace-not-set", "aks-spot", "overlays/aks-spot/kustomization.yaml", "namespace: cloud-elastic\n", "",
             "schema"),
    Mutation("grace-as-string", "eks-karpenter", BASE_WORKERS, "terminationGracePeriodSeconds: 120",
             'terminationGracePeriodSeconds: "120"', "schema"),
    Mutation("unknown-field", "gke-spot", BASE_DRIVER, "  backoffLimit: 0", "  backoffLimit: 0\n  restartLimit: 3", "schema"),
]

# A mutation that must break nothing (check None): the checks read labels and selectors, not
# exact text, so a label added to the workers keeps every property.
HARMLESS = {m.id for m in MUTATIONS if m.check is None}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.id)
def test_mutation_is_caught(mutation, kubectl, kubernetes_validate, broken_copy):
    root = broken_copy(mutation.path, mutation.old, mutation.new)
    try:
        objects = render(kubectl, root / "overlays" / mutation.overlay)
    except RenderError as exc:
        assert mutation.check == "schema", f"kustomize refused the mutation, but {mutation.check} was to catch it: {exc}"
        return
    schema = schema_problems(objects, KUBERNETES_VERSIONS[-1:])  # both versions: test_manifests.py
    if mutation.check == "schema":
        assert schema, "the schema validation accepted the mutation"
        return
    assert schema == [], "the mutation broke the schema, so the check under test is not what catches it"
    problems = CHECKS[mutation.check](objects, OVERLAYS[mutation.overlay]) if mutation.check else []
    others = {name: found for name, check in CHECKS.items()
              if (found := check(objects, OVERLAYS[mutation.overlay]))}
    if mutation.id in HARMLESS:
        assert others == {}, f"a harmless change was reported: {others}"
    else:
        assert problems, f"{mutation.check} did not notice the mutation (others noticed: {others})"
