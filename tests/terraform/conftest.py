"""Fixtures for the Terraform checks: the tree, broken copies of it, and an offline Terraform."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .hcl import REPO, TERRAFORM_DIR, Tree
from .tfcli import Terraform, find_cli, find_mirror, required

# Directories `terraform init` runs in, and which of them have `terraform test` files.
INIT_DIRS = ("modules/common", "modules/aws", "examples/aws")


@pytest.fixture(scope="session")
def tree() -> Tree:
    return Tree(TERRAFORM_DIR)


def copy_tree(dest: Path) -> Tree:
    """A copy of terraform/ (and docs/terraform.md beside it) to break on purpose."""
    shutil.copytree(TERRAFORM_DIR, dest / "terraform", ignore=shutil.ignore_patterns(".terraform", "*.tfstate*"))
    (dest / "docs").mkdir()
    shutil.copy(REPO / "docs" / "terraform.md", dest / "docs" / "terraform.md")
    return Tree(dest / "terraform")


def _unavailable(reason: str) -> None:
    if required():
        pytest.fail(f"{reason} (and CLOUD_ELASTIC_REQUIRE_TERRAFORM is set)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def terraform(tmp_path_factory) -> Terraform:
    """The Terraform CLI, configured to stay offline; skips when there is none."""
    found = find_cli(tmp_path_factory.mktemp("tf-config"))
    if found is None:
        _unavailable("no terraform CLI on PATH")
    return found


@pytest.fixture(scope="session")
def plugin_dir(terraform: Terraform) -> Path:
    mirror = find_mirror(terraform.platform())
    if mirror is None:
        _unavailable("no offline mirror of hashicorp/aws (set CLOUD_ELASTIC_TF_PLUGIN_DIR)")
    return mirror


def init(terraform: Terraform, plugin_dir: Path, workdir: Path) -> None:
    """``terraform init`` from the mirror only; fails the test with Terraform's output."""
    result = terraform.run("init", "-backend=false", "-input=false", f"-plugin-dir={plugin_dir}", cwd=workdir)
    assert result.returncode == 0, f"terraform init in {workdir} failed:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="session")
def workspace(terraform: Terraform, plugin_dir: Path, tmp_path_factory) -> Tree:
    """A copy of the tree with INIT_DIRS initialised, once per session (nothing is written to the repo)."""
    copy = copy_tree(tmp_path_factory.mktemp("tf-workspace"))
    for rel in INIT_DIRS:
        init(terraform, plugin_dir, copy.root / rel)
    return copy
