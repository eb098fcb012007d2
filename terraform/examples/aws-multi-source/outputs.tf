output "cli_command" {
  description = "Run this on the driver to start training on the three groups."
  value       = replace(module.cloud_elastic.cli_command, local.shared_flags, local.multi_flags)
}

output "driver_address" {
  description = "SSH here (as ssh_user) to reach the driver."
  value       = module.cloud_elastic.driver_address
}

output "ssh_user" {
  description = "User on the driver and the workers."
  value       = module.cloud_elastic.ssh_user
}

output "asg_names" {
  description = "The three groups: Spot, Spot, on-demand fallback."
  value       = [module.cloud_elastic.asg_name, aws_autoscaling_group.spot_b.name, aws_autoscaling_group.fallback.name]
}
