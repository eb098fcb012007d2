# Inbound, and nothing else: the driver reaches the workers on SSH; workers
# reach each other and the driver on the training ports; optionally admins
# reach the driver on SSH. Application security groups name the two roles.
# Azure's default rules allow all traffic inside the virtual network, so
# each group ends with an explicit deny.

resource "azurerm_application_security_group" "workers" {
  name                = "${var.cluster_name}-workers"
  resource_group_name = azurerm_resource_group.this.name
  location            = azurerm_resource_group.this.location
  tags                = module.common.worker_tags
}

resource "azurerm_application_security_group" "driver" {
  name                = "${var.cluster_name}-driver"
  resource_group_name = azurerm_resource_group.this.name
  location            = azurerm_resource_group.this.location
  tags                = module.common.driver_tags
}

resource "azurerm_network_security_group" "workers" {
  name                = "${var.cluster_name}-workers"
  resource_group_name = azurerm_resource_group.this.name
  location            = azurerm_resource_group.this.location
  tags                = module.common.worker_tags
}

resource "azurerm_network_security_group" "driver" {
  name                = "${var.cluster_name}-driver"
  resource_group_name = azurerm_resource_group.this.name
  location            = azurerm_resource_group.this.location
  tags                = module.common.driver_tags
}

resource "azurerm_network_security_rule" "workers_ssh_from_driver" {
  name                                       = "ssh-from-driver"
  resource_group_name                        = azurerm_resource_group.this.name
  network_security_group_name                = azurerm_network_security_group.workers.name
  priority                                   = 100
  direction                                  = "Inbound"
  access                                     = "Allow"
  protocol                                   = "Tcp"
  source_port_range                          = "*"
  destination_port_range                     = "22"
  source_application_security_group_ids      = [azurerm_application_security_group.driver.id]
  destination_application_security_group_ids = [azurerm_application_security_group.workers.id]
}

resource "azurerm_network_security_rule" "workers_training_from_workers" {
  name                                       = "training-from-workers"
  resource_group_name                        = azurerm_resource_group.this.name
  network_security_group_name                = azurerm_network_security_group.workers.name
  priority                                   = 110
  direction                                  = "Inbound"
  access                                     = "Allow"
  protocol                                   = "Tcp"
  source_port_range                          = "*"
  destination_port_range                     = "${module.common.training_ports.from}-${module.common.training_ports.to}"
  source_application_security_group_ids      = [azurerm_application_security_group.workers.id]
  destination_application_security_group_ids = [azurerm_application_security_group.workers.id]
}

resource "azurerm_network_security_rule" "driver_training_from_workers" {
  name                                       = "training-from-workers"
  resource_group_name                        = azurerm_resource_group.this.name
  network_security_group_name                = azurerm_network_security_group.driver.name
  priority                                   = 110
  direction                                  = "Inbound"
  access                                     = "Allow"
  protocol                                   = "Tcp"
  source_port_range                          = "*"
  destination_port_range                     = "${module.common.training_ports.from}-${module.common.training_ports.to}"
  source_application_security_group_ids      = [azurerm_application_security_group.workers.id]
  destination_application_security_group_ids = [azurerm_application_security_group.driver.id]
}

resource "azurerm_network_security_rule" "driver_ssh_from_admins" {
  count = length(module.common.admin_ssh_cidrs) > 0 ? 1 : 0

  name                        = "ssh-from-admins"
  resource_group_name         = azurerm_resource_group.this.name
  network_security_group_name = azurerm_network_security_group.driver.name
  priority                    = 120
  direction                   = "Inbound"
  access                      = "Allow"
  protocol                    = "Tcp"
  source_port_range           = "*"
  destination_port_range      = "22"
  source_address_prefixes     = module.common.admin_ssh_cidrs
  destination_address_prefix  = "*"
}

resource "azurerm_network_security_rule" "deny_other_inbound" {
  for_each = {
    workers = azurerm_network_security_group.workers.name
    driver  = azurerm_network_security_group.driver.name
  }

  name                        = "deny-other-inbound"
  resource_group_name         = azurerm_resource_group.this.name
  network_security_group_name = each.value
  priority                    = 4096
  direction                   = "Inbound"
  access                      = "Deny"
  protocol                    = "*"
  source_port_range           = "*"
  destination_port_range      = "*"
  source_address_prefix       = "*"
  destination_address_prefix  = "*"
}

resource "azurerm_network_interface_security_group_association" "driver" {
  network_interface_id      = azurerm_network_interface.driver.id
  network_security_group_id = azurerm_network_security_group.driver.id
}

resource "azurerm_network_interface_application_security_group_association" "driver" {
  network_interface_id          = azurerm_network_interface.driver.id
  application_security_group_id = azurerm_application_security_group.driver.id
}
