output "vmss_name" {
  description = "Name of the worker scale set (--azure-vmss)."
  value       = azurerm_linux_virtual_machine_scale_set.workers.name
}

output "resource_group" {
  description = "Resource group of the scale set (--azure-resource-group)."
  value       = azurerm_resource_group.this.name
}

output "subscription_id" {
  description = "Subscription of the scale set (--azure-subscription)."
  value       = data.azurerm_client_config.current.subscription_id
}

output "driver_address" {
  description = "Address to SSH to the driver: its public IP if it has one, else its private IP."
  value       = var.driver_public_ip ? azurerm_public_ip.driver[0].ip_address : azurerm_network_interface.driver.private_ip_address
}

output "driver_private_ip" {
  description = "Private IP of the driver, the only source the workers accept SSH from."
  value       = azurerm_network_interface.driver.private_ip_address
}

output "ssh_user" {
  description = "User to log in as, on the driver and on the workers."
  value       = var.ssh_user
}

output "cli_command" {
  description = "The command to run on the driver to start training."
  value       = "cloud-elastic run --azure-vmss ${azurerm_linux_virtual_machine_scale_set.workers.name} --azure-resource-group ${azurerm_resource_group.this.name} --azure-subscription ${data.azurerm_client_config.current.subscription_id} ${module.common.cli_args}"
}
