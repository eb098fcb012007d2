output "worker_tags" {
  description = "Tags for the worker group and its instances: the extra tags, then the discovery tags (which win)."
  value       = merge(var.tags, local.worker_tags)
}

output "driver_tags" {
  description = "Tags for the driver: the extra tags, then the discovery tags (which win)."
  value       = merge(var.tags, local.driver_tags)
}

output "worker_user_data" {
  description = "First-boot script for a worker: port range, SSH from the driver only, cloud-elastic install."
  value       = local.worker_user_data
}

output "driver_user_data" {
  description = "First-boot script for the driver: port range, cloud-elastic install."
  value       = local.driver_user_data
}

output "cli_args" {
  description = "Cloud-independent tail of the cloud-elastic run line: sizes, SSH settings, --checkpoint-dir when a bucket is set, and the training command."
  value       = "-np ${local.np} --min-np ${local.min_np} --max-np ${local.max_np} --slots-per-host ${var.gpus_per_instance} --ssh-user ${var.ssh_user} --ssh-identity-file ${var.ssh_identity_file} ${local.checkpoint_dir == null ? "" : "--checkpoint-dir ${local.checkpoint_dir} "}${var.training_command}"
}

output "checkpoint_prefix" {
  description = "The checkpoint directory's path inside its bucket: checkpoint_prefix, or the cluster name."
  value       = local.checkpoint_prefix
}

output "checkpoint_dir" {
  description = "The --checkpoint-dir URL of the run line, or null when no checkpoint bucket is set."
  value       = local.checkpoint_dir
}

output "ssh_public_key" {
  description = "The validated public key, trimmed."
  value       = trimspace(var.ssh_public_key)
}

output "admin_ssh_cidrs" {
  description = "The validated admin CIDR blocks."
  value       = var.admin_ssh_cidrs
}

output "training_ports" {
  description = "The validated training port range."
  value       = var.training_ports
}
