"""Each structural check can fail: break one property on a copy of the tree and see the check report it.

A mutation replaces one exact piece of text, which must occur exactly once
(so that a mutation cannot silently stop applying when a module changes),
and the named check must then return at least one problem. The unbroken
tree passing the same check is test_structure.py's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest

from .conftest import copy_tree
from .conventions import example_problems, readme_problems, variable_problems, version_problems
from .hcl import Module, Tree
from .properties import CHECKS

pytestmark = pytest.mark.terraform


@dataclass(frozen=True)
class Mutation:
    id: str
    path: str  # relative to the copy's root: terraform/... or docs/terraform.md
    old: str
    new: str
    check: Callable[[Tree], list[str]]


def prop(name: str, cloud: str) -> Callable[[Tree], list[str]]:
    return CHECKS[(name, cloud)]


def module_check(fn: Callable[[Module], list[str]], rel: str) -> Callable[[Tree], list[str]]:
    return lambda tree: fn(Module.load(tree.root / rel))


AWS, GCP, AZURE, IBM, COMMON = (f"terraform/modules/{n}/" for n in ("aws", "gcp", "azure", "ibm", "common"))

MUTATIONS = [
    # workers are Spot
    Mutation("aws-on-demand-above-base", AWS + "main.tf", "on_demand_percentage_above_base_capacity = 0",
             "on_demand_percentage_above_base_capacity = 100", prop("workers_spot", "aws")),
    Mutation("aws-on-demand-base-default", AWS + "variables.tf",
             "0 (the default) means workers are all Spot.\"\n  default     = 0",
             "0 (the default) means workers are all Spot.\"\n  default     = 2", prop("workers_spot", "aws")),
    Mutation("aws-lowest-price", AWS + "variables.tf", 'default     = "capacity-optimized"', 'default     = "lowest-price"',
             prop("workers_spot", "aws")),
    Mutation("aws-one-gpu-type", AWS + "variables.tf", 'default     = ["g5.xlarge", "g6.xlarge"]',
             'default     = ["g5.xlarge"]', prop("workers_spot", "aws")),
    Mutation("aws-no-capacity-rebalance", AWS + "main.tf", "capacity_rebalance        = true",
             "capacity_rebalance        = false", prop("workers_spot", "aws")),
    Mutation("gcp-standard-workers", GCP + "main.tf", 'provisioning_model          = "SPOT"',
             'provisioning_model          = "STANDARD"', prop("workers_spot", "gcp")),
    Mutation("gcp-migrate-on-maintenance", GCP + "main.tf", 'on_host_maintenance         = "TERMINATE"',
             'on_host_maintenance         = "MIGRATE"', prop("workers_spot", "gcp")),
    Mutation("azure-regular-workers", AZURE + "main.tf", 'priority        = "Spot"', 'priority        = "Regular"',
             prop("workers_spot", "azure")),
    Mutation("azure-no-spot-restore", AZURE + "main.tf", "  spot_restore {\n    enabled = true",
             "  spot_restore {\n    enabled = false", prop("workers_spot", "azure")),
    Mutation("azure-fixed-max-price", AZURE + "main.tf", "max_bid_price   = var.max_price", "max_bid_price   = 0.5",
             prop("workers_spot", "azure")),
    Mutation("ibm-spot-statement-dropped", "docs/terraform.md",
             "IBM workers run on standard (on-demand) capacity, not Spot.", "IBM workers are cheap.",
             prop("workers_spot", "ibm")),
    # the driver is on-demand
    Mutation("aws-spot-driver", AWS + "main.tf", "  instance_type               = var.driver_instance_type\n",
             '  instance_type               = var.driver_instance_type\n  instance_market_options {\n    market_type = "spot"\n  }\n',
             prop("driver_on_demand", "aws")),
    Mutation("gcp-spot-driver", GCP + "main.tf", 'provisioning_model  = "STANDARD"', 'provisioning_model  = "SPOT"',
             prop("driver_on_demand", "gcp")),
    Mutation("azure-spot-driver", AZURE + "main.tf", 'priority                        = "Regular"',
             'priority                        = "Spot"', prop("driver_on_demand", "azure")),
    Mutation("ibm-spot-driver", IBM + "main.tf", "  profile        = var.driver_profile\n",
             '  profile        = var.driver_profile\n  availability {\n    class = "spot"\n  }\n',
             prop("driver_on_demand", "ibm")),
    # the termination hook
    Mutation("aws-launch-hook-only", AWS + "main.tf", 'lifecycle_transition   = "autoscaling:EC2_INSTANCE_TERMINATING"',
             'lifecycle_transition   = "autoscaling:EC2_INSTANCE_LAUNCHING"', prop("termination_hook", "aws")),
    Mutation("aws-unbounded-heartbeat", AWS + "variables.tf", "var.lifecycle_heartbeat_timeout_s <= 1800 && ", "",
             prop("termination_hook", "aws")),
    Mutation("aws-hook-default-too-long", AWS + "variables.tf", "  default     = 300\n", "  default     = 86400\n",
             prop("termination_hook", "aws")),
    Mutation("gcp-stop-on-preemption", GCP + "main.tf", 'instance_termination_action = "DELETE"',
             'instance_termination_action = "STOP"', prop("termination_hook", "gcp")),
    Mutation("azure-no-termination-notice", AZURE + "main.tf", "  termination_notification {\n    enabled = true",
             "  termination_notification {\n    enabled = false", prop("termination_hook", "azure")),
    # the driver's permissions
    Mutation("aws-wildcard-action", AWS + "iam.tf", '"ec2:DescribeInstanceTypes",', '"ec2:DescribeInstanceTypes",\n      "ec2:*",',
             prop("driver_permissions", "aws")),
    Mutation("aws-extra-action", AWS + "iam.tf", '"ec2:DescribeInstanceTypes",', '"ec2:DescribeInstanceTypes",\n      "iam:PassRole",',
             prop("driver_permissions", "aws")),
    Mutation("aws-lifecycle-on-any-group", AWS + "iam.tf", "resources = [aws_autoscaling_group.workers.arn]", 'resources = ["*"]',
             prop("driver_permissions", "aws")),
    Mutation("aws-managed-policy", AWS + "iam.tf", 'resource "aws_iam_instance_profile" "driver" {',
             'resource "aws_iam_role_policy_attachment" "admin" {\n  role       = aws_iam_role.driver.name\n'
             '  policy_arn = "arn:aws:iam::aws:policy/AdministratorAccess"\n}\n\nresource "aws_iam_instance_profile" "driver" {',
             prop("driver_permissions", "aws")),
    Mutation("aws-worker-profile", AWS + "main.tf", "  ebs_optimized          = true\n",
             '  ebs_optimized          = true\n  iam_instance_profile {\n    name = "workers"\n  }\n',
             prop("checkpoint_access", "aws")),
    Mutation("gcp-wildcard-permission", GCP + "iam.tf", '"compute.machineTypes.get",', '"compute.machineTypes.get",\n    "compute.*",',
             prop("driver_permissions", "gcp")),
    Mutation("gcp-predefined-role", GCP + "iam.tf", "role    = google_project_iam_custom_role.discovery.id",
             'role    = "roles/compute.viewer"', prop("driver_permissions", "gcp")),
    Mutation("azure-write-action", AZURE + "iam.tf", '"Microsoft.Compute/virtualMachineScaleSets/read",',
             '"Microsoft.Compute/virtualMachineScaleSets/read",\n      "Microsoft.Compute/virtualMachineScaleSets/delete",',
             prop("driver_permissions", "azure")),
    Mutation("azure-subscription-scope", AZURE + "iam.tf", "  scope              = azurerm_resource_group.this.id",
             '  scope              = "/subscriptions/${data.azurerm_client_config.current.subscription_id}"',
             prop("driver_permissions", "azure")),
    Mutation("ibm-editor-role", IBM + "iam.tf", 'roles       = ["Viewer"]', 'roles       = ["Viewer", "Editor"]',
             prop("driver_permissions", "ibm")),
    Mutation("ibm-account-wide", IBM + "iam.tf", "    resource_group_id = var.resource_group_id\n", "",
             prop("driver_permissions", "ibm")),
    # metadata hardening
    Mutation("aws-imdsv1-workers", AWS + "main.tf", '    http_tokens                 = "required"\n    http_put_response_hop_limit = 1\n'
             '    instance_metadata_tags      = "disabled"\n  }\n\n  block_device_mappings',
             '    http_tokens                 = "optional"\n    http_put_response_hop_limit = 1\n'
             '    instance_metadata_tags      = "disabled"\n  }\n\n  block_device_mappings', prop("metadata_hardening", "aws")),
    Mutation("aws-imdsv1-driver", AWS + "main.tf", '    http_tokens                 = "required"\n    http_put_response_hop_limit = 1\n'
             '    instance_metadata_tags      = "disabled"\n  }\n\n  root_block_device',
             '    http_tokens                 = "optional"\n    http_put_response_hop_limit = 1\n'
             '    instance_metadata_tags      = "disabled"\n  }\n\n  root_block_device', prop("metadata_hardening", "aws")),
    Mutation("ibm-plain-http-metadata", IBM + "main.tf", 'protocol           = "https"', 'protocol           = "http"',
             prop("metadata_hardening", "ibm")),
    # discovery tags
    Mutation("common-role-tag-renamed", COMMON + "main.tf", '"cloud-elastic-role"    = "worker"', '"role"                  = "worker"',
             prop("discovery_tags", "aws")),
    Mutation("common-driver-role-value", COMMON + "main.tf", '"cloud-elastic-role"    = "driver"',
             '"cloud-elastic-role"    = "controller"', prop("discovery_tags", "gcp")),
    Mutation("common-extra-tags-win", COMMON + "outputs.tf", "merge(var.tags, local.worker_tags)", "merge(local.worker_tags, var.tags)",
             prop("discovery_tags", "azure")),
    Mutation("aws-tags-not-propagated", AWS + "main.tf", "propagate_at_launch = true", "propagate_at_launch = false",
             prop("discovery_tags", "aws")),
    Mutation("aws-driver-untagged", AWS + "main.tf", "tags = merge(module.common.driver_tags,", "tags = merge(var.tags,",
             prop("discovery_tags", "aws")),
    Mutation("gcp-labels-from-user-only", GCP + "main.tf", "  labels       = module.common.worker_tags\n", "  labels       = var.labels\n",
             prop("discovery_tags", "gcp")),
    Mutation("azure-driver-untagged", AZURE + "main.tf",
             "  allow_extension_operations      = false\n  tags                            = module.common.driver_tags",
             "  allow_extension_operations      = false\n  tags                            = var.tags", prop("discovery_tags", "azure")),
    Mutation("ibm-group-untagged", IBM + "main.tf", "  tags              = local.worker_tags\n", "", prop("discovery_tags", "ibm")),
    # outputs for the CLI line
    Mutation("aws-wrong-region-flag", AWS + "outputs.tf", "--aws-region ${", "--region ${", prop("cli_outputs", "aws")),
    Mutation("aws-missing-hook-output", AWS + "outputs.tf", 'output "lifecycle_hook_name" {', 'output "hook" {',
             prop("cli_outputs", "aws")),
    Mutation("gcp-no-zone-flag", GCP + "outputs.tf", '"--gcp-zone ${var.zones[0]}"', '"${var.zones[0]}"', prop("cli_outputs", "gcp")),
    Mutation("azure-subscription-from-var", AZURE + "outputs.tf",
             "--azure-subscription ${data.azurerm_client_config.current.subscription_id}", "--azure-subscription ${var.location}",
             prop("cli_outputs", "azure")),
    Mutation("ibm-missing-group-output", IBM + "outputs.tf", 'output "instance_group_id" {', 'output "group" {',
             prop("cli_outputs", "ibm")),
    Mutation("common-no-min-np", COMMON + "outputs.tf", "--min-np ${local.min_np} ", "", prop("cli_outputs", "ibm")),
    Mutation("common-own-known-hosts", COMMON + "outputs.tf", "--ssh-identity-file ${var.ssh_identity_file} ",
             "--ssh-identity-file ${var.ssh_identity_file} --ssh-option UserKnownHostsFile=~/.ssh/known_hosts ",
             prop("cli_outputs", "gcp")),
    # inbound rules
    Mutation("aws-admin-ssh-from-anywhere", AWS + "network.tf", "  cidr_ipv4         = each.value\n", '  cidr_ipv4         = "0.0.0.0/0"\n',
             prop("inbound_rules", "aws")),
    Mutation("aws-all-ports-between-workers", AWS + "network.tf", "  from_port                    = module.common.training_ports.from\n"
             "  to_port                      = module.common.training_ports.to\n  referenced_security_group_id = aws_security_group.workers.id\n"
             "  tags                         = module.common.worker_tags",
             "  from_port                    = 0\n  to_port                      = 65535\n"
             "  referenced_security_group_id = aws_security_group.workers.id\n  tags                         = module.common.worker_tags",
             prop("inbound_rules", "aws")),
    Mutation("gcp-ssh-from-anywhere", GCP + "network.tf",
             "  source_service_accounts = [google_service_account.driver.email]\n  target_service_accounts = [google_service_account.workers.email]",
             '  source_ranges           = ["0.0.0.0/0"]\n  target_service_accounts = [google_service_account.workers.email]',
             prop("inbound_rules", "gcp")),
    Mutation("gcp-no-deny", GCP + "network.tf", "  deny {\n    protocol = \"all\"\n  }", "  allow {\n    protocol = \"icmp\"\n  }",
             prop("inbound_rules", "gcp")),
    Mutation("azure-deny-becomes-allow", AZURE + "network.tf", 'access                      = "Deny"', 'access                      = "Allow"',
             prop("inbound_rules", "azure")),
    Mutation("ibm-ssh-from-anywhere", IBM + "network.tf", "  remote    = ibm_is_security_group.driver.id\n",
             '  remote    = "0.0.0.0/0"\n', prop("inbound_rules", "ibm")),
    # the notice queue (queue mode)
    Mutation("aws-queue-unencrypted", AWS + "notices.tf", "sqs_managed_sse_enabled = true", "sqs_managed_sse_enabled = false",
             prop("notice_queue", "aws")),
    Mutation("aws-queue-keeps-two-weeks", AWS + "notices.tf", "max(300, var.lifecycle_heartbeat_timeout_s)", "1209600",
             prop("notice_queue", "aws")),
    Mutation("aws-no-rebalance-events", AWS + "notices.tf", ', "EC2 Instance Rebalance Recommendation"]', "]",
             prop("notice_queue", "aws")),
    Mutation("aws-lifecycle-of-every-group", AWS + "notices.tf",
             "    detail = {\n      AutoScalingGroupName = [aws_autoscaling_group.workers.name]\n    }\n", "",
             prop("notice_queue", "aws")),
    Mutation("aws-rule-without-target", AWS + "notices.tf",
             "  rule      = aws_cloudwatch_event_rule.spot_notices.name\n  target_id = \"notice-queue\"\n  arn       = aws_sqs_queue.notices.arn",
             "  rule      = aws_cloudwatch_event_rule.spot_notices.name\n  target_id = \"notice-queue\"\n  arn       = var.vpc_id",
             prop("notice_queue", "aws")),
    Mutation("aws-queue-any-sender", AWS + "notices.tf", 'identifiers = ["events.amazonaws.com"]', 'identifiers = ["*"]',
             prop("notice_queue", "aws")),
    Mutation("aws-queue-any-rule", AWS + "notices.tf",
             "    condition {\n      test     = \"ArnEquals\"", "    condition {\n      test     = \"ArnLike\"",
             prop("notice_queue", "aws")),
    Mutation("aws-sqs-on-any-queue", AWS + "iam.tf", "resources = [aws_sqs_queue.notices.arn]", 'resources = ["*"]',
             prop("driver_permissions", "aws")),
    Mutation("aws-driver-may-send", AWS + "iam.tf", '"sqs:DeleteMessage",', '"sqs:DeleteMessage",\n      "sqs:SendMessage",',
             prop("driver_permissions", "aws")),
    Mutation("aws-cli-without-notice-queue", AWS + "outputs.tf", "--aws-notice-queue ${aws_sqs_queue.notices.url} ", "",
             prop("cli_outputs", "aws")),
    # checkpoint storage: the driver and every worker, on the checkpoint location only
    Mutation("aws-checkpoint-any-object", AWS + "checkpoints.tf", 'resources = ["${local.checkpoint_objects}/*"]',
             'resources = ["arn:aws:s3:::*"]', prop("checkpoint_access", "aws")),
    Mutation("aws-checkpoint-list-any-bucket", AWS + "checkpoints.tf", 'resources = ["arn:aws:s3:::${var.checkpoint_bucket}"]',
             'resources = ["arn:aws:s3:::*"]', prop("checkpoint_access", "aws")),
    Mutation("aws-workers-without-checkpoint-profile", AWS + "main.tf", "for_each = aws_iam_instance_profile.workers[*].name",
             "for_each = []", prop("checkpoint_access", "aws")),
    Mutation("aws-cli-without-checkpoint-dir", COMMON + "outputs.tf", '"--checkpoint-dir ${local.checkpoint_dir} "', '""',
             prop("checkpoint_access", "aws")),
    Mutation("gcp-checkpoint-bucket-admin", GCP + "checkpoints.tf", 'role   = "roles/storage.objectUser"',
             'role   = "roles/storage.admin"', prop("checkpoint_access", "gcp")),
    Mutation("gcp-checkpoint-driver-only", GCP + "checkpoints.tf", "    workers = google_service_account.workers.email\n", "",
             prop("checkpoint_access", "gcp")),
    Mutation("azure-checkpoint-account-scope", AZURE + "checkpoints.tf",
             '"${var.checkpoint_container.storage_account_id}/blobServices/default/containers/${var.checkpoint_container.name}"',
             "var.checkpoint_container.storage_account_id", prop("checkpoint_access", "azure")),
    Mutation("azure-workers-without-checkpoint-identity", AZURE + "main.tf", '      type         = "UserAssigned"',
             '      type         = "SystemAssigned"', prop("checkpoint_access", "azure")),
    # conventions
    Mutation("variable-without-validation", AWS + "variables.tf",
             '  validation {\n    condition     = can(regex("^vpc-[0-9a-f]{8,17}$", var.vpc_id))\n'
             '    error_message = "vpc_id must look like vpc-0123456789abcdef0."\n  }\n', "",
             module_check(variable_problems, "modules/aws")),
    Mutation("variable-without-description", GCP + "variables.tf",
             '  description = "Project that holds the cluster (--gcp-project)."\n', "",
             module_check(variable_problems, "modules/gcp")),
    Mutation("passthrough-not-validated", COMMON + "variables.tf",
             '    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user))', "    condition     = true",
             module_check(variable_problems, "modules/ibm")),
    Mutation("unbounded-provider", AZURE + "versions.tf", 'version = ">= 4.0, < 5.0"', 'version = ">= 4.0"',
             module_check(version_problems, "modules/azure")),
    Mutation("backend-block", IBM + "versions.tf", 'required_version = ">= 1.9, < 2.0"',
             'required_version = ">= 1.9, < 2.0"\n\n  backend "s3" {}', module_check(version_problems, "modules/ibm")),
    Mutation("readme-stale-output", AWS + "outputs.tf", 'output "driver_address" {', 'output "driver_host" {',
             lambda tree: readme_problems(tree, "aws")),
    Mutation("example-unknown-argument", "terraform/examples/gcp/main.tf", "  target_size        = var.workers\n",
             "  size               = var.workers\n", lambda tree: example_problems(tree, "gcp")),
]


def test_every_property_of_every_cloud_has_a_mutation():
    covered = {key for key, check in CHECKS.items() if any(m.check is check for m in MUTATIONS)}
    assert covered == set(CHECKS)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.id)
def test_breaking_a_property_fails_its_check(mutation, tmp_path):
    tree = copy_tree(tmp_path)
    target = tmp_path / mutation.path
    text = target.read_text()
    assert text.count(mutation.old) == 1, f"mutation {mutation.id} no longer applies to {mutation.path}"
    target.write_text(text.replace(mutation.old, mutation.new))
    problems = mutation.check(tree)
    assert problems, f"{mutation.id}: the check did not notice"
