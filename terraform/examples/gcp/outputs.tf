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

output "mig_name" {
  description = "Worker managed instance group."
  value       = module.cloud_elastic.mig_name
}
