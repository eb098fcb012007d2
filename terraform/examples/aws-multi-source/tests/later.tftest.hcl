# Offline checks of the multi-source example against a mocked provider: run by
# tests/terraform/test_terraform_cli.py (terraform test), never against AWS.
#
# What a later `terraform apply` with a longer drain timeout does to the three
# worker groups a first (mocked) apply created, planned by the real provider:
# it, not Terraform, decides that a changed initial_lifecycle_hook replaces a
# group (every worker on it). A replaced group has an unknown id in the plan,
# which fails the assertions below.

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
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }

  mock_resource "aws_autoscaling_group" {
    defaults = {
      id  = "multi-group"
      arn = "arn:aws:autoscaling:eu-west-1:123456789012:autoScalingGroup:0d6f8c3e-1111-2222-3333-444455556666:autoScalingGroupName/multi-group"
    }
  }

  mock_resource "aws_instance" {
    defaults = {
      id         = "i-0123456789abcdef0"
      private_ip = "10.0.1.10"
      public_ip  = "198.51.100.10"
    }
  }

  mock_resource "aws_sqs_queue" {
    defaults = {
      arn = "arn:aws:sqs:eu-west-1:123456789012:multi-notices"
      id  = "https://sqs.eu-west-1.amazonaws.com/123456789012/multi-notices"
      url = "https://sqs.eu-west-1.amazonaws.com/123456789012/multi-notices"
    }
  }

  mock_resource "aws_cloudwatch_event_rule" {
    defaults = {
      arn = "arn:aws:events:eu-west-1:123456789012:rule/multi-mocked"
    }
  }

  mock_resource "aws_iam_role" {
    defaults = {
      arn = "arn:aws:iam::123456789012:role/multi-driver"
    }
  }
}

# The data sources that call AWS during a plan, the same in every run.
override_data {
  target = data.aws_vpc.default
  values = {
    id = "vpc-0123456789abcdef0"
  }
}

override_data {
  target = data.aws_subnets.default
  values = {
    ids = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
  }
}

override_data {
  target = data.aws_ssm_parameter.gpu_ami
  values = {
    value = "ami-0123456789abcdef0"
  }
}

override_data {
  target = data.aws_ssm_parameter.driver_ami
  values = {
    value = "ami-0fedcba9876543210"
  }
}

override_data {
  target = module.cloud_elastic.data.aws_ami.gpu
  values = {
    root_device_name = "/dev/sda1"
  }
}

variables {
  ssh_public_key  = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKmockmockmockmockmockmockmockmockmockmockmo demo"
  admin_ssh_cidrs = ["203.0.113.0/24"]
}

run "first_apply" {
  command = apply

  assert {
    condition     = alltrue([for h in aws_autoscaling_lifecycle_hook.drain : h.heartbeat_timeout == 300 && h.name == "multi-drain"])
    error_message = "spot_b and the fallback need the module's drain hook, with the example's timeout"
  }
  assert {
    condition     = toset([for h in aws_autoscaling_lifecycle_hook.drain : h.autoscaling_group_name]) == toset([aws_autoscaling_group.spot_b.name, aws_autoscaling_group.fallback.name])
    error_message = "each of spot_b and the fallback needs its own drain hook"
  }
}

run "later_apply_longer_drain" {
  command   = plan
  providers = { aws = aws.real }

  plan_options {
    refresh = false
  }

  variables {
    lifecycle_heartbeat_timeout_s = 900
  }

  assert {
    condition     = aws_autoscaling_group.spot_b.id == "multi-group" && aws_autoscaling_group.fallback.id == "multi-group"
    error_message = "a new heartbeat timeout must not replace spot_b or the fallback (every worker on them)"
  }
  assert {
    condition     = alltrue([for h in aws_autoscaling_lifecycle_hook.drain : h.heartbeat_timeout == 900])
    error_message = "a new heartbeat timeout must reach the hooks of spot_b and the fallback"
  }
}
