variable "zone" {
  type        = string
  description = "Zone with GPU profiles, such as us-south-1; the provider's region is derived from it."
  default     = "us-south-1"
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
  description = "Most GPU workers the group manager allows."
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

variable "gpu_image_name" {
  type        = string
  description = "Name of the worker image: one with NVIDIA drivers and PyTorch (your own custom image); list candidates with 'ibmcloud is images'."

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]*$", var.gpu_image_name))
    error_message = "gpu_image_name must be an image name (lowercase letters, digits and '-')."
  }
}

variable "driver_image_name" {
  type        = string
  description = "Name of the driver image, a stock Ubuntu one (see 'ibmcloud is images --visibility public')."
  default     = "ibm-ubuntu-22-04-5-minimal-amd64-1"

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]*$", var.driver_image_name))
    error_message = "driver_image_name must be an image name (lowercase letters, digits and '-')."
  }
}

variable "setup_commands" {
  type        = string
  description = "Shell commands every VM runs at first boot, in the SSH user's home directory, to fetch the training code, e.g. \"git clone https://github.com/you/train.git\"; \"\" (the default): the code is on the image."
  default     = ""
}
