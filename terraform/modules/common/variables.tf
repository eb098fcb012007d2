# Inputs every cloud module shares. The cloud modules pass their own
# variables straight through, so each check is written once, here.

variable "cluster_name" {
  type        = string
  description = "Name of the deployment; prefixes every resource and is the value of the cluster tag. Lowercase letters, digits and '-' (3-32 characters), a form every cloud accepts in names and labels."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}[a-z0-9]$", var.cluster_name))
    error_message = "cluster_name must be 3-32 characters of lowercase letters, digits and '-', starting with a letter and not ending with '-'."
  }
}

variable "min_size" {
  type        = number
  description = "Fewest worker instances the group may shrink to."
  default     = 0

  validation {
    condition     = var.min_size >= 0 && floor(var.min_size) == var.min_size
    error_message = "min_size must be a whole number >= 0."
  }
}

variable "max_size" {
  type        = number
  description = "Most worker instances the group may grow to."
  default     = 4

  validation {
    condition     = var.max_size >= 1 && floor(var.max_size) == var.max_size && var.max_size >= var.min_size
    error_message = "max_size must be a whole number >= 1 and >= min_size."
  }
}

variable "desired_size" {
  type        = number
  description = "Worker instances to start with."
  default     = 2

  validation {
    condition     = floor(var.desired_size) == var.desired_size && var.desired_size >= max(1, var.min_size) && var.desired_size <= var.max_size
    error_message = "desired_size must be a whole number between max(1, min_size) and max_size."
  }
}

variable "gpus_per_instance" {
  type        = number
  description = "GPUs on each worker instance; with the group sizes it sets --slots-per-host, -np, --min-np and --max-np in the printed command line."
  default     = 1

  validation {
    condition     = var.gpus_per_instance >= 1 && var.gpus_per_instance <= 16 && floor(var.gpus_per_instance) == var.gpus_per_instance
    error_message = "gpus_per_instance must be a whole number from 1 to 16."
  }
}

variable "training_ports" {
  type = object({
    from = number
    to   = number
  })
  description = "TCP port range for training traffic: workers to workers (Gloo/NCCL) and workers to the driver (TCPStore, control plane). The bootstrap sets the kernel's ephemeral port range to it so that those listeners land inside."
  default = {
    from = 29400
    to   = 30399
  }

  validation {
    condition     = var.training_ports.from >= 1024 && var.training_ports.to <= 65535 && var.training_ports.to - var.training_ports.from + 1 >= 256
    error_message = "training_ports must lie within 1024-65535 and hold at least 256 ports (it becomes the kernel's ephemeral port range)."
  }
}

variable "admin_ssh_cidrs" {
  type        = list(string)
  description = "CIDR blocks allowed to SSH to the driver. Empty (the default) opens nothing: reach the driver through your VPN, bastion or the cloud's console."
  default     = []

  validation {
    condition     = alltrue([for c in var.admin_ssh_cidrs : can(cidrhost(c, 0)) && !contains(["0.0.0.0/0", "::/0"], c)])
    error_message = "admin_ssh_cidrs must be valid CIDR blocks and must not be the whole internet (0.0.0.0/0 or ::/0)."
  }
}

variable "ssh_user" {
  type        = string
  description = "Login user on the workers; the driver connects as this user."

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user))
    error_message = "ssh_user must be a Linux user name (lowercase letters, digits, '_' and '-', at most 32 characters)."
  }
}

variable "ssh_public_key" {
  type        = string
  description = "OpenSSH public key the driver uses to reach the workers (and you the driver). Keep the private key out of Terraform: copy it to ssh_identity_file on the driver yourself."

  validation {
    condition     = can(regex("^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+={0,3}( [^\\n]*)?$", trimspace(var.ssh_public_key)))
    error_message = "ssh_public_key must be one OpenSSH public key line (ssh-ed25519, ssh-rsa or ecdsa-sha2-nistp*)."
  }
}

variable "ssh_identity_file" {
  type        = string
  description = "Path of the private key on the driver, as passed to --ssh-identity-file."
  default     = "~/.ssh/cloud-elastic"

  validation {
    condition     = can(regex("^[~A-Za-z0-9._/-]+$", var.ssh_identity_file))
    error_message = "ssh_identity_file must be a path without spaces or shell characters."
  }
}

variable "pip_spec" {
  type        = string
  description = "What the bootstrap passes to pip to install cloud-elastic, pinned like \"cloud-elastic[aws]==0.1.0\": the driver refuses workers of another protocol version, so every VM needs the same release."

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._\\-\\[\\],<>=!~:/@+#]*$", var.pip_spec))
    error_message = "pip_spec must be a single pip requirement or URL without spaces, quotes or shell characters."
  }
}

variable "torch_spec" {
  type        = string
  description = "The torch release every VM installs before cloud-elastic, pinned (torch==X.Y.Z): a replacement VM started weeks later gets the same torch and NCCL as its peers (NCCL refuses to mix versions). Workers take PyPI's default (CUDA) build, the driver the CPU build."
  default     = "torch==2.13.0"

  validation {
    condition     = can(regex("^torch==[0-9]+[.][0-9]+[.][0-9]+((a|b|rc|[.]post)[0-9]+)?$", var.torch_spec))
    error_message = "torch_spec must pin one torch release, e.g. \"torch==2.13.0\"."
  }
}

variable "worker_torch_index" {
  type        = string
  description = "pip index the workers install torch_spec from; \"\" (the default) is PyPI, whose torch 2.13 is built for CUDA 13 and needs an NVIDIA driver R580 or newer (and a Turing or newer GPU). For an image with an older driver name a PyTorch index such as \"https://download.pytorch.org/whl/cu126\" that holds torch_spec."
  default     = ""

  validation {
    condition     = var.worker_torch_index == "" || can(regex("^https://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~%+-]+)*/?$", var.worker_torch_index))
    error_message = "worker_torch_index must be \"\" (PyPI) or an https:// URL without spaces, quotes or shell characters."
  }
}

variable "checkpoint_root" {
  type        = string
  description = "Bucket (or container) URL of the checkpoint location without the prefix, e.g. \"s3://my-bucket\"; null (the default) adds no --checkpoint-dir to the run line."
  default     = null

  validation {
    condition     = var.checkpoint_root == null || can(regex("^[a-z][a-z0-9]*://[a-z0-9][a-z0-9._-]*$", var.checkpoint_root))
    error_message = "checkpoint_root must be <scheme>://<bucket> with no path, spaces or shell characters."
  }
}

variable "checkpoint_prefix" {
  type        = string
  description = "Path of the checkpoint directory inside the bucket; null (the default) is the cluster name. The driver and workers may read and write below it only (where the cloud scopes grants to a prefix)."
  default     = null

  validation {
    condition     = var.checkpoint_prefix == null || can(regex("^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", var.checkpoint_prefix))
    error_message = "checkpoint_prefix must be a relative path of letters, digits, '.', '_' and '-' parts joined by '/', without a leading or trailing '/'."
  }
}

variable "training_command" {
  type        = string
  description = "The training command at the end of the printed cloud-elastic run line."
  default     = "python train.py"

  validation {
    condition     = length(trimspace(var.training_command)) > 0 && !strcontains(var.training_command, "\n")
    error_message = "training_command must be one non-empty line."
  }
}

variable "driver_ip" {
  type        = string
  description = "Private IP address of the driver; the only address the workers accept SSH from."

  validation {
    condition     = can(regex("^[0-9]{1,3}(\\.[0-9]{1,3}){3}$", var.driver_ip))
    error_message = "driver_ip must be an IPv4 address."
  }
}

variable "tags" {
  type        = map(string)
  description = "Extra tags (labels on GCP) for every resource. They cannot override the discovery tags."
  default     = {}

  validation {
    condition     = length(setintersection(keys(var.tags), ["cloud-elastic-role", "cloud-elastic-cluster"])) == 0
    error_message = "tags must not set the discovery tags cloud-elastic-role or cloud-elastic-cluster; the module sets them."
  }
}

variable "worker_environment" {
  type        = map(string)
  description = "Environment variables the worker bootstrap writes to /etc/environment (SSH sessions read it), for example which identity the storage library uses."
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.worker_environment : can(regex("^[A-Z_][A-Z0-9_]*$", k)) && can(regex("^[A-Za-z0-9._:/@+=-]*$", v))])
    error_message = "worker_environment keys must be upper-case variable names and values may not hold spaces, quotes or shell characters."
  }
}

variable "driver_environment" {
  type        = map(string)
  description = "Environment variables the driver bootstrap writes to /etc/environment, for example how the discovery provider authenticates."
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.driver_environment : can(regex("^[A-Z_][A-Z0-9_]*$", k)) && can(regex("^[A-Za-z0-9._:/@+=-]*$", v))])
    error_message = "driver_environment keys must be upper-case variable names and values may not hold spaces, quotes or shell characters."
  }
}

variable "setup_commands" {
  type        = string
  description = "Shell commands the first-boot script runs last, on the driver and on every worker (replacements included), as ssh_user in its home directory, where the run line is run and so where the workers start: put the training code there unless the image has it, e.g. \"git clone https://github.com/you/train.git\" or \"aws s3 cp s3://bucket/train.tar.gz - | tar xz\". Run by bash -eo pipefail, tried up to five times, so keep them safe to repeat. \"\" (the default) runs nothing."
  default     = ""

  validation {
    # The bootstrap must fit a cloud's user-data limit (16 KiB on AWS) and
    # writes the commands in a here-document ending at that line.
    condition     = length(var.setup_commands) <= 4096 && !can(regex("(?m)^CLOUD_ELASTIC_SETUP$", var.setup_commands))
    error_message = "setup_commands must be at most 4096 characters (fetch a longer script instead) and must not hold a line CLOUD_ELASTIC_SETUP."
  }
}
