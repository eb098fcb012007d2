"""Every VM of a cluster must run the same cloud-elastic and torch, today and when a replacement boots months later.

The modules' defaults are pinned: cloud-elastic to this checkout's release
(a driver refuses workers of another protocol version), torch to the build CI
tests (requirements/dev.txt), the same in every module.
"""

from __future__ import annotations

import re

import pytest

from .hcl import CLOUDS, REPO, SHARED, Tree

pytestmark = pytest.mark.terraform

VERSION = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
TORCH = re.search(r"^torch==\S+$", (REPO / "requirements/dev.txt").read_text(), re.M).group(0)


@pytest.mark.parametrize("cloud", [c for c in CLOUDS if c != "ibm"])
def test_the_default_cloud_elastic_is_this_release(tree: Tree, cloud: str):
    assert tree.module(cloud).variable_default("cloud_elastic_pip_spec") == f"cloud-elastic[{cloud}]=={VERSION}"


def test_the_default_ibm_cloud_elastic_is_this_release_with_s3fs_for_a_checkpoint_bucket(tree: Tree):
    """IBM's s3:// checkpoint directory is read through s3fs, which only the aws extra brings."""
    ibm = tree.module("ibm")
    assert ibm.variable_default("cloud_elastic_pip_spec") is None
    assert ibm.locals["pip_spec"] == (
        f'${{coalesce(var.cloud_elastic_pip_spec, var.checkpoint_bucket == null ? "cloud-elastic[ibm]=={VERSION}" '
        f': "cloud-elastic[ibm,aws]=={VERSION}")}}')
    assert ibm.module_calls["common"]["pip_spec"] == "${local.pip_spec}"


@pytest.mark.parametrize("name", [*CLOUDS, SHARED])
def test_the_default_torch_is_the_tested_pin(tree: Tree, name: str):
    assert tree.module(name).variable_default("torch_spec") == TORCH
