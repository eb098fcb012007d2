"""Every overlay of deploy/kubernetes/ renders offline, validates against the Kubernetes API's
schemas, and has each property of tests/kubernetes/manifests.py (test_mutations.py shows that each
check can fail)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from cloud_elastic.cli import cli
from cloud_elastic.providers.selection import DiscoveryArgs

from .manifests import (CHECKS, DEPLOY, KUBERNETES_VERSIONS, OVERLAYS, READ_VERBS, REPO, driver_job, flag, render,
                        resolved_args, schema_problems)
from .objects import kind_name, of_kind, pod_spec


def test_every_overlay_is_checked():
    """A new overlay directory cannot ship untested: each one has its expectations here."""
    on_disk = {p.name for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").exists()}
    assert on_disk == set(OVERLAYS)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_validates_against_the_api_schemas(overlay, rendered, kubernetes_validate):
    objects = rendered[overlay]
    kinds = sorted({o["kind"] for o in objects})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Job", "Namespace", "NetworkPolicy",
                     "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount", "StatefulSet"]
    assert schema_problems(objects) == [], f"against Kubernetes {', '.join(KUBERNETES_VERSIONS)}"


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
@pytest.mark.parametrize("prop", sorted(CHECKS))
def test_overlay_has_property(overlay, prop, rendered):
    assert CHECKS[prop](rendered[overlay], OVERLAYS[overlay]) == []


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_driver_command_is_one_the_cli_accepts(overlay, rendered):
    """The driver pod's command line, as the kubelet expands it, parses with cloud-elastic's own CLI:
    no unknown option, no bad value, and the training command where the CLI looks for it."""
    args = resolved_args(rendered[overlay], driver_job(rendered[overlay]))
    assert args[:2] == ["cloud-elastic", "run"]
    params = cli.commands["run"].make_context("run", args[2:]).params
    found = DiscoveryArgs.pop_from(dict(params))  # as the CLI reads them: one group, one namespace
    assert found.groups == (("k8s_selector", flag(args, "--k8s-selector")),)
    assert found.cloud["k8s_namespace"] == "cloud-elastic"
    assert [params["num_proc"], params["min_np"], params["max_np"]] == [int(flag(args, f)) for f in ("-np", "--min-np", "--max-np")]
    assert (params["ssh_port"], params["ssh_user"]) == (2222, "trainer")
    assert list(params["command"]) == ["python", "train.py"]
    assert params["checkpoint_dir"] == flag(args, "--checkpoint-dir")
    assert (params["checkpoint_dir"] is not None) == OVERLAYS[overlay].checkpoints


def test_a_restarted_worker_container_is_not_ready_before_its_sshd_listens(tmp_path):
    """The readiness file is on the sshd-runtime emptyDir, which a container restart keeps:
    start-sshd.sh removes the last container's file before anything else, so the probe fails until
    the new sshd listens (here an sshd that fails its configuration test, so it never does)."""
    run_dir, keys = tmp_path / "run", tmp_path / "authorized_keys"
    run_dir.mkdir()
    (run_dir / "ready").touch()  # the last container's
    (run_dir / "private").mkdir(mode=0o700)
    (run_dir / "private" / "host_ed25519").write_text("the pod's host key")  # kept too: no key generation
    keys.write_text("ssh-ed25519 AAAA driver")
    sshd = tmp_path / "sshd"
    sshd.write_text(f'#!/bin/sh\ntest -e {run_dir}/ready && echo ready >> {tmp_path}/seen; exit 1\n')
    sshd.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "CLOUD_ELASTIC_SSHD_DIR": str(run_dir), "CLOUD_ELASTIC_SSHD": str(sshd),
           "CLOUD_ELASTIC_AUTHORIZED_KEYS": str(keys)}
    done = subprocess.run(["/bin/sh", str(DEPLOY / "base" / "start-sshd.sh")], env=env, capture_output=True,
                          timeout=30)
    assert done.returncode == 1
    assert not (tmp_path / "seen").exists(), "the old ready file was there while sshd was not listening"
    assert not (run_dir / "ready").exists()


def test_the_docs_name_the_rbac_verbs_the_manifests_grant():
    """Review h3: docs/kubernetes.md said the tests check RBAC "exactly get, list and watch", and the manifests
    grant list and watch only (the driver reads no object by name)."""
    text = " ".join((REPO / "docs" / "kubernetes.md").read_text().split())
    claimed = re.search(r"RBAC exactly (.+?) on pods", text)
    assert claimed is not None, "docs/kubernetes.md no longer says which verbs the tests check"
    assert set(re.split(r",\s*|\s+and\s+", claimed[1])) == READ_VERBS, claimed[0]


def _cluster_rbac(objects) -> dict[str, dict]:
    """The cluster-scoped RBAC objects by kind/name."""
    return {kind_name(o): o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")}


def _team_b_from_the_docs(root, affix=""):
    """docs/kubernetes.md's overlay for a second job, written where it says, over a copy of the tree."""
    text = (REPO / "docs" / "kubernetes.md").read_text().split("### Two jobs in one cluster", 1)[1]
    snippet = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    where = snippet.splitlines()[0].removeprefix("# deploy/kubernetes/")
    (root / where).parent.mkdir(parents=True)
    (root / where).write_text(snippet.replace("namespace: team-b\n", f"namespace: team-b\n{affix}"))
    return root / where.removesuffix("/kustomization.yaml")


def _team_b_as_a_copy(root, affix=""):
    """A copy of the kind overlay whose `namespace:` is changed, as a user makes a second job."""
    copy = root / "overlays" / "kind-team-b"
    shutil.copytree(root / "overlays" / "kind", copy)
    path = copy / "kustomization.yaml"
    path.write_text(path.read_text().replace("namespace: cloud-elastic\n", f"namespace: team-b\n{affix}"))
    return copy


@pytest.mark.parametrize("affix, account", [("", "cloud-elastic-driver"),
                                            ("namePrefix: teamb-\n", "teamb-cloud-elastic-driver"),
                                            ("nameSuffix: -b\n", "cloud-elastic-driver-b")],
                         ids=["plain", "prefix", "suffix"])
@pytest.mark.parametrize("second", [_team_b_from_the_docs, _team_b_as_a_copy], ids=["docs-overlay", "copy"])
def test_a_second_job_in_another_namespace_has_cluster_rbac_of_its_own(second, affix, account, kubectl,
                                                                        kubernetes_validate, tmp_path):
    """Review s61 rvK: both jobs rendered the same ClusterRoleBinding, so applying the second rebound the first
    job's to its own account, and deleting either job removed node access for both. Review s61 rvE: with a
    namePrefix or nameSuffix beside the block, the binding's roleRef named a ClusterRole that was not rendered
    (the API accepts it; the driver then gets 403 on nodes)."""
    root = tmp_path / "kubernetes"
    shutil.copytree(DEPLOY, root)
    first = _cluster_rbac(render(kubectl, root / "overlays" / "eks-karpenter"))
    objects = render(kubectl, second(root, affix))
    other = _cluster_rbac(objects)
    assert len(first) == len(other) == 2 and not set(first) & set(other), (sorted(first), sorted(other))
    role = next(o for o in other.values() if o["kind"] == "ClusterRole")
    binding = next(o for o in other.values() if o["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"], "the binding grants a role that is not there"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "team-b"}]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"] == ["team-b"]
    assert [pod_spec(o)["serviceAccountName"] for o in of_kind(objects, "Job")] == [account]
    if not affix:  # it finds the driver's Job by its unprefixed name
        assert CHECKS["rbac_least"](objects, OVERLAYS["kind"]) == []
    assert CHECKS["cluster_names_per_job"](objects, OVERLAYS["kind"]) == []
    assert schema_problems(objects, KUBERNETES_VERSIONS[-1:]) == []
