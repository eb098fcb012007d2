"""Every overlay of deploy/kubernetes/ renders offline, validates against the Kubernetes API's
schemas, and has each property of tests/kubernetes/manifests.py (test_mutations.py shows that each
check can fail)."""

from __future__ import annotations

import pytest

from cloud_elastic.cli import cli

from .manifests import CHECKS, DEPLOY, KUBERNETES_VERSIONS, OVERLAYS, driver_job, flag, resolved_args, schema_problems


def test_every_overlay_is_checked():
    """A new overlay directory cannot ship untested: each one has its expectations here."""
    on_disk = {p.name for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").exists()}
    assert on_disk == set(OVERLAYS)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_validates_against_the_api_schemas(overlay, rendered, kubernetes_validate):
    objects = rendered[overlay]
    kinds = sorted({o["kind"] for o in objects})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Job", "Namespace", "NetworkPolicy",
                     "Role", "RoleBinding", "Service", "ServiceAccount", "StatefulSet"]
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
    assert params["k8s_selector"] == (flag(args, "--k8s-selector"),) and params["k8s_namespace"] == "cloud-elastic"
    assert [params["num_proc"], params["min_np"], params["max_np"]] == [int(flag(args, f)) for f in ("-np", "--min-np", "--max-np")]
    assert (params["ssh_port"], params["ssh_user"]) == (2222, "trainer")
    assert list(params["command"]) == ["python", "train.py"]
    assert params["checkpoint_dir"] == flag(args, "--checkpoint-dir")
    assert (params["checkpoint_dir"] is not None) == OVERLAYS[overlay].checkpoints
