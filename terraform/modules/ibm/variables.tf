variable "cluster_name" {
  type        = string
  description = "Name of the deployment; prefixes every resource and is the value of the cloud-elastic-cluster tag. Checked by the common module."
}

variable "resource_group_id" {
  type        = string
  description = "Resource group for the cluster. The driver's read access covers the VPC resources of this group, so give the cluster a group of its own."

  validation {
    condition     = can(regex("^[0-9a-f]{32}$", var.resource_group_id))
    error_message = "resource_group_id must be a resource group id (32 hexadecimal characters)."
  }
}

variable "vpc_id" {
  type        = string
  description = "VPC of the workers and the driver."

  validation {
    condition     = can(regex("^[a-z0-9]{4}-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$", var.vpc_id))
    error_message = "vpc_id must be a VPC id such as r006-12345678-1234-1234-1234-123456789abc."
  }
}

variable "zone" {
  type        = string
  description = "Zone of the workers and the driver, such as us-south-1; its region is --ibm-region."

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+-[0-9]$", var.zone))
    error_message = "zone must look like us-south-1."
  }
}

variable "subnet_id" {
  type        = string
  description = "Subnet in the zone. Workers need outbound internet (a public gateway) for the bootstrap's pip install."

  validation {
    condition     = can(regex("^[a-z0-9]{4}-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$", var.subnet_id))
    error_message = "subnet_id must be a subnet id such as 0717-12345678-1234-1234-1234-123456789abc."
  }
}

variable "gpu_profile" {
  type        = string
  description = "Instance profile of the GPU workers. The default, gx3-16x80x1l4, has one L4 (24 GiB): PyPI's torch (worker_torch_index \"\") is a CUDA 13 build that needs a Turing or newer GPU, so not the V100 of the gx2 profiles."
  default     = "gx3-16x80x1l4"

  validation {
    condition     = can(regex("^[a-z0-9]+-[0-9]+x[0-9]+(x[0-9a-z]+)?$", var.gpu_profile))
    error_message = "gpu_profile must be a profile name such as gx3-16x80x1l4."
  }
}

variable "gpus_per_instance" {
  type        = number
  description = "GPUs per worker instance; sets --slots-per-host, -np, --min-np and --max-np in the printed command line."
  default     = 1
}

variable "gpu_image_id" {
  type        = string
  description = "Image of the workers (an image with NVIDIA drivers, or a stock Ubuntu one that your bootstrap extends)."

  validation {
    condition     = can(regex("^[a-z0-9]{4}-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$", var.gpu_image_id))
    error_message = "gpu_image_id must be an image id."
  }
}

variable "min_size" {
  type        = number
  description = "Fewest workers; the instance group manager's minimum membership (at least 1)."
  default     = 0
}

variable "max_size" {
  type        = number
  description = "Most workers; the instance group manager's maximum membership."
  default     = 4
}

variable "instance_count" {
  type        = number
  description = "Workers to start with. Terraform ignores later changes, so re-applying does not undo scaling."
  default     = 2
}

variable "driver_profile" {
  type        = string
  description = "Instance profile of the on-demand CPU driver."
  default     = "bx2-2x8"

  validation {
    condition     = can(regex("^[a-z0-9]+-[0-9]+x[0-9]+$", var.driver_profile))
    error_message = "driver_profile must be a profile name such as bx2-2x8."
  }
}

variable "driver_image_id" {
  type        = string
  description = "Image of the driver (a stock Ubuntu image is enough). Read when the driver is created: a later change leaves the running driver alone (apply -replace=...ibm_is_instance.driver between jobs to move it; docs/terraform.md)."

  validation {
    condition     = can(regex("^[a-z0-9]{4}-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$", var.driver_image_id))
    error_message = "driver_image_id must be an image id."
  }
}

variable "driver_public_ip" {
  type        = bool
  description = "Give the driver a floating IP (inbound is still limited to admin_ssh_cidrs)."
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
  description = "Login user of the images (root on IBM's stock images); the driver connects to the workers as this user."
  default     = "root"
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
  description = "pip requirement the bootstrap installs on the driver and the workers. Keep it pinned: the driver refuses workers of another protocol version, and a worker replaced months later must get the driver's release. null (the default) is this release, cloud-elastic[ibm]==0.1.0, with the aws extra (s3fs, for the s3:// checkpoint directory) added when checkpoint_bucket is set."
  default     = null

  validation {
    # The common module checks the rest of a given spec.
    condition     = var.cloud_elastic_pip_spec == null ? true : trimspace(var.cloud_elastic_pip_spec) != ""
    error_message = "cloud_elastic_pip_spec must be null (this release) or a pip requirement."
  }
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
  description = "Existing Cloud Object Storage bucket for checkpoints: the printed run line carries --checkpoint-dir s3://<bucket>/<checkpoint_prefix>. The module grants no access to it (see docs/terraform.md): the hosts need HMAC keys and the COS endpoint, which you provide. It never creates or deletes the bucket."
  default     = null

  validation {
    condition     = var.checkpoint_bucket == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.checkpoint_bucket))
    error_message = "checkpoint_bucket must be a bucket name (3-63 lowercase letters, digits, '.' and '-')."
  }
}

variable "checkpoint_prefix" {
  type        = string
  description = "Path of the checkpoint directory inside the bucket; null (the default) is cluster_name."
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
  description = "Extra user tags, written key:value. The discovery tags cannot be overridden (the common module checks that)."
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.tags : can(regex("^[A-Za-z0-9 _.-]+$", k)) && can(regex("^[A-Za-z0-9 _.-]*$", v))])
    error_message = "tags keys and values may only hold letters, digits, spaces, '_', '.' and '-'."
  }
}
