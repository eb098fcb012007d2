"""Structural checks on the parsed HCL of all four cloud modules (no Terraform, no network)."""

from __future__ import annotations

import re

import pytest

from .conventions import example_problems, readme_problems, variable_problems, version_problems
from .hcl import CLOUDS, REPO, TERRAFORM_DIR, Module, Tree, blocks, reference
from .properties import CHECKS, NOT_APPLICABLE, PROPERTIES

pytestmark = pytest.mark.terraform

MODULE_DIRS = Tree(TERRAFORM_DIR).module_dirs()


def test_every_property_is_checked_or_explained_for_every_cloud():
    pairs = {(prop, cloud) for prop in PROPERTIES for cloud in CLOUDS}
    assert set(CHECKS) | set(NOT_APPLICABLE) == pairs
    assert not set(CHECKS) & set(NOT_APPLICABLE)


@pytest.mark.parametrize("prop, cloud", sorted(CHECKS))
def test_property(tree, prop, cloud):
    assert CHECKS[(prop, cloud)](tree) == []


@pytest.mark.parametrize("path", MODULE_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_variables_are_typed_described_and_validated(path):
    assert variable_problems(Module.load(path)) == []


@pytest.mark.parametrize("path", MODULE_DIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_versions_are_bounded_and_there_is_no_backend(path):
    assert version_problems(Module.load(path)) == []


@pytest.mark.parametrize("cloud", CLOUDS)
def test_readme_example_matches_the_module(tree, cloud):
    assert readme_problems(tree, cloud) == []


@pytest.mark.parametrize("cloud", CLOUDS)
def test_setup_commands_reach_the_bootstrap_of_every_cloud(tree, cloud):
    """The training code gets onto the VMs only through them (docs/terraform.md): no cloud may drop them."""
    assert reference(tree.module(cloud).module_calls["common"].get("setup_commands")) == "var.setup_commands"
    call = tree.example(cloud).module_calls["cloud_elastic"]
    assert reference(call.get("setup_commands")) == "var.setup_commands"


def test_aws_readme_lists_exactly_the_driver_policys_actions(tree):
    """The README says the instance profile "allows only" these: a reader auditing it, or a policy copied from it,
    must see every action iam.tf grants (DescribeLifecycleHooks was once missing) and none it does not."""
    statements = blocks(tree.module("aws").data("aws_iam_policy_document", "driver"), "statement")
    granted = {action for s in statements for action in s.get("actions", [])}
    driver = re.search(r"^- \*\*Driver\*\*.*?(?=^- \*\*|^#)", tree.readme("aws"), re.S | re.M)
    assert driver, "modules/aws/README.md has no **Driver** item"
    assert set(re.findall(r"`([a-z0-9]+:[A-Za-z]+)`", driver.group(0))) == granted


def test_every_action_the_aws_driver_may_take_is_one_the_code_calls(tree):
    """A grant nothing calls only widens what the driver's credentials allow (sqs:GetQueueAttributes once).
    boto3 names each call after its action; SQS authorises a batch call with the single call's action."""
    statements = blocks(tree.module("aws").data("aws_iam_policy_document", "driver"), "statement")
    granted = {action for s in statements for action in s.get("actions", [])}
    code = "\n".join(path.read_text() for path in (REPO / "cloud_elastic").rglob("*.py"))
    unused = {a for a in granted
              if not re.search(rf"\b{re.sub(r'(?<!^)(?=[A-Z])', '_', a.split(':')[1]).lower()}(_batch)?\b", code)}
    assert not unused, f"the driver may call what cloud_elastic never calls: {sorted(unused)}"


@pytest.mark.parametrize("cloud", CLOUDS)
def test_example_root_calls_the_module_correctly(tree, cloud):
    assert example_problems(tree, cloud) == []


def test_each_cloud_has_a_module_and_an_example():
    assert sorted(p.name for p in (TERRAFORM_DIR / "modules").iterdir() if p.is_dir()) == sorted([*CLOUDS, "common"])
    examples = sorted(p.name for p in (TERRAFORM_DIR / "examples").iterdir() if p.is_dir())
    # Besides one example per cloud, the multi-source ones (tests/terraform/test_multi_source.py checks them).
    assert examples == sorted([*CLOUDS, "aws-multi-source", "gcp-multi-source"])

