variable "cluster_name" {
  type        = string
  description = "Name of the deployment; prefixes every resource and is the value of the cloud-elastic-cluster tag. Checked by the common module."
}

variable "location" {
  type        = string
  description = "Azure region, such as westeurope."

  validation {
    condition     = can(regex("^[a-z]+[a-z0-9]*$", var.location))
    error_message = "location must be a region name such as westeurope (lowercase, no spaces)."
  }
}

variable "resource_group_name" {
  type        = string
  description = "Name of the resource group the module creates for the cluster; the driver's read access is scoped to it. Defaults to <cluster_name>-cloud-elastic."
  default     = null

  validation {
    condition     = var.resource_group_name == null || can(regex("^[A-Za-z0-9._()-]{1,89}[A-Za-z0-9_()-]$", coalesce(var.resource_group_name, "x")))
    error_message = "resource_group_name must be 1-90 letters, digits, '.', '_', '-', '(' or ')' and not end with '.'."
  }
}

variable "subnet_id" {
  type        = string
  description = "Resource id of the subnet for the workers and the driver. Workers need outbound internet (a NAT gateway or the platform default) for the bootstrap's pip install."

  validation {
    condition     = can(regex("(?i)^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.Network/virtualNetworks/[^/]+/subnets/[^/]+$", var.subnet_id))
    error_message = "subnet_id must be a subnet resource id (/subscriptions/.../subnets/NAME)."
  }
}

variable "zones" {
  type        = list(string)
  description = "Availability zones the scale set may use; empty lets Azure choose (regional)."
  default     = []

  validation {
    condition     = alltrue([for z in var.zones : contains(["1", "2", "3"], z)])
    error_message = "zones may only hold \"1\", \"2\" and \"3\"."
  }
}

variable "gpu_vm_size" {
  type        = string
  description = "VM size of the GPU workers."
  default     = "Standard_NC4as_T4_v3"

  validation {
    condition     = can(regex("^Standard_[A-Za-z0-9_]+$", var.gpu_vm_size))
    error_message = "gpu_vm_size must be a VM size such as Standard_NC4as_T4_v3."
  }
}

variable "gpus_per_instance" {
  type        = number
  description = "GPUs per worker VM; sets --slots-per-host, -np, --min-np and --max-np in the printed command line."
  default     = 1
}

variable "gpu_image" {
  type = object({
    publisher = string
    offer     = string
    sku       = string
    version   = string
  })
  description = "Marketplace image of the workers, with NVIDIA drivers (the default is the Ubuntu HPC image)."
  default = {
    publisher = "microsoft-dsvm"
    offer     = "ubuntu-hpc"
    sku       = "2204"
    version   = "latest"
  }

  validation {
    condition     = alltrue([for v in values(var.gpu_image) : length(trimspace(v)) > 0])
    error_message = "gpu_image needs a publisher, offer, sku and version."
  }
}

variable "eviction_policy" {
  type        = string
  description = "What Azure does to an evicted Spot worker: Delete (the default: no disk charges; the scale set's Try & restore, spot_restore in main.tf, then tries for up to 2 hours to bring the set back to its instance count with new VMs as Spot capacity returns, and after that the set stays smaller until you scale it) or Deallocate (the VM stays in the set, stopped, its disk billed)."
  default     = "Delete"

  validation {
    condition     = contains(["Delete", "Deallocate"], var.eviction_policy)
    error_message = "eviction_policy must be Delete or Deallocate."
  }
}

variable "max_price" {
  type        = number
  description = "Highest hourly price in US dollars for a Spot worker; -1 (the default) pays up to the on-demand price and evicts for capacity only."
  default     = -1

  validation {
    condition     = var.max_price == -1 || var.max_price > 0
    error_message = "max_price must be -1 or a positive price."
  }
}

variable "termination_notice_s" {
  type        = number
  description = "Seconds Azure holds a scale-in victim after the Terminate scheduled event, so the driver can drain it. Azure allows 5 to 15 minutes."
  default     = 300

  validation {
    condition     = var.termination_notice_s >= 300 && var.termination_notice_s <= 900 && var.termination_notice_s % 60 == 0
    error_message = "termination_notice_s must be a whole number of minutes from 300 to 900 seconds."
  }
}

variable "worker_disk_gb" {
  type        = number
  description = "OS disk size of each worker in GB."
  default     = 128

  validation {
    condition     = var.worker_disk_gb >= 64 && var.worker_disk_gb <= 4095
    error_message = "worker_disk_gb must be between 64 and 4095."
  }
}

variable "encryption_at_host" {
  type        = bool
  description = "Encrypt temp disks and caches at the host. Needs the EncryptionAtHost feature registered on the subscription, so it is off by default."
  default     = false
}

variable "min_size" {
  type        = number
  description = "Fewest workers the job should run with; sets --min-np."
  default     = 0
}

variable "max_size" {
  type        = number
  description = "Most workers you intend to scale to; sets --max-np."
  default     = 4
}

variable "instances" {
  type        = number
  description = "Workers to start with. Terraform ignores later scaling, so re-applying does not undo it."
  default     = 2
}

variable "driver_vm_size" {
  type        = string
  description = "VM size of the on-demand CPU driver."
  default     = "Standard_B2s"

  validation {
    condition     = can(regex("^Standard_[A-Za-z0-9_]+$", var.driver_vm_size))
    error_message = "driver_vm_size must be a VM size such as Standard_B2s."
  }
}

variable "driver_public_ip" {
  type        = bool
  description = "Give the driver a static public IP (inbound is still limited to admin_ssh_cidrs)."
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
  description = "Admin user created on the driver and the workers; the driver connects as this user."
  default     = "elastic"

  validation {
    condition     = !contains(["admin", "administrator", "root", "user", "guest", "test"], var.ssh_user)
    error_message = "ssh_user must not be a name Azure reserves (admin, administrator, root, user, guest, test...)."
  }
}

variable "ssh_public_key" {
  type        = string
  description = "OpenSSH public key for driver-to-worker (and admin-to-driver) SSH. Azure accepts RSA and Ed25519 keys."
}

variable "ssh_identity_file" {
  type        = string
  description = "Where the matching private key lives on the driver."
  default     = "~/.ssh/cloud-elastic"
}

variable "cloud_elastic_pip_spec" {
  type        = string
  description = "pip requirement the bootstrap installs on the driver and the workers. Keep it pinned: the driver refuses workers of another protocol version, and a worker replaced months later must get the driver's release."
  default     = "cloud-elastic[azure]==0.1.0"
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

variable "checkpoint_container" {
  type = object({
    storage_account_id = string
    name               = string
  })
  description = "Existing blob container for checkpoints: the storage account's resource id and the container's name. When set, the driver's identity and a user-assigned identity of the workers get Storage Blob Data Contributor on that container, and the printed run line carries --checkpoint-dir az://<name>/<checkpoint_prefix>. The module never creates or deletes the container: checkpoints outlive the cluster."
  default     = null

  validation {
    condition = var.checkpoint_container == null || (
      can(regex("^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.Storage/storageAccounts/[a-z0-9]{3,24}$", var.checkpoint_container.storage_account_id)) &&
      can(regex("^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$", var.checkpoint_container.name))
    )
    error_message = "checkpoint_container needs a storage account resource id (/subscriptions/.../storageAccounts/<name>) and a container name (3-63 lowercase letters, digits and '-')."
  }
}

variable "checkpoint_prefix" {
  type        = string
  description = "Path of the checkpoint directory inside the container; null (the default) is cluster_name. The role is granted on the whole container."
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
}
