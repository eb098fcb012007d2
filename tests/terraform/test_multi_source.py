"""The multi-source examples (issue 45): two Spot groups and an on-demand fallback at capacity 0, for AWS and GCP.

Structural checks on the parsed HCL, the printed command line parsed by the Python CLI itself, and, where
the offline provider mirror exists (AWS), ``terraform validate``.
"""

from __future__ import annotations

import re

import pytest

from cloud_elastic.providers.selection import source_specs

from .conventions import call_problems, variable_problems, version_problems
from .hcl import TERRAFORM_DIR, Module

pytestmark = [pytest.mark.terraform, pytest.mark.timeout(60)]

EXAMPLES = {cloud: TERRAFORM_DIR / "examples" / f"{cloud}-multi-source" for cloud in ("aws", "gcp")}


def _interpolations_as_names(text: str) -> str:
    """``${...}`` as a plain name made of the reference (a price variable as its default), so the Python CLI
    can parse the line."""
    text = text.replace("${var.on_demand_price}", str(Module.load(EXAMPLES["aws"]).variable_default("on_demand_price")))
    text = text.replace("${var.on_demand_price_per_gpu_hour}",
                        str(Module.load(EXAMPLES["gcp"]).variable_default("on_demand_price_per_gpu_hour")))
    return re.sub(r"\$\{([^}]*)\}", lambda m: re.sub(r"[^\w-]+", "-", m.group(1)).strip("-") or "x", text)


def _specs(flags: str):
    """The host sources and the job configuration the Python CLI makes of ``run FLAGS``."""
    from cloud_elastic.cli import parse_command_line

    argv = ["run", "-np", "2", *_interpolations_as_names(flags).split(), "python", "train.py"]
    _, params, discovery = parse_command_line(argv)
    return {s.name: s for s in source_specs(discovery)}, params["config"]


@pytest.mark.parametrize("cloud", sorted(EXAMPLES))
def test_each_example_follows_the_conventions_and_calls_its_module(cloud):
    example = Module.load(EXAMPLES[cloud])
    assert variable_problems(example) == []
    assert version_problems(example) == []
    module = Module.load(TERRAFORM_DIR / "modules" / cloud)
    (call,) = [c for c in example.module_calls.values() if c.get("source") == f"../../modules/{cloud}"]
    assert call_problems(module, call, f"examples/{cloud}-multi-source") == []


def test_aws_two_spot_groups_and_an_on_demand_fallback_at_zero_that_only_the_driver_sizes():
    m = Module.load(EXAMPLES["aws"])
    spot_b, fallback = m.resource("aws_autoscaling_group", "spot_b"), m.resource("aws_autoscaling_group", "fallback")
    dist = lambda g: g["mixed_instances_policy"][0]["instances_distribution"][0]  # noqa: E731
    assert dist(spot_b)["on_demand_percentage_above_base_capacity"] == 0  # all Spot, like the module's group
    assert dist(fallback)["on_demand_percentage_above_base_capacity"] == 100
    assert fallback["desired_capacity"] == 0 and fallback["min_size"] == 0
    assert "desired_capacity" in str(fallback["lifecycle"][0]["ignore_changes"])  # apply never undoes the driver
    statements = m.data("aws_iam_policy_document", "multi_source")["statement"]
    sizing = [s for s in statements if "autoscaling:SetDesiredCapacity" in s["actions"]]
    assert len(sizing) == 1 and sizing[0]["resources"] == ["${aws_autoscaling_group.fallback.arn}"]
    for s in statements:
        assert s["resources"] != ["*"] or all(":Describe" in a for a in s["actions"]), s


def test_aws_printed_command_line_names_the_three_groups_and_the_python_cli_accepts_it():
    m = Module.load(EXAMPLES["aws"])
    module_line = str(Module.load(TERRAFORM_DIR / "modules" / "aws").outputs["cli_command"]["value"])
    # What replace() takes out of the module's line is in it (the queue flag), and what it puts in is parsed below.
    assert str(m.locals["shared_flags"]).replace("module.cloud_elastic.notice_queue_url", "aws_sqs_queue.notices.url") \
        in module_line
    assert "replace(module.cloud_elastic.cli_command, local.shared_flags, local.multi_flags)" in str(
        m.outputs["cli_command"]["value"])
    text = " ".join(re.findall(r'"([^"]*)"', str(m.locals["multi_flags"])))
    specs, config = _specs("--aws-asg ${module.cloud_elastic.asg_name} --aws-region us-east-1 " + text)
    assert [(s.provider, s.fallback) for s in specs.values()] == [("aws", False), ("aws", False), ("aws", True)]
    assert list(specs.values())[0].options.get("notice_queue")  # the module's queue stays with its group
    assert config.manage_capacity


def test_gcp_two_spot_migs_and_an_on_demand_fallback_at_zero_that_only_the_driver_resizes():
    m = Module.load(EXAMPLES["gcp"])
    spot_b, fallback = (m.resource("google_compute_instance_group_manager", n) for n in ("spot_b", "fallback"))
    assert fallback["target_size"] == 0 and "target_size" in str(fallback["lifecycle"][0]["ignore_changes"])
    template = m.resource("google_compute_instance_template", "on_demand")
    assert template["scheduling"][0]["provisioning_model"] == "STANDARD"
    assert "module.cloud_elastic.instance_template_id" in str(spot_b["version"])
    text = " ".join(re.findall(r'"([^"]*)"', str(m.locals["multi_flags"])))
    specs, config = _specs("--gcp-mig ${local.created_mig_name} --gcp-project p " + text)
    names = list(specs)
    assert [(s.provider, s.fallback) for s in specs.values()] == [("gcp", False), ("gcp", False), ("gcp", True)]
    assert specs[names[1]].options["zone"] == "var-spot_b_zone" and specs[names[0]].options["zone"] == "var-zone"
    assert specs[names[2]].price == 0.85 and config.manage_capacity
    role = m.resource("google_project_iam_custom_role", "resize_fallback")
    assert role["permissions"] == ["compute.instanceGroupManagers.update"]
    grant = m.resource("google_project_iam_member", "driver_resize_fallback")
    assert "google_compute_instance_group_manager.fallback.name" in str(grant["condition"])


@pytest.mark.timeout(120)
def test_aws_example_validates(initialised, terraform):
    result = terraform.run("validate", cwd=initialised("examples/aws-multi-source"))
    assert result.returncode == 0, result.stdout + result.stderr
