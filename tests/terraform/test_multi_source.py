"""The multi-source examples (issue 45): two Spot groups and an on-demand fallback at capacity 0, for AWS and GCP.

Structural checks on the parsed HCL, the printed command line parsed by the Python CLI itself, and, where
the offline provider mirror exists (AWS), ``terraform validate``.
"""

from __future__ import annotations

import re
import shutil

import pytest

from cloud_elastic.providers.selection import source_specs

from .conftest import init
from .conventions import call_problems, variable_problems, version_problems
from .hcl import TERRAFORM_DIR, Module, reference

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


def test_gcp_fallback_template_names_its_region():
    """Its subnetwork is a bare name ("default"), which Compute Engine resolves in the template's region; the
    provider block sets only the project, so without a region of its own the template cannot be created."""
    template = Module.load(EXAMPLES["gcp"]).resource("google_compute_instance_template", "on_demand")
    assert "var.zone" in str(reference(template.get("region"))), template.get("region")


def _gcp_variables_root(tmp_path, terraform, outputs: str = ""):
    """The GCP example's variables alone (no provider: init has nothing to fetch), to plan them with Terraform."""
    shutil.copy(EXAMPLES["gcp"] / "variables.tf", tmp_path / "variables.tf")
    (tmp_path / "outputs.tf").write_text(outputs)
    empty = tmp_path / "no-plugins"
    empty.mkdir()
    init(terraform, empty, tmp_path)
    return lambda *args: terraform.run(
        "plan", "-input=false", "-var=project=my-project", "-var=ssh_public_key=k", "-var=admin_ssh_cidrs=[]", *args,
        cwd=tmp_path)


@pytest.mark.timeout(120)
def test_gcp_fallback_region_is_the_zones_region(terraform, tmp_path):
    expr = reference(Module.load(EXAMPLES["gcp"]).resource("google_compute_instance_template", "on_demand").get("region"))
    assert expr, "the on-demand template sets no region"
    plan = _gcp_variables_root(tmp_path, terraform, f'output "region" {{\n  value = {expr}\n}}\n')
    result = plan("-var=zone=europe-west4-b", "-var=spot_b_zone=europe-west4-a")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r'region\s*=\s*"europe-west4"', result.stdout), result.stdout


@pytest.mark.timeout(120)
def test_gcp_spot_b_zone_must_be_in_the_region_of_zone(terraform, tmp_path):
    """The workers' templates use the subnetwork of zone's region: a MIG in another region cannot use them."""
    plan = _gcp_variables_root(tmp_path, terraform)
    result = plan("-var=zone=us-central1-a", "-var=spot_b_zone=us-east1-b")
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "spot_b_zone must be in the region of zone" in output, output
    result = plan("-var=zone=us-central1-a", "-var=spot_b_zone=us-central1-c")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(120)
def test_aws_example_validates(initialised, terraform):
    result = terraform.run("validate", cwd=initialised("examples/aws-multi-source"))
    assert result.returncode == 0, result.stdout + result.stderr
