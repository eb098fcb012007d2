output "asg_name" {
  description = "Name of the worker Auto Scaling group (--aws-asg)."
  value       = aws_autoscaling_group.workers.name
}

output "region" {
  description = "Region of the group (--aws-region)."
  value       = data.aws_region.current.name
}

output "driver_address" {
  description = "Address to SSH to the driver: its public IP if it has one, else its private IP."
  value       = coalesce(aws_instance.driver.public_ip, aws_instance.driver.private_ip)
}

output "driver_private_ip" {
  description = "Private IP of the driver, the only source the workers accept SSH from."
  value       = aws_instance.driver.private_ip
}

output "lifecycle_hook_name" {
  description = "Termination lifecycle hook the driver completes once a leaving worker has drained."
  value       = local.lifecycle_hook_name
}

output "notice_queue_url" {
  description = "SQS queue EventBridge fills with Spot, rebalance and terminate-lifecycle notices (--aws-notice-queue)."
  value       = aws_sqs_queue.notices.url
}

output "ssh_user" {
  description = "User to log in as, on the driver and on the workers."
  value       = var.ssh_user
}

output "cli_command" {
  description = "The command to run on the driver to start training."
  value       = "cloud-elastic run --aws-asg ${aws_autoscaling_group.workers.name} --aws-region ${data.aws_region.current.name} --aws-notice-queue ${aws_sqs_queue.notices.url} ${module.common.cli_args}"
}

output "launch_template_id" {
  description = "Launch template of the GPU workers, for more groups of the same workers (examples/aws-multi-source)."
  value       = aws_launch_template.workers.id
}

output "driver_role_name" {
  description = "IAM role of the driver, for a root that grants it more (examples/aws-multi-source)."
  value       = aws_iam_role.driver.name
}
