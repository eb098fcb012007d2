# GPU Spot workers in an Auto Scaling group, and an on-demand CPU driver that
# reaches them over SSH. See README.md and docs/terraform.md.

module "common" {
  source = "../common"

  cluster_name       = var.cluster_name
  min_size           = var.min_size
  max_size           = var.max_size
  desired_size       = var.desired_capacity
  gpus_per_instance  = var.gpus_per_instance
  training_ports     = var.training_ports
  admin_ssh_cidrs    = var.admin_ssh_cidrs
  ssh_user           = var.ssh_user
  ssh_public_key     = var.ssh_public_key
  ssh_identity_file  = var.ssh_identity_file
  pip_spec           = var.cloud_elastic_pip_spec
  torch_spec         = var.torch_spec
  worker_torch_index = var.worker_torch_index
  checkpoint_root    = var.checkpoint_bucket == null ? null : "s3://${var.checkpoint_bucket}"
  checkpoint_prefix  = var.checkpoint_prefix
  training_command   = var.training_command
  setup_commands     = var.setup_commands
  driver_ip          = aws_instance.driver.private_ip
  tags               = var.tags
}

locals {
  lifecycle_hook_name = "${var.cluster_name}-drain"
}

data "aws_region" "current" {}

# The GPU AMI's root device name (/dev/sda1, /dev/xvda...) for the volume size.
data "aws_ami" "gpu" {
  filter {
    name   = "image-id"
    values = [var.gpu_ami_id]
  }
}

resource "aws_key_pair" "this" {
  key_name   = "${var.cluster_name}-cloud-elastic"
  public_key = module.common.ssh_public_key
  tags       = module.common.driver_tags
}

resource "aws_launch_template" "workers" {
  name_prefix            = "${var.cluster_name}-worker-"
  description            = "cloud-elastic GPU workers of ${var.cluster_name}"
  image_id               = var.gpu_ami_id
  key_name               = aws_key_pair.this.key_name
  vpc_security_group_ids = [aws_security_group.workers.id]
  ebs_optimized          = true
  update_default_version = true
  user_data              = base64encode(module.common.worker_user_data)

  # Only with checkpoint_bucket: the checkpoint prefix (checkpoints.tf).
  dynamic "iam_instance_profile" {
    for_each = aws_iam_instance_profile.workers[*].name
    content {
      name = iam_instance_profile.value
    }
  }

  # Spot is chosen by the group's mixed-instances policy; a launch template
  # used there must not set instance_market_options itself.

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  block_device_mappings {
    device_name = data.aws_ami.gpu.root_device_name

    ebs {
      volume_size           = var.worker_root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "volume"
    tags          = module.common.worker_tags
  }

  tags = module.common.worker_tags
}

resource "aws_autoscaling_group" "workers" {
  name                      = "${var.cluster_name}-workers"
  vpc_zone_identifier       = var.worker_subnet_ids
  min_size                  = var.min_size
  max_size                  = var.max_size
  desired_capacity          = var.desired_capacity
  capacity_rebalance        = true
  health_check_type         = "EC2"
  health_check_grace_period = 300

  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity = var.on_demand_base_capacity
      # Everything above the base is Spot.
      on_demand_percentage_above_base_capacity = 0
      spot_allocation_strategy                 = var.spot_allocation_strategy
    }

    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.workers.id
        version            = aws_launch_template.workers.latest_version
      }

      dynamic "override" {
        for_each = var.gpu_instance_types
        content {
          instance_type = override.value
        }
      }
    }
  }

  # The hook from the group's first instance on; aws_autoscaling_lifecycle_hook
  # .drain below owns it afterwards (this block is ignored after creation).
  initial_lifecycle_hook {
    name                 = local.lifecycle_hook_name
    lifecycle_transition = "autoscaling:EC2_INSTANCE_TERMINATING"
    heartbeat_timeout    = var.lifecycle_heartbeat_timeout_s
    default_result       = "CONTINUE"
  }

  dynamic "tag" {
    for_each = merge(module.common.worker_tags, { Name = "${var.cluster_name}-worker" })
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  lifecycle {
    # Scaling (by hand, a schedule or a policy) owns the size after creation.
    # The provider replaces the whole group, every worker with it, when
    # initial_lifecycle_hook changes: the hook resource below applies a new
    # timeout instead.
    ignore_changes = [desired_capacity, initial_lifecycle_hook]
  }
}

# A scale-in or rebalance victim waits here until the driver has drained it
# (complete_lifecycle_action) or the timeout passes; CONTINUE then lets it go.
# The same hook as the group's initial one (PutLifecycleHook creates or
# updates by name), so a changed lifecycle_heartbeat_timeout_s reaches AWS.
resource "aws_autoscaling_lifecycle_hook" "drain" {
  name                   = local.lifecycle_hook_name
  autoscaling_group_name = aws_autoscaling_group.workers.name
  lifecycle_transition   = "autoscaling:EC2_INSTANCE_TERMINATING"
  heartbeat_timeout      = var.lifecycle_heartbeat_timeout_s
  default_result         = "CONTINUE"
}

resource "aws_instance" "driver" {
  ami                         = var.driver_ami_id
  instance_type               = var.driver_instance_type
  subnet_id                   = var.driver_subnet_id
  vpc_security_group_ids      = [aws_security_group.driver.id]
  key_name                    = aws_key_pair.this.key_name
  iam_instance_profile        = aws_iam_instance_profile.driver.name
  associate_public_ip_address = var.driver_public_ip
  ebs_optimized               = true
  monitoring                  = true
  user_data_base64            = base64encode(module.common.driver_user_data)

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  root_block_device {
    volume_size           = var.driver_root_volume_gb
    volume_type           = "gp3"
    encrypted             = true
    delete_on_termination = true
  }

  tags = merge(module.common.driver_tags, { Name = "${var.cluster_name}-driver" })

  lifecycle {
    # The driver runs the job: a new driver_ami_id (the examples read
    # Ubuntu's current one at every plan) would replace it, and new user data
    # would stop and start it, both killing the job, while first-boot user
    # data would not even run again. Replace it on purpose between jobs:
    # terraform apply -replace=<module>.aws_instance.driver (docs/terraform.md).
    ignore_changes = [ami, user_data_base64]
  }
}
