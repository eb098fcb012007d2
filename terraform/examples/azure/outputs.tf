output "cli_command" {
  description = "Run this on the driver to start training."
  value       = module.cloud_elastic.cli_command
}

output "driver_address" {
  description = "SSH here (as ssh_user) to reach the driver."
  value       = module.cloud_elastic.driver_address
}

output "ssh_user" {
  description = "User on the driver and the workers."
  value       = module.cloud_elastic.ssh_user
}

output "vmss_name" {
  description = "Worker scale set."
  value       = module.cloud_elastic.vmss_name
}
