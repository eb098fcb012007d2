# Example root: a virtual network, a Spot scale set of T4 VMs and a CPU
# driver. See ../../docs/terraform.md.

terraform {
  required_version = ">= 1.9, < 2.0"

  required_providers {
    azurerm = {
      source  = "hashicorp/azurerm"
      version = ">= 4.0, < 5.0"
    }
  }
}

provider "azurerm" {
  features {}
  subscription_id = var.subscription_id
}

resource "azurerm_resource_group" "network" {
  name     = "${var.cluster_name}-network"
  location = var.location
}

resource "azurerm_virtual_network" "this" {
  name                = "${var.cluster_name}-vnet"
  resource_group_name = azurerm_resource_group.network.name
  location            = azurerm_resource_group.network.location
  address_space       = ["10.42.0.0/16"]
}

resource "azurerm_subnet" "cluster" {
  name                 = "cluster"
  resource_group_name  = azurerm_resource_group.network.name
  virtual_network_name = azurerm_virtual_network.this.name
  address_prefixes     = ["10.42.1.0/24"]
}

module "cloud_elastic" {
  source = "../../modules/azure"

  cluster_name     = var.cluster_name
  location         = var.location
  subnet_id        = azurerm_subnet.cluster.id
  instances        = var.workers
  max_size         = var.max_workers
  ssh_public_key   = var.ssh_public_key
  admin_ssh_cidrs  = var.admin_ssh_cidrs
  driver_public_ip = true
  setup_commands   = var.setup_commands
}
