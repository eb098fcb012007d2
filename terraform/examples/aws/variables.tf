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
  default     = "demo"
}

variable "workers" {
  type        = number
  description = "GPU workers to start with."
  default     = 2
}

variable "max_workers" {
  type        = number
  description = "Most GPU workers the group may grow to."
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
