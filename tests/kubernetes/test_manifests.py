"""Every overlay of deploy/kubernetes/ renders offline, validates against the Kubernetes API's
schemas, and has each property of tests/kubernetes/manifests.py (test_mutations.py shows that each
check can fail)."""

from __future__ import annotations

import pytest

from .manifests import CHECKS, DEPLOY, KUBERNETES_VERSIONS, OVERLAYS, schema_problems


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
