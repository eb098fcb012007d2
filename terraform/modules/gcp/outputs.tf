locals {
  # Whichever of the zonal or regional group exists (the other has count 0).
  created_mig_name = one(concat(google_compute_instance_group_manager.workers[*].name, google_compute_region_instance_group_manager.workers[*].name))
  location_flag    = local.regional ? "--gcp-region ${local.region}" : "--gcp-zone ${var.zones[0]}"
}

output "mig_name" {
  description = "Name of the worker managed instance group (--gcp-mig)."
  value       = local.created_mig_name
}

output "project" {
  description = "Project of the group (--gcp-project)."
  value       = var.project
}

output "zone" {
  description = "Zone of a zonal group (--gcp-zone); null for a regional one."
  value       = local.regional ? null : var.zones[0]
}

output "region" {
  description = "Region of the group (--gcp-region for a regional group)."
  value       = local.region
}

output "driver_address" {
  description = "Address to SSH to the driver: its public IP if it has one, else its private IP."
  value       = coalesce(try(google_compute_instance.driver.network_interface[0].access_config[0].nat_ip, ""), google_compute_instance.driver.network_interface[0].network_ip)
}

output "driver_private_ip" {
  description = "Private IP of the driver, the only source the workers accept SSH from."
  value       = google_compute_instance.driver.network_interface[0].network_ip
}

output "ssh_user" {
  description = "User to log in as, on the driver and on the workers."
  value       = var.ssh_user
}

output "cli_command" {
  description = "The command to run on the driver to start training."
  value       = "cloud-elastic run --gcp-mig ${local.created_mig_name} --gcp-project ${var.project} ${local.location_flag} ${module.common.cli_args}"
}

output "instance_template_id" {
  description = "Instance template of the Spot GPU workers, for more groups of them (examples/gcp-multi-source)."
  value       = google_compute_instance_template.workers.id
}

output "worker_service_account_email" {
  description = "Service account the workers run as (no roles but the checkpoint bucket's, when set), for more templates of them."
  value       = google_service_account.workers.email
}

output "driver_service_account_email" {
  description = "Service account of the driver, for a root that grants it more (examples/gcp-multi-source)."
  value       = google_service_account.driver.email
}

output "worker_metadata" {
  description = "Metadata of the workers' template (driver SSH key, startup script), for more templates of them."
  value       = google_compute_instance_template.workers.metadata
}
