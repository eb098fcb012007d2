output "instance_group_id" {
  description = "Id of the worker instance group (--ibm-instance-group)."
  value       = ibm_is_instance_group.workers.id
}

output "region" {
  description = "Region of the group (--ibm-region)."
  value       = local.region
}

output "driver_address" {
  description = "Address to SSH to the driver: its floating IP if it has one, else its private IP."
  value       = var.driver_public_ip ? ibm_is_floating_ip.driver[0].address : ibm_is_instance.driver.primary_network_interface[0].primary_ip[0].address
}

output "driver_private_ip" {
  description = "Private IP of the driver, the only source the workers accept SSH from."
  value       = ibm_is_instance.driver.primary_network_interface[0].primary_ip[0].address
}

output "ssh_user" {
  description = "User to log in as, on the driver and on the workers."
  value       = var.ssh_user
}

output "cli_command" {
  description = "The command to run on the driver to start training."
  value       = "cloud-elastic run --ibm-instance-group ${ibm_is_instance_group.workers.id} --ibm-region ${local.region} ${module.common.cli_args}"
}
