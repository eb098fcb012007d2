"""A later `terraform apply` keeps the running driver: it runs the job, and replacing or restarting it kills the job.

Its image (the AWS examples read Ubuntu's current AMI at every plan; a GCP
family moves on) and its first-boot user data (any bootstrap setting) are
read at creation only. The later_apply run of modules/aws/tests/plan.tftest.hcl shows the AWS
provider's plan itself; the other clouds have no offline provider, so this
reads their HCL.
"""

from __future__ import annotations

import pytest

from .hcl import CLOUDS, TERRAFORM_DIR, Module, block

pytestmark = pytest.mark.terraform

# cloud -> (driver resource type, attributes a later apply must leave alone)
DRIVER_KEPT = {
    "aws": ("aws_instance", {"ami", "user_data_base64"}),
    "gcp": ("google_compute_instance", {"boot_disk[0].initialize_params[0].image"}),
    "azure": ("azurerm_linux_virtual_machine", {"custom_data"}),
    "ibm": ("ibm_is_instance", {"image", "user_data"}),
}


def test_every_cloud_is_covered():
    assert set(DRIVER_KEPT) == set(CLOUDS)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_driver_ignores_a_new_image_and_new_user_data(tree, cloud):
    type_, kept = DRIVER_KEPT[cloud]
    lifecycle = block(tree.module(cloud).resource(type_, "driver"), "lifecycle") or {}
    ignored = {str(a).removeprefix("${").removesuffix("}") for a in lifecycle.get("ignore_changes", [])}
    assert kept <= ignored, f"{cloud}: a later apply would replace or restart the running driver over {sorted(kept - ignored)}"


def test_the_aws_worker_group_ignores_its_initial_hook_and_a_hook_resource_owns_it(tree):
    """The provider replaces the whole group (every worker) when initial_lifecycle_hook changes."""
    m = tree.module("aws")
    lifecycle = block(m.resource("aws_autoscaling_group", "workers"), "lifecycle") or {}
    assert "initial_lifecycle_hook" in lifecycle.get("ignore_changes", [])
    [hook] = m.resources("aws_autoscaling_lifecycle_hook").values()
    assert hook["heartbeat_timeout"] == "${var.lifecycle_heartbeat_timeout_s}"
    assert hook["name"] == "${local.lifecycle_hook_name}"
    assert hook["autoscaling_group_name"] == "${aws_autoscaling_group.workers.name}"


def test_the_multi_source_example_keeps_its_other_groups_when_the_drain_timeout_changes():
    """spot_b and the fallback had a hard-coded initial_lifecycle_hook and nothing else: a changed timeout replaced
    them, with every worker on them. Each ignores it, a hook resource per group owns it, and one variable sets the
    timeout of all three groups (the module's too). The later_apply_longer_drain run of the example's
    tests/later.tftest.hcl shows the provider's plan itself."""
    m = Module.load(TERRAFORM_DIR / "examples" / "aws-multi-source")
    groups = m.resources("aws_autoscaling_group")
    assert set(groups) == {"spot_b", "fallback"}
    [hook] = m.resources("aws_autoscaling_lifecycle_hook").values()
    for name, group in groups.items():
        assert "initial_lifecycle_hook" in (block(group, "lifecycle") or {}).get("ignore_changes", []), name
        assert block(group, "initial_lifecycle_hook")["heartbeat_timeout"] == "${var.lifecycle_heartbeat_timeout_s}"
        assert f"aws_autoscaling_group.{name}.name" in str(hook["for_each"]), name
    assert hook["autoscaling_group_name"] == "${each.value}"
    assert hook["heartbeat_timeout"] == "${var.lifecycle_heartbeat_timeout_s}"
    call = m.module_calls["cloud_elastic"]
    assert call["lifecycle_heartbeat_timeout_s"] == "${var.lifecycle_heartbeat_timeout_s}"
