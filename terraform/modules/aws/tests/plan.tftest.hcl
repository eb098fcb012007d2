# Offline checks of the AWS module against a mocked provider: run by
# tests/terraform/test_terraform_cli.py (terraform test), never against AWS.
#
# The discovery tag names are passed in by that pytest file as -var
# expected_*, taken from cloud_elastic.providers.tags, so they are not
# repeated here.

# The real provider, for the run that needs its own plan (later_apply). It
# never reaches AWS: no credentials checked, no refresh.
provider "aws" {
  alias                       = "real"
  region                      = "eu-west-1"
  access_key                  = "mock_access_key"
  secret_key                  = "mock_secret_key"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
}

mock_provider "aws" {
  mock_data "aws_region" {
    defaults = {
      name = "eu-west-1"
    }
  }

  mock_data "aws_ami" {
    defaults = {
      root_device_name = "/dev/sda1"
    }
  }

  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }

  mock_resource "aws_autoscaling_group" {
    defaults = {
      id  = "demo-workers"
      arn = "arn:aws:autoscaling:eu-west-1:123456789012:autoScalingGroup:0d6f8c3e-1111-2222-3333-444455556666:autoScalingGroupName/demo-workers"
    }
  }

  mock_resource "aws_instance" {
    defaults = {
      id         = "i-0123456789abcdef0"
      private_ip = "10.0.1.10"
      public_ip  = ""
    }
  }

  mock_resource "aws_sqs_queue" {
    defaults = {
      arn = "arn:aws:sqs:eu-west-1:123456789012:demo-notices"
      id  = "https://sqs.eu-west-1.amazonaws.com/123456789012/demo-notices"
      url = "https://sqs.eu-west-1.amazonaws.com/123456789012/demo-notices"
    }
  }

  mock_resource "aws_cloudwatch_event_rule" {
    defaults = {
      arn = "arn:aws:events:eu-west-1:123456789012:rule/demo-mocked"
    }
  }

  mock_resource "aws_iam_role" {
    defaults = {
      arn = "arn:aws:iam::123456789012:role/demo-driver"
    }
  }
}

variables {
  cluster_name      = "demo"
  vpc_id            = "vpc-0123456789abcdef0"
  worker_subnet_ids = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
  driver_subnet_id  = "subnet-0123456789abcdef0"
  gpu_ami_id        = "ami-0123456789abcdef0"
  driver_ami_id     = "ami-0fedcba9876543210"
  ssh_public_key    = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKmockmockmockmockmockmockmockmockmockmockmo demo"
}

# One plan run holds most assertions: each run starts the provider plugin
# again, which is most of the time a run takes.
run "plan" {
  command = plan

  variables {
    admin_ssh_cidrs = ["203.0.113.0/24"]
    tags            = { team = "ml" }
  }

  assert {
    condition     = aws_autoscaling_group.workers.mixed_instances_policy[0].instances_distribution[0].on_demand_base_capacity == 0
    error_message = "the on-demand base must default to 0"
  }
  assert {
    condition     = aws_autoscaling_group.workers.mixed_instances_policy[0].instances_distribution[0].on_demand_percentage_above_base_capacity == 0
    error_message = "everything above the on-demand base must be Spot"
  }
  assert {
    condition     = aws_autoscaling_group.workers.mixed_instances_policy[0].instances_distribution[0].spot_allocation_strategy == "capacity-optimized"
    error_message = "Spot allocation must be capacity-optimized"
  }
  assert {
    condition     = length(aws_autoscaling_group.workers.mixed_instances_policy[0].launch_template[0].override) >= 2
    error_message = "the group must offer several GPU instance types"
  }
  assert {
    condition     = aws_autoscaling_group.workers.capacity_rebalance
    error_message = "capacity rebalance must be on"
  }
  assert {
    condition     = [aws_autoscaling_group.workers.min_size, aws_autoscaling_group.workers.max_size, aws_autoscaling_group.workers.desired_capacity] == [0, 4, 2]
    error_message = "min/max/desired sizes must follow the variables"
  }
  assert {
    condition = anytrue([
      for h in aws_autoscaling_group.workers.initial_lifecycle_hook :
      h.lifecycle_transition == "autoscaling:EC2_INSTANCE_TERMINATING" && h.heartbeat_timeout == 300 && h.default_result == "CONTINUE" && h.name == "demo-drain"
    ])
    error_message = "the group needs a terminating lifecycle hook with a 300 s heartbeat timeout"
  }
  assert {
    condition     = aws_launch_template.workers.metadata_options[0].http_tokens == "required"
    error_message = "workers must require IMDSv2"
  }
  assert {
    condition     = aws_instance.driver.metadata_options[0].http_tokens == "required"
    error_message = "the driver must require IMDSv2"
  }
  assert {
    condition     = length(aws_instance.driver.instance_market_options) == 0
    error_message = "the driver must be on-demand"
  }
  assert {
    condition     = length(aws_launch_template.workers.iam_instance_profile) == 0 && length(aws_iam_role.workers) == 0 && length(aws_iam_role_policy.driver_checkpoints) == 0
    error_message = "without checkpoint_bucket, workers get no instance profile and the driver no storage access"
  }
  assert {
    condition = toset(flatten([for s in data.aws_iam_policy_document.driver.statement : s.actions])) == toset([
      "autoscaling:DescribeAutoScalingGroups",
      "autoscaling:DescribeLifecycleHooks",
      "ec2:DescribeInstances",
      "ec2:DescribeInstanceTypes",
      "autoscaling:CompleteLifecycleAction",
      "autoscaling:RecordLifecycleActionHeartbeat",
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage",
    ])
    error_message = "the driver policy must allow exactly the discovery, lifecycle and notice-queue actions"
  }
  assert {
    condition     = aws_sqs_queue.notices.sqs_managed_sse_enabled && aws_sqs_queue.notices.message_retention_seconds == 300 && aws_sqs_queue.notices.name == "demo-notices"
    error_message = "the notice queue must be encrypted and keep messages as long as the hook's timeout (300 s)"
  }
  assert {
    condition = (
      jsondecode(aws_cloudwatch_event_rule.spot_notices.event_pattern).source == ["aws.ec2"] &&
      toset(jsondecode(aws_cloudwatch_event_rule.spot_notices.event_pattern)["detail-type"]) == toset(["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"])
    )
    error_message = "the spot rule must match interruption warnings and rebalance recommendations from aws.ec2"
  }
  assert {
    condition = jsondecode(aws_cloudwatch_event_rule.lifecycle_notices.event_pattern) == {
      source        = ["aws.autoscaling"]
      "detail-type" = ["EC2 Instance-terminate Lifecycle Action"]
      detail        = { AutoScalingGroupName = ["demo-workers"] }
    }
    error_message = "the lifecycle rule must match this group's terminate lifecycle actions only"
  }
  assert {
    condition = alltrue([
      contains([for t in aws_autoscaling_group.workers.tag : "${t.key}=${t.value}" if t.propagate_at_launch], "${var.expected_role_tag}=${var.expected_role_worker}"),
      contains([for t in aws_autoscaling_group.workers.tag : "${t.key}=${t.value}" if t.propagate_at_launch], "${var.expected_cluster_tag}=demo"),
      contains([for t in aws_autoscaling_group.workers.tag : "${t.key}=${t.value}" if t.propagate_at_launch], "team=ml"),
    ])
    error_message = "the group must carry (and propagate) the role and cluster tags"
  }
  assert {
    condition     = aws_instance.driver.tags[var.expected_role_tag] == var.expected_role_driver && aws_instance.driver.tags[var.expected_cluster_tag] == "demo"
    error_message = "the driver must carry the driver role tag and the cluster tag"
  }
  assert {
    condition     = aws_vpc_security_group_ingress_rule.workers_ssh_from_driver.from_port == 22 && aws_vpc_security_group_ingress_rule.workers_ssh_from_driver.to_port == 22
    error_message = "workers accept SSH on port 22 only"
  }
  assert {
    condition     = aws_vpc_security_group_ingress_rule.workers_training_from_workers.from_port == 29400 && aws_vpc_security_group_ingress_rule.workers_training_from_workers.to_port == 30399
    error_message = "training ports between workers follow training_ports"
  }
  assert {
    condition     = [for r in aws_vpc_security_group_ingress_rule.driver_ssh_from_admins : r.cidr_ipv4] == ["203.0.113.0/24"]
    error_message = "admins reach the driver only from admin_ssh_cidrs"
  }
}

run "heartbeat_timeout_must_be_bounded" {
  command = plan

  variables {
    lifecycle_heartbeat_timeout_s = 7200
  }

  expect_failures = [var.lifecycle_heartbeat_timeout_s]
}

run "outputs_give_the_cli_line" {
  command = apply

  # A longer hook timeout: the queue keeps notices for as long.
  variables {
    lifecycle_heartbeat_timeout_s = 900
  }

  # Both rules would get the same mocked ARN; tell them apart.
  override_resource {
    target = aws_cloudwatch_event_rule.lifecycle_notices
    values = {
      arn = "arn:aws:events:eu-west-1:123456789012:rule/demo-lifecycle-notices"
    }
  }

  assert {
    condition     = output.cli_command == "cloud-elastic run --aws-asg demo-workers --aws-region eu-west-1 --aws-notice-queue https://sqs.eu-west-1.amazonaws.com/123456789012/demo-notices -np 2 --min-np 1 --max-np 4 --slots-per-host 1 --ssh-user ubuntu --ssh-identity-file ~/.ssh/cloud-elastic python train.py"
    error_message = "unexpected cli_command: ${output.cli_command}"
  }
  assert {
    condition     = output.asg_name == "demo-workers" && output.region == "eu-west-1" && output.lifecycle_hook_name == "demo-drain"
    error_message = "group, region and hook outputs must match the resources"
  }
  assert {
    condition     = output.notice_queue_url == "https://sqs.eu-west-1.amazonaws.com/123456789012/demo-notices"
    error_message = "notice_queue_url must be the queue's URL"
  }
  assert {
    condition     = aws_sqs_queue.notices.message_retention_seconds == 900
    error_message = "the queue must keep notices as long as the hook may hold an instance"
  }
  assert {
    condition = alltrue([
      for t in [aws_cloudwatch_event_target.spot_notices, aws_cloudwatch_event_target.lifecycle_notices] :
      t.arn == aws_sqs_queue.notices.arn
    ]) && aws_cloudwatch_event_target.lifecycle_notices.rule == aws_cloudwatch_event_rule.lifecycle_notices.name
    error_message = "both rules must send to the notice queue"
  }
  assert {
    condition = anytrue([
      for s in data.aws_iam_policy_document.driver.statement :
      toset(s.resources) == toset([aws_sqs_queue.notices.arn]) && toset(s.actions) == toset(["sqs:ReceiveMessage", "sqs:DeleteMessage"])
    ])
    error_message = "the driver's queue permissions must be scoped to the notice queue"
  }
  assert {
    condition = (
      toset(data.aws_iam_policy_document.notice_queue.statement[0].actions) == toset(["sqs:SendMessage"]) &&
      toset(one(data.aws_iam_policy_document.notice_queue.statement[0].principals).identifiers) == toset(["events.amazonaws.com"]) &&
      toset(one(data.aws_iam_policy_document.notice_queue.statement[0].condition).values) == toset([
        "arn:aws:events:eu-west-1:123456789012:rule/demo-mocked",
        "arn:aws:events:eu-west-1:123456789012:rule/demo-lifecycle-notices",
      ]) &&
      aws_sqs_queue_policy.notices.queue_url == aws_sqs_queue.notices.id
    )
    error_message = "only this module's EventBridge rules may send to the notice queue"
  }
  assert {
    condition     = output.driver_address == "10.0.1.10"
    error_message = "without a public IP the driver address is its private IP"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.workers.user_data), "AllowUsers ubuntu@10.0.1.10")
    error_message = "worker user data must allow SSH from the driver only"
  }
}

run "checkpoint_bucket_reaches_the_driver_and_every_worker" {
  command = apply

  variables {
    checkpoint_bucket = "ckpt-bucket"
    checkpoint_prefix = "runs/resnet"
  }

  assert {
    condition     = endswith(output.cli_command, " --ssh-identity-file ~/.ssh/cloud-elastic --checkpoint-dir s3://ckpt-bucket/runs/resnet python train.py")
    error_message = "the run line must carry the checkpoint URL: ${output.cli_command}"
  }
  assert {
    condition     = aws_launch_template.workers.iam_instance_profile[0].name == "demo-workers" && aws_iam_instance_profile.workers[0].role == aws_iam_role.workers[0].name
    error_message = "workers must run with the checkpoint instance profile"
  }
  assert {
    condition     = aws_iam_role_policy.workers_checkpoints[0].role == aws_iam_role.workers[0].id && aws_iam_role_policy.driver_checkpoints[0].role == aws_iam_role.driver.id
    error_message = "the driver and the workers must both get the checkpoint policy"
  }
  assert {
    condition     = [for s in data.aws_iam_policy_document.checkpoints[0].statement : toset(s.resources)] == [toset(["arn:aws:s3:::ckpt-bucket"]), toset(["arn:aws:s3:::ckpt-bucket/runs/resnet/*"])]
    error_message = "the checkpoint policy may list the bucket and use the objects under the prefix only"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.workers.user_data), "pip install --quiet 'torch==2.13.0'") && strcontains(base64decode(aws_launch_template.workers.user_data), "pip install --quiet 'cloud-elastic[aws]==0.1.0'")
    error_message = "workers must install the pinned torch and cloud-elastic"
  }
}

# What a later `terraform apply` does to the running cluster the runs above
# applied (mocked), planned by the real provider: it, not Terraform, decides
# what forces a replacement (aws_instance ami, aws_autoscaling_group
# initial_lifecycle_hook). A replaced resource has an unknown id in the plan,
# which fails the assertions below.
#
# Ubuntu published a new image (the examples read it from SSM at every plan),
# the user changed what the bootstrap runs, and a longer drain timeout.
run "later_apply" {
  command   = plan
  providers = { aws = aws.real }

  plan_options {
    refresh = false
  }

  # The only data source that calls AWS during a plan.
  override_data {
    target = data.aws_ami.gpu
    values = {
      root_device_name = "/dev/sda1"
    }
  }

  variables {
    driver_ami_id                 = "ami-0aaaaaaaaaaaaaaaa"
    setup_commands                = "git clone https://github.com/you/train.git"
    lifecycle_heartbeat_timeout_s = 900
  }

  assert {
    condition     = aws_instance.driver.id == "i-0123456789abcdef0" && aws_instance.driver.ami == "ami-0fedcba9876543210"
    error_message = "a new driver image must not replace the running driver"
  }
  assert {
    condition     = !strcontains(base64decode(aws_instance.driver.user_data_base64), "git clone")
    error_message = "new bootstrap settings must not stop and start the running driver"
  }
  assert {
    condition     = aws_autoscaling_group.workers.id == "demo-workers"
    error_message = "a new heartbeat timeout must not replace the worker group"
  }
  assert {
    condition     = aws_autoscaling_lifecycle_hook.drain.heartbeat_timeout == 900
    error_message = "a new heartbeat timeout must reach the group's lifecycle hook"
  }
}
