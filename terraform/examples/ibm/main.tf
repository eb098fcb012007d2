# Example root: a VPC with a public gateway, an instance group of L4
# workers (the module's default gpu_profile) and a CPU driver. See
# ../../docs/terraform.md.

terraform {
  required_version = ">= 1.9, < 2.0"

  required_providers {
    ibm = {
      source  = "IBM-Cloud/ibm"
      version = ">= 1.60, < 2.0"
    }
  }
}

provider "ibm" {
  region = regex("^(.*)-[0-9]$", var.zone)[0]
}

resource "ibm_resource_group" "cluster" {
  name = "${var.cluster_name}-cloud-elastic"
}

resource "ibm_is_vpc" "this" {
  name           = "${var.cluster_name}-vpc"
  resource_group = ibm_resource_group.cluster.id
}

resource "ibm_is_public_gateway" "this" {
  name           = "${var.cluster_name}-gateway"
  vpc            = ibm_is_vpc.this.id
  zone           = var.zone
  resource_group = ibm_resource_group.cluster.id
}

resource "ibm_is_subnet" "cluster" {
  name                     = "${var.cluster_name}-cluster"
  vpc                      = ibm_is_vpc.this.id
  zone                     = var.zone
  total_ipv4_address_count = 256
  public_gateway           = ibm_is_public_gateway.this.id
  resource_group           = ibm_resource_group.cluster.id
}

data "ibm_is_image" "gpu" {
  name = var.gpu_image_name
}

data "ibm_is_image" "driver" {
  name = var.driver_image_name
}

module "cloud_elastic" {
  source = "../../modules/ibm"

  cluster_name      = var.cluster_name
  resource_group_id = ibm_resource_group.cluster.id
  vpc_id            = ibm_is_vpc.this.id
  zone              = var.zone
  subnet_id         = ibm_is_subnet.cluster.id
  gpu_image_id      = data.ibm_is_image.gpu.id
  driver_image_id   = data.ibm_is_image.driver.id
  instance_count    = var.workers
  max_size          = var.max_workers
  ssh_public_key    = var.ssh_public_key
  admin_ssh_cidrs   = var.admin_ssh_cidrs
  driver_public_ip  = true
  setup_commands    = var.setup_commands
}
