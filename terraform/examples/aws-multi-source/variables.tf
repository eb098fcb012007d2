variable "region" {
  type        = string
  description = "AWS region to deploy into."
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must be an AWS region such as us-east-1."
  }
}

variable "cluster_name" {
  type        = string
  description = "Name of the deployment."
  default     = "multi"
}

variable "workers" {
  type        = number
  description = "GPU workers each Spot group starts with."
  default     = 2

  validation {
    condition     = var.workers >= 0 && floor(var.workers) == var.workers
    error_message = "workers must be a whole number >= 0."
  }
}

variable "max_workers" {
  type        = number
  description = "Most GPU workers each group may grow to."
  default     = 4

  validation {
    condition     = var.max_workers >= 1 && floor(var.max_workers) == var.max_workers
    error_message = "max_workers must be a whole number >= 1."
  }
}

variable "spot_a_instance_types" {
  type        = list(string)
  description = "Instance types of the first Spot group (one GPU each)."
  default     = ["g5.xlarge", "g6.xlarge"]

  validation {
    condition     = length(var.spot_a_instance_types) >= 1
    error_message = "spot_a_instance_types needs at least one type."
  }
}

variable "spot_b_instance_types" {
  type        = list(string)
  description = "Instance types of the second Spot group (one GPU each): other pools than the first's, with the same GPU memory and features as spot_a_instance_types and the fallback (a job sized for 24 GiB fails on a 16 GiB T4, which also lacks bf16). The default: larger sizes of the same A10G and L4 (24 GiB, bf16)."
  default     = ["g5.2xlarge", "g6.2xlarge"]

  validation {
    condition     = length(var.spot_b_instance_types) >= 1 && alltrue([for t in var.spot_b_instance_types : can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", t))])
    error_message = "spot_b_instance_types must hold instance types such as g6.2xlarge."
  }
}

variable "on_demand_instance_type" {
  type        = string
  description = "Instance type of the on-demand fallback group (one GPU)."
  default     = "g5.xlarge"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.on_demand_instance_type))
    error_message = "on_demand_instance_type must be an instance type such as g5.xlarge."
  }
}

variable "on_demand_price" {
  type        = number
  description = "Dollars per instance-hour of on_demand_instance_type (AWS's price list), for the job's cost."
  default     = 1.006

  validation {
    condition     = var.on_demand_price >= 0
    error_message = "on_demand_price must be >= 0."
  }
}

variable "lifecycle_heartbeat_timeout_s" {
  type        = number
  description = "Seconds a terminating worker of any of the three groups waits for the driver to drain it (the driver may extend it with heartbeats). A later change updates the groups' hooks in place."
  default     = 300

  validation {
    condition     = var.lifecycle_heartbeat_timeout_s >= 30 && var.lifecycle_heartbeat_timeout_s <= 1800 && floor(var.lifecycle_heartbeat_timeout_s) == var.lifecycle_heartbeat_timeout_s
    error_message = "lifecycle_heartbeat_timeout_s must be a whole number of seconds from 30 to 1800."
  }
}

variable "ssh_public_key" {
  type        = string
  description = "OpenSSH public key; keep the private key to copy to the driver."

  validation {
    condition     = can(regex("^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp[0-9]+) ", var.ssh_public_key))
    error_message = "ssh_public_key must be an OpenSSH public key."
  }
}

variable "admin_ssh_cidrs" {
  type        = list(string)
  description = "Your address ranges, allowed to SSH to the driver."

  validation {
    condition     = alltrue([for c in var.admin_ssh_cidrs : can(cidrhost(c, 0))])
    error_message = "admin_ssh_cidrs must hold CIDR ranges."
  }
}

variable "setup_commands" {
  type        = string
  description = "Shell commands every VM runs at first boot, in the SSH user's home directory, to fetch the training code, e.g. \"git clone https://github.com/you/train.git\"; \"\" (the default): the code is on the image."
  default     = ""
}
