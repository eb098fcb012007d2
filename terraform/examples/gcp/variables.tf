variable "project" {
  type        = string
  description = "GCP project to deploy into."
}

variable "zones" {
  type        = list(string)
  description = "Zones with L4 GPUs; one zone gives a zonal MIG, several a regional one."
  default     = ["us-central1-a"]
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
