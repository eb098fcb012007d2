output "cli_command" {
  description = "Run this on the driver to start training on the three MIGs."
  value       = replace(module.cloud_elastic.cli_command, local.module_flags, local.multi_flags)
}

output "driver_address" {
  description = "SSH here (as ssh_user) to reach the driver."
  value       = module.cloud_elastic.driver_address
}

output "ssh_user" {
  description = "User on the driver and the workers."
  value       = module.cloud_elastic.ssh_user
}

output "mig_names" {
  description = "The three MIGs: Spot, Spot, on-demand fallback."
  value       = [module.cloud_elastic.mig_name, google_compute_instance_group_manager.spot_b.name, google_compute_instance_group_manager.fallback.name]
}
