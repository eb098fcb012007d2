# The driver's managed identity may read the scale set, its VMs and their
# network interfaces (for the private IPs), in the cluster's resource group
# only. A custom role, because the built-in Reader grants "*/read".
# Workers have no identity unless checkpoint_container is set (then one for
# that container alone, checkpoints.tf): Spot and Terminate notices come from
# the instance metadata service's scheduled events, which need none.

resource "azurerm_role_definition" "discovery" {
  name        = "cloud-elastic discovery (${azurerm_resource_group.this.name})"
  scope       = azurerm_resource_group.this.id
  description = "Read one cloud-elastic scale set and its VMs' addresses."

  permissions {
    actions = [
      "Microsoft.Compute/virtualMachineScaleSets/read",
      "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
      "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/instanceView/read",
      "Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read",
      "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read",
    ]
    not_actions = []
  }

  assignable_scopes = [azurerm_resource_group.this.id]
}

resource "azurerm_role_assignment" "driver_discovery" {
  scope              = azurerm_resource_group.this.id
  role_definition_id = azurerm_role_definition.discovery.role_definition_resource_id
  principal_id       = azurerm_linux_virtual_machine.driver.identity[0].principal_id
}
