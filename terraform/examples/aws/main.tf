# Example root: GPU Spot workers and a CPU driver in the default VPC.
#   terraform init && terraform apply -var 'ssh_public_key=...' -var 'admin_ssh_cidrs=["203.0.113.7/32"]'
# Then follow ../../docs/terraform.md to copy the private key to the driver
# and run the printed cli_command there.

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

# AWS publishes the current AMI ids as public SSM parameters. A newer driver
# AMI read here later leaves the running driver alone (the module ignores it).
data "aws_ssm_parameter" "gpu_ami" {
  name = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
}

data "aws_ssm_parameter" "driver_ami" {
  name = "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id"
}

module "cloud_elastic" {
  source = "../../modules/aws"

  cluster_name      = var.cluster_name
  vpc_id            = data.aws_vpc.default.id
  worker_subnet_ids = data.aws_subnets.default.ids
  driver_subnet_id  = data.aws_subnets.default.ids[0]
  gpu_ami_id        = nonsensitive(data.aws_ssm_parameter.gpu_ami.value)
  driver_ami_id     = nonsensitive(data.aws_ssm_parameter.driver_ami.value)
  max_size          = var.max_workers
  desired_capacity  = var.workers
  ssh_public_key    = var.ssh_public_key
  admin_ssh_cidrs   = var.admin_ssh_cidrs
  driver_public_ip  = true
  setup_commands    = var.setup_commands
}
