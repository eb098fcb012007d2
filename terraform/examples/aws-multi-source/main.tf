# Example root: one job on three Auto Scaling groups (docs/multi-source.md).
#   spot-a: the module's Spot group (and the driver, the notice queue, the lifecycle hook);
#   spot-b: a second Spot group of other instance types, another pool when the first runs dry;
#   on-demand: the fallback, at desired capacity 0. The driver raises it (--manage-capacity) only while
#   the Spot groups give fewer than --min-np slots, and sets it back to 0 once Spot returns.
#   terraform init && terraform apply -var 'ssh_public_key=...' -var 'admin_ssh_cidrs=["203.0.113.7/32"]'

terraform {
  required_version = ">= 1.9, < 2.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40, < 6.0"
    }
  }
}

provider "aws" {
  region = var.region
}

data "aws_vpc" "default" {
  default = true
}

data "aws_subnets" "default" {
  filter {
    name   = "vpc-id"
    values = [data.aws_vpc.default.id]
  }
}

data "aws_ssm_parameter" "gpu_ami" {
  name = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
}

data "aws_ssm_parameter" "driver_ami" {
  name = "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id"
}

module "cloud_elastic" {
  source = "../../modules/aws"

  cluster_name       = var.cluster_name
  vpc_id             = data.aws_vpc.default.id
  worker_subnet_ids  = data.aws_subnets.default.ids
  driver_subnet_id   = data.aws_subnets.default.ids[0]
  gpu_ami_id         = nonsensitive(data.aws_ssm_parameter.gpu_ami.value)
  driver_ami_id      = nonsensitive(data.aws_ssm_parameter.driver_ami.value)
  gpu_instance_types = var.spot_a_instance_types
  max_size           = var.max_workers
  desired_capacity   = var.workers
  ssh_public_key     = var.ssh_public_key
  admin_ssh_cidrs    = var.admin_ssh_cidrs
  driver_public_ip   = true
  setup_commands     = var.setup_commands

  lifecycle_heartbeat_timeout_s = var.lifecycle_heartbeat_timeout_s
}

locals {
  spot_b_name   = "${var.cluster_name}-workers-b"
  fallback_name = "${var.cluster_name}-on-demand"
}

# A second Spot pool: the same workers (launch template), other instance types.
resource "aws_autoscaling_group" "spot_b" {
  name                      = local.spot_b_name
  vpc_zone_identifier       = data.aws_subnets.default.ids
  min_size                  = 0
  max_size                  = var.max_workers
  desired_capacity          = var.workers
  capacity_rebalance        = true
  health_check_type         = "EC2"
  health_check_grace_period = 300

  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = 0
      on_demand_percentage_above_base_capacity = 0
      spot_allocation_strategy                 = "capacity-optimized"
    }

    launch_template {
      launch_template_specification {
        launch_template_id = module.cloud_elastic.launch_template_id
        version            = "$Latest"
      }

      dynamic "override" {
        for_each = var.spot_b_instance_types
        content {
          instance_type = override.value
        }
      }
    }
  }

  # The hook from the group's first instance on; the aws_autoscaling_lifecycle_hook below owns it afterwards
  # (this block is ignored after creation), as in the module.
  initial_lifecycle_hook {
    name                 = module.cloud_elastic.lifecycle_hook_name
    lifecycle_transition = "autoscaling:EC2_INSTANCE_TERMINATING"
    heartbeat_timeout    = var.lifecycle_heartbeat_timeout_s
    default_result       = "CONTINUE"
  }

  tag {
    key                 = "Name"
    value               = "${var.cluster_name}-worker-b"
    propagate_at_launch = true
  }

  lifecycle {
    # The provider replaces the whole group, every worker with it, when initial_lifecycle_hook changes: the hook
    # resource below applies a new timeout instead.
    ignore_changes = [desired_capacity, initial_lifecycle_hook]
  }
}

# The fallback: on-demand, at desired capacity 0 until the driver needs it.
resource "aws_autoscaling_group" "fallback" {
  name                      = local.fallback_name
  vpc_zone_identifier       = data.aws_subnets.default.ids
  min_size                  = 0
  max_size                  = var.max_workers
  desired_capacity          = 0
  health_check_type         = "EC2"
  health_check_grace_period = 300

  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = var.max_workers
      on_demand_percentage_above_base_capacity = 100
    }

    launch_template {
      launch_template_specification {
        launch_template_id = module.cloud_elastic.launch_template_id
        version            = "$Latest"
      }

      override {
        instance_type = var.on_demand_instance_type
      }
    }
  }

  # The hook from the group's first instance on; the aws_autoscaling_lifecycle_hook below owns it afterwards
  # (this block is ignored after creation), as in the module.
  initial_lifecycle_hook {
    name                 = module.cloud_elastic.lifecycle_hook_name
    lifecycle_transition = "autoscaling:EC2_INSTANCE_TERMINATING"
    heartbeat_timeout    = var.lifecycle_heartbeat_timeout_s
    default_result       = "CONTINUE"
  }

  tag {
    key                 = "Name"
    value               = "${var.cluster_name}-worker-on-demand"
    propagate_at_launch = true
  }

  lifecycle {
    # The driver owns the size (--manage-capacity); re-applying must not undo it. initial_lifecycle_hook: as spot_b.
    ignore_changes = [desired_capacity, initial_lifecycle_hook]
  }
}

# Each group's drain hook, as the module's (aws_autoscaling_lifecycle_hook.drain): the same hook as the group's
# initial one (PutLifecycleHook creates or updates by name), so a changed lifecycle_heartbeat_timeout_s reaches
# AWS without replacing a group.
resource "aws_autoscaling_lifecycle_hook" "drain" {
  for_each = {
    spot_b   = aws_autoscaling_group.spot_b.name
    fallback = aws_autoscaling_group.fallback.name
  }

  name                   = module.cloud_elastic.lifecycle_hook_name
  autoscaling_group_name = each.value
  lifecycle_transition   = "autoscaling:EC2_INSTANCE_TERMINATING"
  heartbeat_timeout      = var.lifecycle_heartbeat_timeout_s
  default_result         = "CONTINUE"
}

# What the driver needs beyond the module's grant: drain the two new groups, set the fallback's size
# (that group only) and read Spot prices for the job's cost.
data "aws_iam_policy_document" "multi_source" {
  statement {
    sid    = "DrainTheOtherGroups"
    effect = "Allow"
    actions = [
      "autoscaling:CompleteLifecycleAction",
      "autoscaling:RecordLifecycleActionHeartbeat",
    ]
    resources = [aws_autoscaling_group.spot_b.arn, aws_autoscaling_group.fallback.arn]
  }

  statement {
    sid       = "SizeTheFallbackOnly"
    effect    = "Allow"
    actions   = ["autoscaling:SetDesiredCapacity"]
    resources = [aws_autoscaling_group.fallback.arn]
  }

  statement {
    sid       = "ReadSpotPrices"
    effect    = "Allow"
    actions   = ["ec2:DescribeSpotPriceHistory"]
    resources = ["*"]
  }
}

resource "aws_iam_role_policy" "multi_source" {
  name   = "${var.cluster_name}-multi-source"
  role   = module.cloud_elastic.driver_role_name
  policy = data.aws_iam_policy_document.multi_source.json
}

locals {
  # The module's line reads its one group's notice queue; here the queue stays with spot-a (one queue serves
  # one source), the other groups are watched through their states and the workers' metadata watchers.
  shared_flags = "--aws-notice-queue ${module.cloud_elastic.notice_queue_url}"
  multi_flags = join(" ", [
    "--aws-asg ${aws_autoscaling_group.spot_b.name}",
    "--aws-asg ${aws_autoscaling_group.fallback.name}",
    "--source ${module.cloud_elastic.asg_name}:notice_queue=${module.cloud_elastic.notice_queue_url}",
    "--source ${aws_autoscaling_group.fallback.name}:fallback,on_demand_price=${var.on_demand_price}",
    "--manage-capacity",
  ])
}
