variable "project" {
  type        = string
  description = "GCP project to deploy into."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a GCP project id."
  }
}

variable "zone" {
  type        = string
  description = "Zone of the first Spot MIG, the driver and the fallback."
  default     = "us-central1-a"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]-[a-z]$", var.zone))
    error_message = "zone must be a GCP zone such as us-central1-a."
  }
}

variable "spot_b_zone" {
  type        = string
  description = "Zone of the second Spot MIG: another pool than the first's, in the region of zone (the workers' templates use that region's subnetwork)."
  default     = "us-central1-b"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]-[a-z]$", var.spot_b_zone))
    error_message = "spot_b_zone must be a GCP zone such as us-central1-b."
  }

  validation {
    # A malformed zone fails the checks above; this one compares regions only.
    condition     = try(regex("^(.*)-[a-z]$", var.spot_b_zone)[0] == regex("^(.*)-[a-z]$", var.zone)[0], true)
    error_message = "spot_b_zone must be in the region of zone (the workers' templates use that region's subnetwork), such as us-central1-b for zone us-central1-a."
  }
}

variable "cluster_name" {
  type        = string
  description = "Name of the deployment."
  default     = "multi"
}

variable "gpu_machine_type" {
  type        = string
  description = "Machine type of every worker (one GPU each)."
  default     = "g2-standard-8"
}

variable "gpu_type" {
  type        = string
  description = "Accelerator type of every worker."
  default     = "nvidia-l4"
}

variable "gpu_image" {
  type        = string
  description = "Boot image of the on-demand workers (the module's default for the Spot ones)."
  default     = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-cu121"

  validation {
    condition     = length(var.gpu_image) > 0
    error_message = "gpu_image must name an image."
  }
}

variable "on_demand_price_per_gpu_hour" {
  type        = number
  description = "Dollars per hour of one on-demand worker (one GPU, one slot), for the job's cost."
  default     = 0.85

  validation {
    condition     = var.on_demand_price_per_gpu_hour >= 0
    error_message = "on_demand_price_per_gpu_hour must be >= 0."
  }
}

variable "workers" {
  type        = number
  description = "GPU workers each Spot MIG starts with."
  default     = 2
}

variable "max_workers" {
  type        = number
  description = "Most GPU workers the module's MIG may grow to."
  default     = 4
}

variable "ssh_public_key" {
  type        = string
  description = "OpenSSH public key; keep the private key to copy to the driver."
}

variable "admin_ssh_cidrs" {
  type        = list(string)
  description = "Your address ranges, allowed to SSH to the driver."
}

variable "setup_commands" {
  type        = string
  description = "Shell commands every VM runs at first boot, in the SSH user's home directory, to fetch the training code, e.g. \"git clone https://github.com/you/train.git\"; \"\" (the default): the code is on the image."
  default     = ""
}

variable "worker_torch_index" {
  type        = string
  description = "pip index the workers install torch from; the default, PyTorch's CUDA 12.6 index, suits the module's default worker image (a CUDA 12 driver). \"\" is PyPI's CUDA 13 build, for an image with an NVIDIA driver R580 or newer."
  default     = "https://download.pytorch.org/whl/cu126"
}
