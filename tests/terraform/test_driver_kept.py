"""A later `terraform apply` keeps the running driver: it runs the job, and replacing or restarting it kills the job.

Its image (the AWS examples read Ubuntu's current AMI at every plan; a GCP
family moves on) and its first-boot user data (any bootstrap setting) are
read at creation only. The later_apply run of modules/aws/tests/plan.tftest.hcl shows the AWS
provider's plan itself; the other clouds have no offline provider, so this
reads their HCL.
"""

from __future__ import annotations

import pytest

from .hcl import CLOUDS, block

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
