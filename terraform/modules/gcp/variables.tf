variable "cluster_name" {
  type        = string
  description = "Name of the deployment; prefixes every resource and is the value of the cloud-elastic-cluster label. The common module checks its form."

  validation {
    condition     = length(var.cluster_name) <= 22
    error_message = "cluster_name must be at most 22 characters on GCP: it prefixes service account ids, which are limited to 30."
  }
}

variable "project" {
  type        = string
  description = "Project that holds the cluster (--gcp-project)."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project id (6-30 lowercase letters, digits and '-')."
  }
}

variable "zones" {
  type        = list(string)
  description = "Zones with the chosen GPU. One zone gives a zonal MIG (--gcp-zone); several zones of one region give a regional MIG over them (--gcp-region)."

  validation {
    condition = (
      length(var.zones) >= 1 &&
      alltrue([for z in var.zones : can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", z))]) &&
      length(distinct([for z in var.zones : regex("^(.*)-[a-z]$", z)[0] if can(regex("^(.*)-[a-z]$", z))])) == 1
    )
    error_message = "zones must hold one or more zones (such as us-central1-a) of a single region."
  }
}

variable "network" {
  type        = string
  description = "Name or self link of the VPC network."

  validation {
    condition     = length(trimspace(var.network)) > 0
    error_message = "network must not be empty."
  }
}

variable "subnetwork" {
  type        = string
  description = "Name or self link of the subnetwork, in the zones' region. Workers need outbound internet (Cloud NAT or worker_public_ip) for the bootstrap's pip install."

  validation {
    condition     = length(trimspace(var.subnetwork)) > 0
    error_message = "subnetwork must not be empty."
  }
}

variable "gpu_machine_type" {
  type        = string
  description = "Machine type of the workers."
  default     = "g2-standard-8"

  validation {
    condition     = can(regex("^[a-z][a-z0-9]*-[a-z0-9-]+$", var.gpu_machine_type))
    error_message = "gpu_machine_type must be a machine type such as g2-standard-8 or n1-standard-8."
  }
}

variable "gpu_type" {
  type        = string
  description = "Accelerator type attached to each worker (for example nvidia-l4, nvidia-tesla-t4)."
  default     = "nvidia-l4"

  validation {
    condition     = can(regex("^nvidia-[a-z0-9-]+$", var.gpu_type))
    error_message = "gpu_type must be an NVIDIA accelerator type such as nvidia-l4."
  }
}

variable "gpus_per_instance" {
  type        = number
  description = "GPUs attached to each worker; also sets --slots-per-host, -np, --min-np and --max-np in the printed command line."
  default     = 1
}

variable "gpu_image" {
  type        = string
  description = "Boot image of the workers, with NVIDIA drivers (a Deep Learning VM image family). The bootstrap installs torch_spec into a venv of its own; the image's PyTorch is not used."
  default     = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-cu121"

  validation {
    condition     = length(trimspace(var.gpu_image)) > 0
    error_message = "gpu_image must not be empty."
  }
}

variable "worker_disk_gb" {
  type        = number
  description = "Boot disk size of each worker in GB."
  default     = 100

  validation {
    condition     = var.worker_disk_gb >= 50 && var.worker_disk_gb <= 65536
    error_message = "worker_disk_gb must be between 50 and 65536."
  }
}

variable "worker_public_ip" {
  type        = bool
  description = "Give workers ephemeral public IPs for outbound traffic when the subnetwork has no Cloud NAT. Inbound stays limited by the firewall."
  default     = false
}

variable "min_size" {
  type        = number
  description = "Fewest workers the job should run with; sets --min-np. (A MIG has no minimum of its own.)"
  default     = 0
}

variable "max_size" {
  type        = number
  description = "Most workers you intend to resize the MIG to; sets --max-np."
  default     = 4
}

variable "target_size" {
  type        = number
  description = "Workers to start with. Terraform ignores later resizes, so re-applying does not undo them."
  default     = 2
}

variable "driver_machine_type" {
  type        = string
  description = "Machine type of the on-demand CPU driver."
  default     = "e2-small"

  validation {
    condition     = can(regex("^[a-z][a-z0-9]*-[a-z0-9-]+$", var.driver_machine_type))
    error_message = "driver_machine_type must be a machine type such as e2-small."
  }
}

variable "driver_image" {
  type        = string
  description = "Boot image of the driver. Read when the driver is created: a later change (or a newer image in the family) leaves the running driver alone (apply -replace=...google_compute_instance.driver between jobs to move it; docs/terraform.md)."
  default     = "ubuntu-os-cloud/ubuntu-2204-lts"

  validation {
    condition     = length(trimspace(var.driver_image)) > 0
    error_message = "driver_image must not be empty."
  }
}

variable "driver_public_ip" {
  type        = bool
  description = "Give the driver an ephemeral public IP (inbound is still limited to admin_ssh_cidrs)."
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
  description = "User the ssh-keys metadata creates on the driver and the workers; the driver connects as this user."
  default     = "elastic"
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
  default     = "cloud-elastic[gcp]==0.1.0"
}

variable "torch_spec" {
  type        = string
  description = "Pinned torch the bootstrap installs first (workers: PyPI's CUDA build; driver: the CPU build), so that every VM, replacements included, runs the same torch and NCCL."
  default     = "torch==2.13.0"
}

variable "worker_torch_index" {
  type        = string
  description = "pip index the workers install torch_spec from. The default, PyTorch's CUDA 12.6 index, suits the default gpu_image (pytorch-latest-cu121), whose NVIDIA driver is a CUDA 12 one, older than the R580 that PyPI's torch 2.13 (a CUDA 13 build) needs. \"\" is PyPI: for an image with an R580 or newer driver on a Turing or newer GPU."
  default     = "https://download.pytorch.org/whl/cu126"
}

variable "checkpoint_bucket" {
  type        = string
  description = "Existing Cloud Storage bucket for checkpoints. When set, the driver's and the workers' service accounts get roles/storage.objectUser on it, and the printed run line carries --checkpoint-dir gs://<bucket>/<checkpoint_prefix>. The module never creates or deletes the bucket: checkpoints outlive the cluster."
  default     = null

  validation {
    condition     = var.checkpoint_bucket == null || can(regex("^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$", var.checkpoint_bucket))
    error_message = "checkpoint_bucket must be a Cloud Storage bucket name (lowercase letters, digits, '.', '_' and '-')."
  }
}

variable "checkpoint_prefix" {
  type        = string
  description = "Path of the checkpoint directory inside the bucket; null (the default) is cluster_name. The grant is bucket-wide (Cloud Storage grants roles per bucket), so give the cluster a bucket of its own."
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

variable "labels" {
  type        = map(string)
  description = "Extra labels for the instances. The discovery labels cannot be overridden (the common module checks that)."
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.labels : can(regex("^[a-z][a-z0-9_-]{0,62}$", k)) && can(regex("^[a-z0-9_-]{0,63}$", v))])
    error_message = "labels keys and values must be lowercase letters, digits, '_' and '-' (keys starting with a letter)."
  }
}
