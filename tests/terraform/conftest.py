"""Fixtures for the Terraform checks: the tree, broken copies of it, and an offline Terraform."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest

from .hcl import REPO, TERRAFORM_DIR, Module, Tree
from .tfcli import PLUGIN_DIR_ENV, REQUIRE_ENV, Terraform, find_cli, find_mirror, required


@pytest.fixture(scope="session")
def tree() -> Tree:
    return Tree(TERRAFORM_DIR)


def copy_tree(dest: Path) -> Tree:
    """A copy of terraform/ (and docs/terraform.md beside it) to break on purpose."""
    shutil.copytree(TERRAFORM_DIR, dest / "terraform", ignore=shutil.ignore_patterns(".terraform", "*.tfstate*"))
    (dest / "docs").mkdir()
    shutil.copy(REPO / "docs" / "terraform.md", dest / "docs" / "terraform.md")
    return Tree(dest / "terraform")


def unavailable(reason: str, what: str = "cli") -> None:
    """Skip with ``reason``, or fail when CLOUD_ELASTIC_REQUIRE_TERRAFORM asks for ``what``."""
    if required(what):
        pytest.fail(f"{reason} (and CI or {REQUIRE_ENV} requires it)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def terraform(tmp_path_factory) -> Terraform:
    """The Terraform CLI, configured to stay offline; skips when there is none."""
    found = find_cli(tmp_path_factory.mktemp("tf-config"))
    if found is None:
        unavailable("no terraform CLI on PATH")
    return found


def required_providers(path: Path) -> list[str]:
    """Full source addresses of the providers a module directory needs (its child modules' included)."""
    module, sources = Module.load(path), []
    for tf in module.terraform_blocks:
        for entry in tf.get("required_providers", []):
            for spec in entry.values():
                source = spec["source"]
                sources.append(source if source.count("/") == 2 else f"registry.terraform.io/{source}")
    for call in module.module_calls.values():
        if str(call.get("source", "")).startswith("."):
            sources += required_providers((path / call["source"]).resolve())
    return sorted(set(sources))


@pytest.fixture(scope="session")
def plugin_dir_for(terraform: Terraform, tmp_path_factory) -> Callable[[Path], Path]:
    """The offline plugin directory for a module directory; skips when a provider it needs is not mirrored.

    A module that needs no provider gets an empty directory, so init has
    nothing to fetch either way.
    """
    platform, empty = terraform.platform(), tmp_path_factory.mktemp("no-plugins")

    def find(path: Path) -> Path:
        mirror = empty
        for provider in required_providers(path):
            mirror = find_mirror(platform, provider)
            if mirror is None:
                unavailable(f"no offline mirror of {provider} for {platform} (set {PLUGIN_DIR_ENV})", provider)
        return mirror

    return find


def init(terraform: Terraform, plugin_dir: Path, workdir: Path) -> None:
    """``terraform init`` from the mirror only; fails the test with Terraform's output."""
    result = terraform.run("init", "-backend=false", "-input=false", f"-plugin-dir={plugin_dir}", cwd=workdir)
    assert result.returncode == 0, f"terraform init in {workdir} failed:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="session")
def initialised(terraform: Terraform, plugin_dir_for, tmp_path_factory) -> Callable[[str], Path]:
    """``initialised("modules/aws")``: that directory in one session-wide copy of the tree, initialised once.

    Nothing is written to the repository.
    """
    copy = copy_tree(tmp_path_factory.mktemp("tf-workspace"))
    done: dict[str, Path] = {}

    def get(rel: str) -> Path:
        if rel not in done:
            workdir = copy.root / rel
            init(terraform, plugin_dir_for(workdir), workdir)
            done[rel] = workdir
        return done[rel]

    return get
