"""Fixtures for the Kubernetes manifests: kubectl (offline), the rendered overlays, and copies of
deploy/kubernetes/ to break on purpose.

Without kubectl or kubernetes-validate the tests skip, except under CI (``CI`` set) or with
``CLOUD_ELASTIC_REQUIRE_KUBECTL=1``, where they fail: ``./dev test`` installs both
(scripts/setup-kubectl.sh, requirements/dev.txt).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from .manifests import DEPLOY, MIN_KUBECTL_MINOR, OVERLAYS, REQUIRE_ENV, find_kubectl, kubectl_minor, render, required


def unavailable(reason: str) -> None:
    if required():
        pytest.fail(f"{reason} (CI or {REQUIRE_ENV} requires it)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kubectl() -> str:
    found = find_kubectl()
    if found is None:
        unavailable("no kubectl on PATH (scripts/setup-kubectl.sh installs it)")
    minor = kubectl_minor(found)
    if minor is None or minor < MIN_KUBECTL_MINOR:
        unavailable(f"{found} is kubectl 1.{minor}: rendering the overlays needs 1.{MIN_KUBECTL_MINOR} or later (kustomize v5)")
    return found


@pytest.fixture(scope="session")
def kubernetes_validate():
    try:
        import kubernetes_validate
    except ImportError:
        unavailable("kubernetes-validate is not installed (pip install -r requirements/dev.txt)")
    return kubernetes_validate


@pytest.fixture(scope="session")
def rendered(kubectl) -> dict[str, list[dict[str, Any]]]:
    """Each overlay's objects, rendered once per session from the repository's tree."""
    return {name: render(kubectl, DEPLOY / "overlays" / name) for name in OVERLAYS}


@pytest.fixture
def broken_copy(tmp_path) -> Callable[[str, str, str], Path]:
    """``broken_copy(path, old, new)``: a copy of deploy/kubernetes/ with ``old`` replaced by ``new``
    in ``path`` (relative to deploy/kubernetes/); ``old`` must occur there exactly once, so that a
    mutation cannot silently stop applying when a manifest changes. Returns the copy's root."""
    root = tmp_path / "kubernetes"
    shutil.copytree(DEPLOY, root)

    def apply(path: str, old: str, new: str) -> Path:
        target = root / path
        text = target.read_text()
        assert text.count(old) == 1, f"the mutation's text occurs {text.count(old)} times in {path}: {old!r}"
        target.write_text(text.replace(old, new))
        return root

    return apply
