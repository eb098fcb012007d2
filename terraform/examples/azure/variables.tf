variable "subscription_id" {
  type        = string
  description = "Azure subscription to deploy into."

  validation {
    condition     = can(regex("^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$", var.subscription_id))
    error_message = "subscription_id must be a GUID."
  }
}

variable "location" {
  type        = string
  description = "Azure region with NCasT4_v3 Spot capacity."
  default     = "eastus"
}

variable "cluster_name" {
  type        = string
  description = "Name of the deployment."
  default     = "demo"
}

variable "workers" {
  type        = number
  description = "GPU workers to start with."
  default     = 2
}

variable "max_workers" {
  type        = number
  description = "Most GPU workers you intend to run."
  default     = 4
}

variable "ssh_public_key" {
  type        = string
  description = "OpenSSH public key (RSA or Ed25519); keep the private key to copy to the driver."
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
