"""The properties every cloud module must have, as checks over parsed HCL.

Each check takes a :class:`~tests.terraform.hcl.Tree` and returns a list of
problems (empty when the property holds), so the same function serves the
real tree (``test_structure.py``) and copies broken on purpose
(``test_mutations.py``, which shows each check can fail).

``CHECKS`` maps ``(property, cloud)`` to its check. Where a property has no
meaning on a cloud, ``NOT_APPLICABLE`` says why instead.

The expected permission sets and CLI flags below are the specification from
the issue; the tag names are imported from the package, never repeated.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from cloud_elastic.providers.selection import CLOUD_FLAGS
from cloud_elastic.providers.tags import CLUSTER_TAG, ROLE_DRIVER, ROLE_TAG, ROLE_WORKER

from .hcl import CLOUDS, Module, Tree, block, blocks, dynamic, mentions, merge_args, reference

Check = Callable[[Tree], list[str]]

PROPERTIES = (
    "workers_spot",
    "driver_on_demand",
    "termination_hook",
    "driver_permissions",
    "metadata_hardening",
    "discovery_tags",
    "cli_outputs",
    "inbound_rules",
    "notice_queue",
    "checkpoint_access",
)

CHECKS: dict[tuple[str, str], Check] = {}

NOT_APPLICABLE: dict[tuple[str, str], str] = {
    ("termination_hook", "ibm"): "IBM Cloud VPC has no termination hook and gives no advance notice",
    ("metadata_hardening", "gcp"): "the GCP metadata server always requires the Metadata-Flavor header; nothing to set",
    ("metadata_hardening", "azure"): "Azure IMDS always requires the Metadata header and is not routable; nothing to set",
    ("notice_queue", "gcp"): "GCP publishes no preemption event to a queue; the worker's metadata watcher reads it",
    ("notice_queue", "azure"): "Azure's Spot and Terminate notices are Scheduled Events on the VM; the metadata watcher reads them",
    ("notice_queue", "ibm"): "IBM Cloud VPC gives no advance notice to forward",
    ("checkpoint_access", "ibm"): "COS through s3fs signs with HMAC keys, which an IAM grant cannot stand for; "
                                  "the module grants nothing and docs/terraform.md says so",
}

# What the driver may do, from the issue: discovery and notices, nothing else.
AWS_DRIVER_ACTIONS = {
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeLifecycleHooks",
    "ec2:DescribeInstances",
    "ec2:DescribeInstanceTypes",
    "autoscaling:CompleteLifecycleAction",
    "autoscaling:RecordLifecycleActionHeartbeat",
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
}
AWS_QUEUE_SCOPED_ACTIONS = {"sqs:ReceiveMessage", "sqs:DeleteMessage"}
# The events queue mode reads (the issue): detail-type -> source.
AWS_NOTICE_EVENTS = {
    "EC2 Spot Instance Interruption Warning": "aws.ec2",
    "EC2 Instance Rebalance Recommendation": "aws.ec2",
    "EC2 Instance-terminate Lifecycle Action": "aws.autoscaling",
}
AWS_GROUP_SCOPED_ACTIONS = {"autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"}
GCP_DRIVER_PERMISSIONS = {
    "compute.instanceGroupManagers.get",
    "compute.instances.get",
    "compute.instances.list",
    "compute.machineTypes.get",
}
AZURE_DRIVER_ACTIONS = {
    "Microsoft.Compute/virtualMachineScaleSets/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/instanceView/read",
    "Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read",
}
IBM_DRIVER_ROLES = ["Viewer"]
# Checkpoint storage (checkpoint_bucket / checkpoint_container): the driver and every worker, on that location only.
AWS_CHECKPOINT_POLICIES = {"driver_checkpoints": "aws_iam_role.driver", "workers_checkpoints": "aws_iam_role.workers"}
AWS_CHECKPOINT_OBJECT_ACTIONS = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"}
AZURE_CHECKPOINT_GRANTS = {
    "driver_checkpoints": "azurerm_linux_virtual_machine.driver.identity",
    "workers_checkpoints": "azurerm_user_assigned_identity.workers",
}

# Outputs each module must have, and what the cloud flags of cli_command must
# interpolate (every name listed must appear in the flag's ${...}).
REQUIRED_OUTPUTS = {
    "aws": {"asg_name", "region", "driver_address", "lifecycle_hook_name", "cli_command"},
    "gcp": {"mig_name", "project", "zone", "region", "driver_address", "cli_command"},
    "azure": {"vmss_name", "resource_group", "subscription_id", "driver_address", "cli_command"},
    "ibm": {"instance_group_id", "region", "driver_address", "cli_command"},
}
CLI_FLAGS = {
    "aws": {
        "--aws-asg": ["aws_autoscaling_group.workers.name"],
        "--aws-region": ["data.aws_region.current.name"],
        "--aws-notice-queue": ["aws_sqs_queue.notices.url"],
    },
    "gcp": {
        "--gcp-mig": ["google_compute_instance_group_manager.workers", "google_compute_region_instance_group_manager.workers"],
        "--gcp-project": ["var.project"],
        "--gcp-zone": ["var.zones"],
        "--gcp-region": ["var.zones"],
    },
    "azure": {
        "--azure-vmss": ["azurerm_linux_virtual_machine_scale_set.workers.name"],
        "--azure-resource-group": ["azurerm_resource_group.this.name"],
        "--azure-subscription": ["data.azurerm_client_config.current.subscription_id"],
    },
    "ibm": {
        "--ibm-instance-group": ["ibm_is_instance_group.workers.id"],
        "--ibm-region": ["var.zone"],
    },
}
SHARED_CLI_FLAGS = ("-np", "--min-np", "--max-np", "--ssh-user", "--ssh-identity-file")

# IBM offers no Spot capacity this module can request; the docs must say so.
IBM_SPOT_STATEMENT = "IBM workers run on standard (on-demand) capacity, not Spot"

# Inbound traffic the issue allows: (to, from, ports).
EXPECTED_INBOUND = {
    ("workers", "driver", "ssh"),
    ("workers", "workers", "training"),
    ("driver", "workers", "training"),
    ("driver", "admin", "ssh"),
}


def check(prop: str, *clouds: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        for cloud in clouds:
            CHECKS[(prop, cloud)] = fn
        return fn

    return register


class Problems(list):
    """A list of problems with a one-line way to add one."""

    def expect(self, ok: Any, problem: str) -> bool:
        if not ok:
            self.append(problem)
        return bool(ok)


def _value(module: Module, expr: Any, problems: Problems, what: str) -> Any:
    try:
        return module.value(expr)
    except LookupError as exc:
        problems.append(f"{what}: {exc}")
        return None


# ----------------------------------------------------------------- workers_spot


@check("workers_spot", "aws")
def _aws_workers_spot(tree: Tree) -> list[str]:
    m, p = tree.module("aws"), Problems()
    asg = m.resource("aws_autoscaling_group", "workers")
    policy = block(asg, "mixed_instances_policy") or {}
    dist = block(policy, "instances_distribution") or {}
    p.expect(dist, "the worker group has no mixed_instances_policy.instances_distribution")
    pct = _value(m, dist.get("on_demand_percentage_above_base_capacity"), p, "on-demand percentage")
    p.expect(pct == 0, f"workers above the on-demand base must all be Spot (percentage {pct!r}, want 0)")
    base = _value(m, dist.get("on_demand_base_capacity"), p, "on-demand base")
    p.expect(base == 0, f"the on-demand base must default to 0, got {base!r}")
    strategy = _value(m, dist.get("spot_allocation_strategy"), p, "spot allocation strategy")
    p.expect(isinstance(strategy, str) and "capacity-optimized" in strategy,
             f"spot allocation must be capacity-optimised, got {strategy!r}")
    template = block(policy, "launch_template") or {}
    override = dynamic(template, "override")
    if override is not None:
        types = _value(m, override.get("for_each"), p, "instance type overrides") or []
    else:
        types = [b.get("instance_type") for b in blocks(template, "override")]
    p.expect(len(types) >= 2, f"the group must offer several GPU instance types, got {types!r}")
    p.expect(asg.get("capacity_rebalance") is True, "capacity_rebalance must be true")
    lt = m.resource("aws_launch_template", "workers")
    p.expect("instance_market_options" not in lt,
             "the launch template must not set instance_market_options (the group's policy chooses Spot)")
    return p


@check("workers_spot", "gcp")
def _gcp_workers_spot(tree: Tree) -> list[str]:
    m, p = tree.module("gcp"), Problems()
    sched = block(m.resource("google_compute_instance_template", "workers"), "scheduling") or {}
    p.expect(sched.get("provisioning_model") == "SPOT", f"workers: provisioning_model {sched.get('provisioning_model')!r}, want SPOT")
    p.expect(sched.get("preemptible") is True, "workers: preemptible must be true")
    p.expect(sched.get("automatic_restart") is False, "workers: automatic_restart must be false")
    p.expect(sched.get("on_host_maintenance") == "TERMINATE", "workers: on_host_maintenance must be TERMINATE")
    return p


@check("workers_spot", "azure")
def _azure_workers_spot(tree: Tree) -> list[str]:
    m, p = tree.module("azure"), Problems()
    vmss = m.resource("azurerm_linux_virtual_machine_scale_set", "workers")
    p.expect(vmss.get("priority") == "Spot", f"workers: priority {vmss.get('priority')!r}, want Spot")
    policy = _value(m, vmss.get("eviction_policy"), p, "eviction policy")
    p.expect(policy in ("Delete", "Deallocate"), f"workers: eviction_policy {policy!r}")
    price_ref = reference(vmss.get("max_bid_price")) or ""
    p.expect(price_ref.startswith("var."), "workers: max_bid_price must come from a variable")
    price = _value(m, vmss.get("max_bid_price"), p, "max price")
    p.expect(price == -1 or (isinstance(price, (int, float)) and price > 0), f"workers: max price default {price!r}")
    # Without Try & restore a scale set does not replace an evicted Spot VM: the group only shrinks.
    restore = block(vmss, "spot_restore") or {}
    p.expect(restore.get("enabled") is True, "workers: spot_restore must be enabled, or evicted workers are never replaced")
    return p


@check("workers_spot", "ibm")
def _ibm_workers_spot(tree: Tree) -> list[str]:
    p = Problems()
    p.expect(IBM_SPOT_STATEMENT in tree.readme("ibm"), "modules/ibm/README.md must say plainly that workers are not Spot")
    p.expect(IBM_SPOT_STATEMENT in tree.docs, "docs/terraform.md must say plainly that IBM workers are not Spot")
    return p


# ------------------------------------------------------------- driver_on_demand


@check("driver_on_demand", "aws")
def _aws_driver_on_demand(tree: Tree) -> list[str]:
    driver, p = tree.module("aws").resource("aws_instance", "driver"), Problems()
    market = block(driver, "instance_market_options")
    p.expect(market is None or market.get("market_type") not in ("spot", None),
             "the driver must be on-demand (no Spot instance_market_options)")
    p.expect("spot_price" not in driver, "the driver must not set a Spot price")
    return p


@check("driver_on_demand", "gcp")
def _gcp_driver_on_demand(tree: Tree) -> list[str]:
    sched = block(tree.module("gcp").resource("google_compute_instance", "driver"), "scheduling") or {}
    p = Problems()
    p.expect(sched.get("provisioning_model", "STANDARD") == "STANDARD", "the driver must use the STANDARD provisioning model")
    p.expect(sched.get("preemptible", False) is False, "the driver must not be preemptible")
    return p


@check("driver_on_demand", "azure")
def _azure_driver_on_demand(tree: Tree) -> list[str]:
    driver, p = tree.module("azure").resource("azurerm_linux_virtual_machine", "driver"), Problems()
    p.expect(driver.get("priority", "Regular") == "Regular", f"the driver's priority is {driver.get('priority')!r}, want Regular")
    p.expect("eviction_policy" not in driver and "max_bid_price" not in driver, "the driver must have no Spot settings")
    return p


@check("driver_on_demand", "ibm")
def _ibm_driver_on_demand(tree: Tree) -> list[str]:
    driver, p = tree.module("ibm").resource("ibm_is_instance", "driver"), Problems()
    availability = block(driver, "availability") or {}
    p.expect(availability.get("class", "standard") == "standard", "the driver must use standard capacity")
    return p


# ------------------------------------------------------------- termination_hook


@check("termination_hook", "aws")
def _aws_termination_hook(tree: Tree) -> list[str]:
    m, p = tree.module("aws"), Problems()
    hooks = blocks(m.resource("aws_autoscaling_group", "workers"), "initial_lifecycle_hook")
    hooks += list(m.resources("aws_autoscaling_lifecycle_hook").values())
    terminating = [h for h in hooks if h.get("lifecycle_transition") == "autoscaling:EC2_INSTANCE_TERMINATING"]
    if not p.expect(terminating, "the worker group needs an EC2_INSTANCE_TERMINATING lifecycle hook"):
        return p
    # The initial hook and the resource that owns it after creation are one hook (one name).
    p.expect(len(terminating) == len(hooks), "every lifecycle hook of the worker group must be on EC2_INSTANCE_TERMINATING")
    hook = terminating[0]
    timeout = _value(m, hook.get("heartbeat_timeout"), p, "heartbeat timeout")
    p.expect(isinstance(timeout, (int, float)) and 30 <= timeout <= 7200, f"heartbeat timeout {timeout!r} outside 30-7200 s")
    var_ref = reference(hook.get("heartbeat_timeout")) or ""
    if var_ref.startswith("var."):
        name = var_ref[4:]
        conditions = [v.get("condition", "") for v in blocks(m.variables.get(name, {}), "validation")]
        p.expect(any(re.search(rf"var\.{name}\s*<=?\s*\d+", c) for c in conditions),
                 f"variable {name} needs a validation bounding it from above")
    p.expect(hook.get("default_result") in ("CONTINUE", "ABANDON"), "the hook needs a default_result")
    hook_name = reference(hook.get("name"))
    output = m.outputs.get("lifecycle_hook_name", {})
    p.expect(hook_name and reference(output.get("value")) == hook_name, "output lifecycle_hook_name must be the hook's name")
    return p


@check("termination_hook", "gcp")
def _gcp_termination_hook(tree: Tree) -> list[str]:
    # GCP has no lifecycle hook: the notice is the metadata server's
    # `preempted`; what Terraform controls is that a preempted worker is
    # deleted (so the MIG replaces it) instead of lingering stopped.
    sched = block(tree.module("gcp").resource("google_compute_instance_template", "workers"), "scheduling") or {}
    p = Problems()
    p.expect(sched.get("instance_termination_action") == "DELETE", "preempted workers must be deleted (instance_termination_action DELETE)")
    return p


@check("termination_hook", "azure")
def _azure_termination_hook(tree: Tree) -> list[str]:
    vmss = tree.module("azure").resource("azurerm_linux_virtual_machine_scale_set", "workers")
    notification, p = block(vmss, "termination_notification") or {}, Problems()
    p.expect(notification.get("enabled") is True, "the scale set needs termination_notification enabled")
    p.expect(notification.get("timeout"), "termination_notification needs a timeout")
    return p


# ----------------------------------------------------------- driver_permissions


def _exactly(granted: list[str], expected: set[str] | list[str], p: Problems, what: str) -> None:
    """``granted`` holds no wildcard and is exactly ``expected``."""
    for value in granted:
        p.expect("*" not in str(value), f"{what}: wildcard in {value!r}")
    p.expect(set(granted) == set(expected), f"{what}: {sorted(set(granted))} != {sorted(expected)}")


def _only(m: Module, p: Problems, type_: str, name: str) -> dict[str, Any]:
    """The body of ``type_.name``, which must be the module's only ``type_``."""
    found = m.resources(type_)
    p.expect(list(found) == [name], f"want exactly one {type_} named {name!r}, got {list(found)}")
    return found.get(name, {})


@check("driver_permissions", "aws")
def _aws_driver_permissions(tree: Tree) -> list[str]:
    m, p = tree.module("aws"), Problems()
    statements = blocks(m.data("aws_iam_policy_document", "driver"), "statement")
    _exactly([a for s in statements for a in s.get("actions", [])], AWS_DRIVER_ACTIONS, p, "driver policy actions")
    for s in statements:
        p.expect(s.get("effect", "Allow") == "Allow" and "not_actions" not in s, f"statement {s.get('sid')}: Allow with actions only")
        scoped = set(s.get("actions", [])) & AWS_GROUP_SCOPED_ACTIONS
        queue = set(s.get("actions", [])) & AWS_QUEUE_SCOPED_ACTIONS
        if scoped:
            p.expect(s.get("resources") == ["${aws_autoscaling_group.workers.arn}"],
                     f"{sorted(scoped)} must be scoped to this group's ARN, got {s.get('resources')}")
        elif queue:
            p.expect(s.get("resources") == ["${aws_sqs_queue.notices.arn}"],
                     f"{sorted(queue)} must be scoped to the notice queue's ARN, got {s.get('resources')}")
        elif s.get("resources") == ["*"]:
            p.expect(all(":Describe" in a for a in s.get("actions", [])), f"statement {s.get('sid')}: only Describe calls may use Resource *")
    policies = m.resources("aws_iam_role_policy")
    p.expect(set(policies) == {"driver", *AWS_CHECKPOINT_POLICIES}, f"unexpected inline policies {sorted(policies)}")
    policy = policies.get("driver", {})
    p.expect(policy.get("policy") == "${data.aws_iam_policy_document.driver.json}", "the driver's inline policy must be that document")
    for kind in ("aws_iam_role_policy_attachment", "aws_iam_policy", "aws_iam_policy_attachment", "aws_iam_user"):
        p.expect(not m.resources(kind), f"no {kind} may widen the driver's permissions")
    role = m.resource("aws_iam_role", "driver")
    p.expect("managed_policy_arns" not in role and "inline_policy" not in role, "the driver role must not attach other policies")
    return p


@check("driver_permissions", "gcp")
def _gcp_driver_permissions(tree: Tree) -> list[str]:
    m, p = tree.module("gcp"), Problems()
    role = _only(m, p, "google_project_iam_custom_role", "discovery")
    _exactly(role.get("permissions", []), GCP_DRIVER_PERMISSIONS, p, "custom role permissions")
    grant = _only(m, p, "google_project_iam_member", "driver_discovery")
    p.expect(mentions(grant.get("role"), "google_project_iam_custom_role.discovery"), "the grant must be the custom role, not a predefined one")
    p.expect(mentions(grant.get("member"), "google_service_account.driver.email"), "the grant must go to the driver's account")
    for type_, name, _ in m.all_resources():
        if "iam" in type_ and type_ not in ("google_project_iam_custom_role", "google_project_iam_member") \
                and (type_, name) != ("google_storage_bucket_iam_member", "checkpoints"):
            p.append(f"{type_}.{name} grants more than the discovery role and the checkpoint bucket")
    return p


@check("driver_permissions", "azure")
def _azure_driver_permissions(tree: Tree) -> list[str]:
    m, p = tree.module("azure"), Problems()
    definition = _only(m, p, "azurerm_role_definition", "discovery")
    perms = block(definition, "permissions") or {}
    _exactly(perms.get("actions", []), AZURE_DRIVER_ACTIONS, p, "role definition actions")
    p.expect(not perms.get("not_actions") and not perms.get("data_actions"), "the role must list plain actions only")
    scope = "${azurerm_resource_group.this.id}"
    p.expect(definition.get("assignable_scopes") == [scope], "the role must be assignable in the cluster's resource group only")
    grants = m.resources("azurerm_role_assignment")
    p.expect(set(grants) == {"driver_discovery", *AZURE_CHECKPOINT_GRANTS}, f"unexpected role assignments {sorted(grants)}")
    grant = grants.get("driver_discovery", {})
    p.expect(mentions(grant.get("role_definition_id"), "azurerm_role_definition.discovery.role_definition_resource_id")
             and "role_definition_name" not in grant, "the assignment must be the custom role, not a built-in one")
    p.expect(grant.get("scope") == scope, f"the assignment must be scoped to the cluster's resource group, got {grant.get('scope')!r}")
    p.expect(mentions(grant.get("principal_id"), "azurerm_linux_virtual_machine.driver.identity"), "the assignment must go to the driver's identity")
    return p


@check("driver_permissions", "ibm")
def _ibm_driver_permissions(tree: Tree) -> list[str]:
    m, p = tree.module("ibm"), Problems()
    policy = _only(m, p, "ibm_iam_trusted_profile_policy", "driver_discovery")
    _exactly(policy.get("roles", []), IBM_DRIVER_ROLES, p, "trusted profile roles")
    scope = block(policy, "resources") or {}
    p.expect(scope.get("service") == "is", "the policy must cover VPC infrastructure (service \"is\") only")
    p.expect(scope.get("resource_group_id") == "${var.resource_group_id}", "the policy must be scoped to the cluster's resource group")
    for type_, name, _ in m.all_resources():
        if type_.startswith("ibm_iam_") and type_.endswith("policy") and (type_, name) != ("ibm_iam_trusted_profile_policy", "driver_discovery"):
            p.append(f"{type_}.{name} grants more than the discovery policy")
    p.expect(mentions(m.resource("ibm_is_instance", "driver").get("default_trusted_profile_target"), "ibm_iam_trusted_profile.driver"),
             "the driver must run as the trusted profile")
    p.expect("default_trusted_profile_target" not in m.resource("ibm_is_instance_template", "workers"), "workers must get no trusted profile")
    return p


# ----------------------------------------------------------- metadata_hardening


@check("metadata_hardening", "aws")
def _aws_imdsv2(tree: Tree) -> list[str]:
    m, p = tree.module("aws"), Problems()
    for label, body in (("launch template", m.resource("aws_launch_template", "workers")), ("driver", m.resource("aws_instance", "driver"))):
        options = block(body, "metadata_options") or {}
        p.expect(options.get("http_tokens") == "required", f"{label}: IMDSv2 must be required (http_tokens)")
        p.expect(options.get("http_endpoint", "enabled") == "enabled", f"{label}: the metadata endpoint carries the Spot notices")
        p.expect(options.get("http_put_response_hop_limit", 1) == 1, f"{label}: metadata hop limit must be 1")
    return p


@check("metadata_hardening", "ibm")
def _ibm_metadata(tree: Tree) -> list[str]:
    m, p = tree.module("ibm"), Problems()
    driver = block(m.resource("ibm_is_instance", "driver"), "metadata_service") or {}
    p.expect(driver.get("enabled") is True and driver.get("protocol") == "https", "the driver's metadata service must use https")
    p.expect(driver.get("response_hop_limit", 1) == 1, "the driver's metadata hop limit must be 1")
    workers = block(m.resource("ibm_is_instance_template", "workers"), "metadata_service") or {}
    p.expect(workers.get("enabled") is False, "workers need no metadata service")
    return p


# ---------------------------------------------------------------- discovery_tags


def _common_tags(tree: Tree, p: Problems) -> None:
    common = tree.module("common")
    expected = {
        "worker_tags": {ROLE_TAG: ROLE_WORKER, CLUSTER_TAG: "${var.cluster_name}"},
        "driver_tags": {ROLE_TAG: ROLE_DRIVER, CLUSTER_TAG: "${var.cluster_name}"},
    }
    for name, tags in expected.items():
        p.expect(common.locals.get(name) == tags, f"common local {name} is {common.locals.get(name)!r}, want {tags!r}")
        args = merge_args(common.outputs.get(name, {}).get("value")) or []
        p.expect(args and args[-1] == f"local.{name}", f"common output {name} must end with local.{name} so the discovery tags win")


def _applies(expr: Any, source: str) -> bool:
    """Whether ``expr`` is ``source`` or a merge in which nothing after ``source`` touches the discovery keys."""
    args = merge_args(expr) or []
    if source not in args:
        return False
    return not any(ROLE_TAG in a or CLUSTER_TAG in a for a in args[args.index(source) + 1:])


def _tags_check(cloud: str, worker: tuple[str, str, str], driver: tuple[str, str, str]) -> Check:
    def run(tree: Tree) -> list[str]:
        m, p = tree.module(cloud), Problems()
        _common_tags(tree, p)
        for role, (type_, name, attr) in (("worker", worker), ("driver", driver)):
            body = m.resource(type_, name)
            expr = body.get(attr) if attr != "dynamic tag" else (dynamic(body, "tag") or {}).get("for_each")
            p.expect(_applies(expr, f"module.common.{role}_tags"), f"{type_}.{name} must carry module.common.{role}_tags, got {expr!r}")
            if attr == "dynamic tag":
                content = block(dynamic(body, "tag") or {}, "content") or {}
                p.expect(content.get("propagate_at_launch") is True, "group tags must propagate to the instances")
        return p

    return run


CHECKS[("discovery_tags", "aws")] = _tags_check(
    "aws", ("aws_autoscaling_group", "workers", "dynamic tag"), ("aws_instance", "driver", "tags"))
CHECKS[("discovery_tags", "gcp")] = _tags_check(
    "gcp", ("google_compute_instance_template", "workers", "labels"), ("google_compute_instance", "driver", "labels"))
CHECKS[("discovery_tags", "azure")] = _tags_check(
    "azure", ("azurerm_linux_virtual_machine_scale_set", "workers", "tags"), ("azurerm_linux_virtual_machine", "driver", "tags"))


@check("discovery_tags", "ibm")
def _ibm_tags(tree: Tree) -> list[str]:
    m, p = tree.module("ibm"), Problems()
    _common_tags(tree, p)
    for role, type_, name in (("worker", "ibm_is_instance_group", "workers"), ("driver", "ibm_is_instance", "driver")):
        p.expect(m.resource(type_, name).get("tags") == f"${{local.{role}_tags}}", f"{type_}.{name} must carry local.{role}_tags")
        local = str(m.locals.get(f"{role}_tags"))
        p.expect(mentions(local, f"module.common.{role}_tags") and '"${k}:${v}"' in local,
                 f"local.{role}_tags must write module.common.{role}_tags as key:value user tags")
    return p


# ------------------------------------------------------------------ cli_outputs


def _expand_locals(module: Module, text: str) -> str:
    for _ in range(3):
        for name, value in module.locals.items():
            if isinstance(value, str):
                text = text.replace(f"${{local.{name}}}", value)
    return text


def _cli_check(cloud: str) -> Check:
    def run(tree: Tree) -> list[str]:
        m, p = tree.module(cloud), Problems()
        missing = REQUIRED_OUTPUTS[cloud] - set(m.outputs)
        p.expect(not missing, f"missing outputs: {sorted(missing)}")
        for name, output in m.outputs.items():
            p.expect(output.get("description"), f"output {name} needs a description")
        text = _expand_locals(m, str(m.outputs.get("cli_command", {}).get("value", "")))
        p.expect(text.startswith("cloud-elastic run "), f"cli_command must start with 'cloud-elastic run ': {text!r}")
        p.expect(text.endswith("${module.common.cli_args}"), "cli_command must end with the shared arguments")
        known = {f.flag for f in CLOUD_FLAGS}
        for flag, refs in CLI_FLAGS[cloud].items():
            p.expect(flag in known, f"{flag} is not a flag of the Python CLI")
            found = re.findall(rf"{re.escape(flag)} \$\{{([^}}]*)\}}", text)
            p.expect(found and all(any(r in f for f in found) for r in refs), f"cli_command: {flag} must interpolate {refs}, got {found}")
        shared = str(tree.module("common").outputs.get("cli_args", {}).get("value", ""))
        for flag in SHARED_CLI_FLAGS:
            p.expect(re.search(rf"(^| ){re.escape(flag)} \$\{{", shared), f"common cli_args lacks {flag}")
        # Groups recycle private IPs: the launcher's job-private known hosts forget an address that another
        # instance took. A run line choosing its own known-hosts file or strict checking would turn it off.
        for option in ("UserKnownHostsFile", "StrictHostKeyChecking"):
            p.expect(option.lower() not in (text + " " + shared).lower(),
                     f"the cli_command must leave {option} to the launcher (recycled private IPs)")
        return p

    return run


for _cloud in CLOUDS:
    CHECKS[("cli_outputs", _cloud)] = _cli_check(_cloud)


# ---------------------------------------------------------------- inbound_rules


def _role_of(expr: Any, kinds: tuple[str, ...]) -> str:
    for kind in kinds:
        for role in ("workers", "driver"):
            if mentions(expr, f"{kind}.{role}"):
                return role
    return f"unexpected({expr!r})"


def _ports(low: Any, high: Any = None) -> str:
    high = low if high is None else high
    if str(low) == str(high) == "22":
        return "ssh"
    if mentions(low, "module.common.training_ports.from") and mentions(high, "module.common.training_ports.to"):
        return "training"
    return f"unexpected({low!r}-{high!r})"


def _compare_inbound(found: set[tuple[str, str, str]], p: Problems) -> None:
    p.expect(found == EXPECTED_INBOUND, f"inbound rules {sorted(found)} != {sorted(EXPECTED_INBOUND)}")


def _admin_source(body: dict[str, Any], field: str) -> bool:
    return body.get(field) == "${each.value}" and mentions(body.get("for_each"), "module.common.admin_ssh_cidrs")


@check("inbound_rules", "aws")
def _aws_inbound(tree: Tree) -> list[str]:
    m, p, found = tree.module("aws"), Problems(), set()
    for name, sg in m.resources("aws_security_group").items():
        p.expect("ingress" not in sg, f"security group {name} must not have inline ingress rules")
    p.expect(not m.resources("aws_security_group_rule"), "use aws_vpc_security_group_ingress_rule only")
    for name, rule in m.resources("aws_vpc_security_group_ingress_rule").items():
        target = _role_of(rule.get("security_group_id"), ("aws_security_group",))
        if "referenced_security_group_id" in rule:
            source = _role_of(rule["referenced_security_group_id"], ("aws_security_group",))
        else:
            source = "admin" if _admin_source(rule, "cidr_ipv4") else f"unexpected({rule.get('cidr_ipv4')!r})"
        p.expect(rule.get("ip_protocol") == "tcp", f"rule {name} must be TCP")
        found.add((target, source, _ports(rule.get("from_port"), rule.get("to_port"))))
    _compare_inbound(found, p)
    return p


@check("inbound_rules", "gcp")
def _gcp_inbound(tree: Tree) -> list[str]:
    m, p, found = tree.module("gcp"), Problems(), set()
    allow_priorities, denies = [], []
    for name, rule in m.resources("google_compute_firewall").items():
        if rule.get("direction", "INGRESS") != "INGRESS":
            continue
        p.expect("source_tags" not in rule and "target_tags" not in rule, f"firewall {name}: match service accounts, not tags")
        targets = [_role_of(t, ("google_service_account",)) for t in rule.get("target_service_accounts", [])]
        p.expect(targets, f"firewall {name} must target the cluster's service accounts, not the whole network")
        if blocks(rule, "deny"):
            denies.append((rule.get("priority"), set(targets)))
            continue
        allow_priorities.append(rule.get("priority", 1000))
        if "source_service_accounts" in rule:
            sources = [_role_of(s, ("google_service_account",)) for s in rule["source_service_accounts"]]
        else:
            sources = ["admin" if rule.get("source_ranges") == "${module.common.admin_ssh_cidrs}" else f"unexpected({rule.get('source_ranges')!r})"]
        for allow in blocks(rule, "allow"):
            ports = allow.get("ports", [])
            kind = "ssh" if ports == ["22"] else (
                "training" if ports == ["${module.common.training_ports.from}-${module.common.training_ports.to}"] else f"unexpected({ports!r})")
            found |= {(t, s, kind) for t in targets for s in sources}
    _compare_inbound(found, p)
    p.expect(any(prio and prio > max(allow_priorities, default=0) and targets == {"workers", "driver"} for prio, targets in denies),
             "a lower-priority deny must keep the network's other allow rules off workers and driver")
    return p


@check("inbound_rules", "azure")
def _azure_inbound(tree: Tree) -> list[str]:
    m, p, found = tree.module("azure"), Problems(), set()
    for name, nsg in m.resources("azurerm_network_security_group").items():
        p.expect("security_rule" not in nsg, f"NSG {name} must not have inline rules")
    denies = []
    for name, rule in m.resources("azurerm_network_security_rule").items():
        if rule.get("direction") != "Inbound":
            continue
        if rule.get("access") == "Deny":
            denies.append(rule)
            continue
        target = _role_of(rule.get("network_security_group_name"), ("azurerm_network_security_group",))
        if "source_application_security_group_ids" in rule:
            sources = [_role_of(s, ("azurerm_application_security_group",)) for s in rule["source_application_security_group_ids"]]
        elif rule.get("source_address_prefixes") == "${module.common.admin_ssh_cidrs}":
            sources = ["admin"]
        else:
            sources = [f"unexpected({rule.get('source_address_prefix', rule.get('source_address_prefixes'))!r})"]
        port = rule.get("destination_port_range")
        kind = "ssh" if port == "22" else (
            "training" if port == "${module.common.training_ports.from}-${module.common.training_ports.to}" else f"unexpected({port!r})")
        found |= {(target, s, kind) for s in sources}
    _compare_inbound(found, p)
    p.expect(any(d.get("source_address_prefix") == "*" and d.get("destination_port_range") == "*" and d.get("protocol") == "*"
                 and {"workers", "driver"} <= {_role_of(v, ("azurerm_network_security_group",)) for v in (d.get("for_each") or {}).values()}
                 for d in denies if isinstance(d.get("for_each"), dict)),
             "both NSGs must end with a deny-all inbound rule (Azure's defaults allow the whole VNet)")
    return p


@check("inbound_rules", "ibm")
def _ibm_inbound(tree: Tree) -> list[str]:
    m, p, found = tree.module("ibm"), Problems(), set()
    for name, rule in m.resources("ibm_is_security_group_rule").items():
        if rule.get("direction") != "inbound":
            continue
        target = _role_of(rule.get("group"), ("ibm_is_security_group",))
        source = "admin" if _admin_source(rule, "remote") else _role_of(rule.get("remote"), ("ibm_is_security_group",))
        tcp = block(rule, "tcp")
        p.expect(tcp is not None, f"rule {name} must be TCP with a port range")
        tcp = tcp or {}
        found.add((target, source, _ports(tcp.get("port_min"), tcp.get("port_max"))))
    _compare_inbound(found, p)
    return p


# ----------------------------------------------------------------- notice_queue


@check("notice_queue", "aws")
def _aws_notice_queue(tree: Tree) -> list[str]:
    """EventBridge → SQS for queue mode: the three event types, the group's lifecycle only, a private encrypted queue."""
    m, p = tree.module("aws"), Problems()
    queue = _only(m, p, "aws_sqs_queue", "notices")
    p.expect(queue.get("sqs_managed_sse_enabled") is True or "kms_master_key_id" in queue, "the notice queue must be encrypted")
    retention = queue.get("message_retention_seconds")
    local = reference(retention) or ""
    expr = str(m.locals.get(local[6:], "")) if local.startswith("local.") else ""
    bounded = re.fullmatch(r"\$\{max\((\d+), var\.lifecycle_heartbeat_timeout_s\)\}", expr)
    p.expect((isinstance(retention, int) and 60 <= retention <= 3600) or (bounded and int(bounded.group(1)) <= 3600),
             f"the notice queue's retention must be short (<= 1 h, or the bounded hook timeout), got {retention!r} {expr!r}")
    rules = m.resources("aws_cloudwatch_event_rule")
    for detail_type, source in AWS_NOTICE_EVENTS.items():
        matching = [name for name, rule in rules.items() if f'"{detail_type}"' in str(rule.get("event_pattern"))]
        if not p.expect(matching, f"no EventBridge rule matches {detail_type!r}"):
            continue
        pattern = str(rules[matching[0]].get("event_pattern"))
        p.expect(f'"{source}"' in pattern, f"the rule for {detail_type!r} must match source {source}")
        if source == "aws.autoscaling":
            p.expect(re.search(r"AutoScalingGroupName\s*=\s*\[\s*aws_autoscaling_group\.workers\.name\s*\]", pattern),
                     f"the rule for {detail_type!r} must be filtered to this group's name")
    targets = m.resources("aws_cloudwatch_event_target")
    for name in rules:
        p.expect(any(mentions(t.get("rule"), f"aws_cloudwatch_event_rule.{name}") and t.get("arn") == "${aws_sqs_queue.notices.arn}"
                     for t in targets.values()), f"rule {name} must send to the notice queue")
    policy = _only(m, p, "aws_sqs_queue_policy", "notices")
    p.expect(policy.get("queue_url") == "${aws_sqs_queue.notices.id}", "the queue policy must be on the notice queue")
    p.expect(policy.get("policy") == "${data.aws_iam_policy_document.notice_queue.json}", "the queue policy must be that document")
    statements = blocks(m.data("aws_iam_policy_document", "notice_queue"), "statement")
    p.expect(len(statements) == 1, f"the queue policy must have one statement, got {len(statements)}")
    for s in statements:
        p.expect(s.get("actions") == ["sqs:SendMessage"] and s.get("resources") == ["${aws_sqs_queue.notices.arn}"],
                 "the queue policy may allow sqs:SendMessage on the queue only")
        principals = blocks(s, "principals")
        p.expect([(x.get("type"), x.get("identifiers")) for x in principals] == [("Service", ["events.amazonaws.com"])],
                 f"only EventBridge may send, got {principals}")
        conditions = {(c.get("test"), c.get("variable")): c.get("values") for c in blocks(s, "condition")}
        arns = conditions.get(("ArnEquals", "aws:SourceArn")) or []
        p.expect(sorted(arns) == sorted(f"${{aws_cloudwatch_event_rule.{n}.arn}}" for n in rules),
                 f"the queue must accept messages from this module's rules only (aws:SourceArn), got {arns}")
    output = m.outputs.get("notice_queue_url", {})
    p.expect(output.get("value") == "${aws_sqs_queue.notices.url}", "output notice_queue_url must be the queue's URL")
    return p


# ------------------------------------------------------------ checkpoint_access


def _checkpoint_common(tree: Tree, cloud: str, root: str, p: Problems) -> Module:
    """The run line carries --checkpoint-dir when the location is set; no module creates (or can destroy) the bucket."""
    m = tree.module(cloud)
    call = m.module_calls.get("common", {})
    p.expect(call.get("checkpoint_root") == root, f"module common's checkpoint_root must be {root!r}, got {call.get('checkpoint_root')!r}")
    p.expect(call.get("checkpoint_prefix") == "${var.checkpoint_prefix}", "module common must get checkpoint_prefix")
    cli = str(tree.module("common").outputs.get("cli_args", {}).get("value", ""))
    p.expect("--checkpoint-dir ${local.checkpoint_dir}" in cli, "common cli_args must carry --checkpoint-dir when it is set")
    for type_, name, _ in m.all_resources():
        p.expect(not re.search(r"(s3_bucket|storage_bucket|storage_account|storage_container)$", type_),
                 f"{type_}.{name}: the module must not own the checkpoint storage")
    return m


def _conditional(body: dict[str, Any], on: str, p: Problems, what: str) -> None:
    p.expect(on in str(body.get("count", "")) + str(body.get("for_each", "")), f"{what} must exist only when {on} is set")


@check("checkpoint_access", "aws")
def _aws_checkpoint_access(tree: Tree) -> list[str]:
    p = Problems()
    m = _checkpoint_common(tree, "aws", '${var.checkpoint_bucket == null ? null : "s3://${var.checkpoint_bucket}"}', p)
    doc = m.data("aws_iam_policy_document", "checkpoints")
    _conditional(doc, "local.checkpoints", p, "the checkpoint policy")
    statements = blocks(doc, "statement")
    _exactly([a for s in statements for a in s.get("actions", [])], {"s3:ListBucket", *AWS_CHECKPOINT_OBJECT_ACTIONS}, p,
             "checkpoint policy actions")
    for s in statements:
        if s.get("actions") == ["s3:ListBucket"]:
            p.expect(s.get("resources") == ["arn:aws:s3:::${var.checkpoint_bucket}"], "ListBucket must be on the checkpoint bucket")
        else:
            p.expect(s.get("resources") == ["${local.checkpoint_objects}/*"], f"object actions must be on the prefix, got {s.get('resources')}")
    p.expect("module.common.checkpoint_prefix" in str(m.locals.get("checkpoint_objects")), "local.checkpoint_objects must end in the prefix")
    for name, role in AWS_CHECKPOINT_POLICIES.items():
        policy = m.resource("aws_iam_role_policy", name)
        _conditional(policy, "local.checkpoints", p, f"aws_iam_role_policy.{name}")
        p.expect(policy.get("policy") == "${data.aws_iam_policy_document.checkpoints[0].json}", f"{name} must be the checkpoint policy")
        p.expect(mentions(policy.get("role"), role), f"{name} must be on {role}")
    profile = m.resource("aws_iam_instance_profile", "workers")
    _conditional(profile, "local.checkpoints", p, "the workers' instance profile")
    p.expect(mentions(profile.get("role"), "aws_iam_role.workers"), "the workers' instance profile must hold the workers' role")
    template = m.resource("aws_launch_template", "workers")
    profile_block = dynamic(template, "iam_instance_profile") or {}
    p.expect("iam_instance_profile" not in template and mentions(profile_block.get("for_each"), "aws_iam_instance_profile.workers"),
             "the workers' only instance profile must be the checkpoint one")
    return p


@check("checkpoint_access", "gcp")
def _gcp_checkpoint_access(tree: Tree) -> list[str]:
    p = Problems()
    m = _checkpoint_common(tree, "gcp", '${var.checkpoint_bucket == null ? null : "gs://${var.checkpoint_bucket}"}', p)
    grant = _only(m, p, "google_storage_bucket_iam_member", "checkpoints")
    _conditional(grant, "var.checkpoint_bucket", p, "the bucket grant")
    p.expect(grant.get("bucket") == "${var.checkpoint_bucket}", "the grant must be on the checkpoint bucket")
    p.expect(grant.get("role") == "roles/storage.objectUser", f"the grant must be roles/storage.objectUser, got {grant.get('role')!r}")
    for account in ("google_service_account.driver.email", "google_service_account.workers.email"):
        p.expect(mentions(grant.get("for_each"), account), f"the grant must cover {account}")
    return p


@check("checkpoint_access", "azure")
def _azure_checkpoint_access(tree: Tree) -> list[str]:
    p = Problems()
    m = _checkpoint_common(tree, "azure", '${var.checkpoint_container == null ? null : "az://${var.checkpoint_container.name}"}', p)
    scope = str(m.locals.get("checkpoint_scope"))
    p.expect("/blobServices/default/containers/${var.checkpoint_container.name}" in scope, "the grants must be scoped to the container")
    for name, principal in AZURE_CHECKPOINT_GRANTS.items():
        grant = m.resource("azurerm_role_assignment", name)
        _conditional(grant, "local.checkpoints", p, f"azurerm_role_assignment.{name}")
        p.expect(grant.get("scope") == "${local.checkpoint_scope}", f"{name} must be scoped to the container")
        p.expect(grant.get("role_definition_name") == "Storage Blob Data Contributor", f"{name} must be Storage Blob Data Contributor")
        p.expect(mentions(grant.get("principal_id"), principal), f"{name} must go to {principal}")
    identity = block(dynamic(m.resource("azurerm_linux_virtual_machine_scale_set", "workers"), "identity") or {}, "content") or {}
    p.expect("identity" not in m.resource("azurerm_linux_virtual_machine_scale_set", "workers")
             and identity.get("type") == "UserAssigned" and mentions(identity.get("identity_ids"), "azurerm_user_assigned_identity.workers"),
             "the workers' only identity must be the checkpoint one")
    env = str(m.module_calls.get("common", {}).get("worker_environment"))
    p.expect("AZURE_CLIENT_ID" in env and "AZURE_STORAGE_ACCOUNT_NAME" in env, "workers need the identity's client id and the account name")
    return p
