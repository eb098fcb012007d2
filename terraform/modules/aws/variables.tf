variable "cluster_name" {
  type        = string
  description = "Name of the deployment; prefixes every resource and is the value of the cloud-elastic-cluster tag. Checked by the common module."
}

variable "vpc_id" {
  type        = string
  description = "VPC for the workers and the driver."

  validation {
    condition     = can(regex("^vpc-[0-9a-f]{8,17}$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "worker_subnet_ids" {
  type        = list(string)
  description = "Subnets the worker group may launch into; several Availability Zones widen the Spot pools. They need outbound internet (a NAT gateway or public IPs) for the bootstrap's pip install."

  validation {
    condition     = length(var.worker_subnet_ids) >= 1 && alltrue([for s in var.worker_subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "worker_subnet_ids must hold at least one subnet id (subnet-...)."
  }
}

variable "driver_subnet_id" {
  type        = string
  description = "Subnet of the driver instance."

  validation {
    condition     = can(regex("^subnet-[0-9a-f]{8,17}$", var.driver_subnet_id))
    error_message = "driver_subnet_id must look like subnet-0123456789abcdef0."
  }
}

variable "gpu_ami_id" {
  type        = string
  description = "AMI of the GPU workers: one with NVIDIA drivers (for example an AWS Deep Learning Base AMI). The bootstrap installs torch_spec itself."

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.gpu_ami_id))
    error_message = "gpu_ami_id must look like ami-0123456789abcdef0."
  }
}

variable "gpu_instance_types" {
  type        = list(string)
  description = "GPU instance types the group may use, all with gpus_per_instance GPUs of the same memory size (a job sized for 24 GiB fails on a 16 GiB GPU) and the same features (bf16: not on T4 or V100). Several types give the capacity-optimised Spot allocation more pools to choose from. The default pair has one 24 GiB GPU each (A10G, L4)."
  default     = ["g5.xlarge", "g6.xlarge"]

  validation {
    condition = (
      length(var.gpu_instance_types) >= 1 && length(var.gpu_instance_types) <= 20 &&
      length(distinct(var.gpu_instance_types)) == length(var.gpu_instance_types) &&
      alltrue([for t in var.gpu_instance_types : can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", t))])
    )
    error_message = "gpu_instance_types must hold 1-20 distinct instance types such as g5.xlarge."
  }
}

variable "gpus_per_instance" {
  type        = number
  description = "GPUs per worker instance; sets --slots-per-host, -np, --min-np and --max-np in the printed command line."
  default     = 1
}

variable "spot_allocation_strategy" {
  type        = string
  description = "How the group picks Spot pools. Only the capacity-aware strategies are allowed: they cut interruptions, which cost a training job more than a few cents an hour."
  default     = "capacity-optimized"

  validation {
    condition     = contains(["capacity-optimized", "capacity-optimized-prioritized", "price-capacity-optimized"], var.spot_allocation_strategy)
    error_message = "spot_allocation_strategy must be capacity-optimized, capacity-optimized-prioritized or price-capacity-optimized."
  }
}

variable "on_demand_base_capacity" {
  type        = number
  description = "On-demand instances the group keeps before it adds Spot ones. 0 (the default) means workers are all Spot."
  default     = 0

  validation {
    condition     = var.on_demand_base_capacity >= 0 && floor(var.on_demand_base_capacity) == var.on_demand_base_capacity && var.on_demand_base_capacity <= var.max_size
    error_message = "on_demand_base_capacity must be a whole number between 0 and max_size."
  }
}

variable "min_size" {
  type        = number
  description = "Fewest worker instances."
  default     = 0
}

variable "max_size" {
  type        = number
  description = "Most worker instances."
  default     = 4
}

variable "desired_capacity" {
  type        = number
  description = "Worker instances to start with. Terraform ignores later changes made by scaling, so re-applying does not undo them."
  default     = 2
}

variable "lifecycle_heartbeat_timeout_s" {
  type        = number
  description = "Seconds a terminating worker waits in Terminating:Wait for the driver to drain it (the driver may extend it with heartbeats). Bounded so that a dead driver cannot hold instances for long."
  default     = 300

  validation {
    condition     = var.lifecycle_heartbeat_timeout_s >= 30 && var.lifecycle_heartbeat_timeout_s <= 1800 && floor(var.lifecycle_heartbeat_timeout_s) == var.lifecycle_heartbeat_timeout_s
    error_message = "lifecycle_heartbeat_timeout_s must be a whole number of seconds from 30 to 1800."
  }
}

variable "worker_root_volume_gb" {
  type        = number
  description = "Size of each worker's encrypted root volume in GiB."
  default     = 100

  validation {
    condition     = var.worker_root_volume_gb >= 30 && var.worker_root_volume_gb <= 16384
    error_message = "worker_root_volume_gb must be between 30 and 16384."
  }
}

variable "driver_instance_type" {
  type        = string
  description = "Instance type of the on-demand CPU driver."
  default     = "t3.small"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.driver_instance_type))
    error_message = "driver_instance_type must be an instance type such as t3.small."
  }
}

variable "driver_ami_id" {
  type        = string
  description = "AMI of the driver (a plain Ubuntu image is enough). Read when the driver is created: a later change leaves the running driver alone (apply -replace=...aws_instance.driver between jobs to move it; docs/terraform.md)."

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.driver_ami_id))
    error_message = "driver_ami_id must look like ami-0123456789abcdef0."
  }
}

variable "driver_root_volume_gb" {
  type        = number
  description = "Size of the driver's encrypted root volume in GiB."
  default     = 20

  validation {
    condition     = var.driver_root_volume_gb >= 8 && var.driver_root_volume_gb <= 1024
    error_message = "driver_root_volume_gb must be between 8 and 1024."
  }
}

variable "driver_public_ip" {
  type        = bool
  description = "Give the driver a public IP address (inbound is still limited to admin_ssh_cidrs)."
  default     = false
}

variable "admin_ssh_cidrs" {
  type        = list(string)
  description = "CIDR blocks allowed to SSH to the driver; empty opens nothing."
  default     = []
}

variable "training_ports" {
  type = object({
    from = number
    to   = number
  })
  description = "TCP port range for worker-to-worker and worker-to-driver training traffic (see docs/terraform.md)."
  default = {
    from = 29400
    to   = 30399
  }
}

variable "ssh_user" {
  type        = string
  description = "Login user of the GPU AMI; the driver connects to the workers as this user."
  default     = "ubuntu"
}

variable "ssh_public_key" {
  type        = string
  description = "OpenSSH public key for driver-to-worker (and admin-to-driver) SSH."
}

variable "ssh_identity_file" {
  type        = string
  description = "Where the matching private key lives on the driver."
  default     = "~/.ssh/cloud-elastic"
}

variable "cloud_elastic_pip_spec" {
  type        = string
  description = "pip requirement the bootstrap installs on the driver and the workers. Keep it pinned: the driver refuses workers of another protocol version, and a worker replaced months later must get the driver's release."
  default     = "cloud-elastic[aws]==0.1.0"
}

variable "torch_spec" {
  type        = string
  description = "Pinned torch the bootstrap installs first (workers: PyPI's CUDA build; driver: the CPU build), so that every VM, replacements included, runs the same torch and NCCL."
  default     = "torch==2.13.0"
}

variable "worker_torch_index" {
  type        = string
  description = "pip index the workers install torch_spec from; \"\" (the default) is PyPI, whose torch 2.13 is a CUDA 13 build that needs an NVIDIA driver R580 or newer on a Turing or newer GPU. For an image with an older driver set a PyTorch index that holds torch_spec for an older CUDA, e.g. \"https://download.pytorch.org/whl/cu126\"."
  default     = ""
}

variable "checkpoint_bucket" {
  type        = string
  description = "Existing S3 bucket for checkpoints. When set, the driver and the workers (through an instance profile of their own) may list the bucket and read, write and delete the objects under s3://<bucket>/<checkpoint_prefix>/, and the printed run line carries that --checkpoint-dir. The module never creates or deletes the bucket: checkpoints outlive the cluster."
  default     = null

  validation {
    condition     = var.checkpoint_bucket == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.checkpoint_bucket))
    error_message = "checkpoint_bucket must be an S3 bucket name (3-63 lowercase letters, digits, '.' and '-')."
  }
}

variable "checkpoint_prefix" {
  type        = string
  description = "Path of the checkpoint directory inside the bucket; null (the default) is cluster_name. Reads, writes and deletes are limited to that prefix."
  default     = null
}

variable "training_command" {
  type        = string
  description = "Training command at the end of the printed cloud-elastic run line."
  default     = "python train.py"
}

variable "setup_commands" {
  type        = string
  description = "Shell commands the first-boot script runs last on the driver and on every worker, replacements included, as ssh_user in its home directory (where the run line is run, so where the workers start): how the training code gets onto the VMs unless the image has it, e.g. \"git clone https://github.com/you/train.git\". \"\" (the default) runs nothing."
  default     = ""
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource. The discovery tags cannot be overridden (the common module checks that)."
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.tags) : !startswith(lower(k), "aws:")])
    error_message = "tags must not use the reserved aws: prefix."
  }
}
