# Example root: a zonal MIG of L4 Spot VMs and a CPU driver in the default
# network. See ../../docs/terraform.md.

terraform {
  required_version = ">= 1.9, < 2.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.30, < 7.0"
    }
  }
}

provider "google" {
  project = var.project
}

module "cloud_elastic" {
  source = "../../modules/gcp"

  cluster_name       = var.cluster_name
  project            = var.project
  zones              = var.zones
  network            = "default"
  subnetwork         = "default"
  target_size        = var.workers
  max_size           = var.max_workers
  ssh_public_key     = var.ssh_public_key
  admin_ssh_cidrs    = var.admin_ssh_cidrs
  worker_public_ip   = true
  driver_public_ip   = true
  setup_commands     = var.setup_commands
  worker_torch_index = var.worker_torch_index
}
