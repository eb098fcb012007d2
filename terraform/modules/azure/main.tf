# GPU Spot workers in a Linux scale set, and an on-demand CPU driver whose
# managed identity may read the scale set. See README.md.

module "common" {
  source = "../common"

  cluster_name       = var.cluster_name
  min_size           = var.min_size
  max_size           = var.max_size
  desired_size       = var.instances
  gpus_per_instance  = var.gpus_per_instance
  training_ports     = var.training_ports
  admin_ssh_cidrs    = var.admin_ssh_cidrs
  ssh_user           = var.ssh_user
  ssh_public_key     = var.ssh_public_key
  ssh_identity_file  = var.ssh_identity_file
  pip_spec           = var.cloud_elastic_pip_spec
  torch_spec         = var.torch_spec
  worker_torch_index = var.worker_torch_index
  checkpoint_root    = var.checkpoint_container == null ? null : "az://${var.checkpoint_container.name}"
  checkpoint_prefix  = var.checkpoint_prefix
  training_command   = var.training_command
  setup_commands     = var.setup_commands
  driver_ip          = azurerm_network_interface.driver.private_ip_address
  tags               = var.tags

  # The storage account of az:// checkpoint URLs, and the workers' identity
  # for DefaultAzureCredential (checkpoints.tf).
  driver_environment = local.checkpoints ? { AZURE_STORAGE_ACCOUNT_NAME = local.checkpoint_account } : {}
  worker_environment = local.checkpoints ? {
    AZURE_STORAGE_ACCOUNT_NAME = local.checkpoint_account
    AZURE_CLIENT_ID            = azurerm_user_assigned_identity.workers[0].client_id
  } : {}
}

data "azurerm_client_config" "current" {}

resource "azurerm_resource_group" "this" {
  name     = coalesce(var.resource_group_name, "${var.cluster_name}-cloud-elastic")
  location = var.location
  tags     = module.common.driver_tags
}

resource "azurerm_linux_virtual_machine_scale_set" "workers" {
  name                            = "${var.cluster_name}-workers"
  resource_group_name             = azurerm_resource_group.this.name
  location                        = azurerm_resource_group.this.location
  sku                             = var.gpu_vm_size
  instances                       = var.instances
  zones                           = length(var.zones) > 0 ? var.zones : null
  admin_username                  = var.ssh_user
  disable_password_authentication = true
  custom_data                     = base64encode(module.common.worker_user_data)
  encryption_at_host_enabled      = var.encryption_at_host
  tags                            = module.common.worker_tags

  priority        = "Spot"
  eviction_policy = var.eviction_policy
  max_bid_price   = var.max_price

  # Try & restore: without it the scale set never replaces an evicted Spot VM,
  # and the group only shrinks. Azure retries for up to the timeout (2 hours,
  # its longest) after an eviction; it is off in a scale set with autoscale.
  # Both settings force a new scale set when changed.
  spot_restore {
    enabled = true
    timeout = "PT2H"
  }

  # Overprovisioned extra VMs would show up in discovery and then vanish.
  overprovision = false
  upgrade_mode  = "Manual"

  # Scale in the newest VMs first: the oldest worker holds rank 0.
  scale_in {
    rule = "NewestVM"
  }

  # A scale-in victim gets a Terminate scheduled event and waits this long,
  # so the driver can drain it before it goes.
  termination_notification {
    enabled = true
    timeout = "PT${var.termination_notice_s / 60}M"
  }

  admin_ssh_key {
    username   = var.ssh_user
    public_key = module.common.ssh_public_key
  }

  source_image_reference {
    publisher = var.gpu_image.publisher
    offer     = var.gpu_image.offer
    sku       = var.gpu_image.sku
    version   = var.gpu_image.version
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "Premium_LRS"
    disk_size_gb         = var.worker_disk_gb
  }

  network_interface {
    name                      = "workers"
    primary                   = true
    network_security_group_id = azurerm_network_security_group.workers.id

    ip_configuration {
      name                           = "workers"
      primary                        = true
      subnet_id                      = var.subnet_id
      application_security_group_ids = [azurerm_application_security_group.workers.id]
    }
  }

  # Only with checkpoint_container: that container's blobs (checkpoints.tf).
  dynamic "identity" {
    for_each = local.checkpoints ? [1] : []
    content {
      type         = "UserAssigned"
      identity_ids = [azurerm_user_assigned_identity.workers[0].id]
    }
  }

  lifecycle {
    ignore_changes = [instances]
  }
}

resource "azurerm_public_ip" "driver" {
  count = var.driver_public_ip ? 1 : 0

  name                = "${var.cluster_name}-driver"
  resource_group_name = azurerm_resource_group.this.name
  location            = azurerm_resource_group.this.location
  allocation_method   = "Static"
  sku                 = "Standard"
  tags                = module.common.driver_tags
}

resource "azurerm_network_interface" "driver" {
  name                = "${var.cluster_name}-driver"
  resource_group_name = azurerm_resource_group.this.name
  location            = azurerm_resource_group.this.location
  tags                = module.common.driver_tags

  ip_configuration {
    name                          = "driver"
    subnet_id                     = var.subnet_id
    private_ip_address_allocation = "Dynamic"
    public_ip_address_id          = var.driver_public_ip ? azurerm_public_ip.driver[0].id : null
  }
}

resource "azurerm_linux_virtual_machine" "driver" {
  name                            = "${var.cluster_name}-driver"
  resource_group_name             = azurerm_resource_group.this.name
  location                        = azurerm_resource_group.this.location
  size                            = var.driver_vm_size
  priority                        = "Regular"
  admin_username                  = var.ssh_user
  disable_password_authentication = true
  network_interface_ids           = [azurerm_network_interface.driver.id]
  custom_data                     = base64encode(module.common.driver_user_data)
  encryption_at_host_enabled      = var.encryption_at_host
  allow_extension_operations      = false
  tags                            = module.common.driver_tags

  identity {
    type = "SystemAssigned"
  }

  admin_ssh_key {
    username   = var.ssh_user
    public_key = module.common.ssh_public_key
  }

  source_image_reference {
    publisher = "Canonical"
    offer     = "0001-com-ubuntu-server-jammy"
    sku       = "22_04-lts-gen2"
    version   = "latest"
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "StandardSSD_LRS"
    disk_size_gb         = 30
  }

  lifecycle {
    # The driver runs the job, and the provider replaces a VM whose
    # custom_data changes (any bootstrap setting: setup_commands, pip_spec...),
    # which first boot alone reads anyway. Replace it on purpose between jobs
    # (docs/terraform.md).
    ignore_changes = [custom_data]
  }
}
