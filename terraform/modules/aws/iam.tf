# The driver's only cloud permissions: read the group (discovery), read and
# delete the notices EventBridge queues for it (notices.tf), and let a drained
# instance go (complete or extend this group's lifecycle action); with
# checkpoint_bucket also the checkpoint prefix (checkpoints.tf), which is all
# the workers ever get: the notice watcher on a worker host reads the instance
# metadata service (IMDSv2), which needs no permission.

data "aws_iam_policy_document" "driver_assume" {
  statement {
    sid     = "Ec2AssumesDriverRole"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "driver" {
  statement {
    sid    = "DescribeGroupInstancesAndTypes"
    effect = "Allow"
    actions = [
      "autoscaling:DescribeAutoScalingGroups",
      "autoscaling:DescribeLifecycleHooks",
      "ec2:DescribeInstances",
      # GPUs per instance type: used only by a run line without --slots-per-host
      # (the module's cli_command has it); kept for such a line.
      "ec2:DescribeInstanceTypes",
    ]
    # These Describe calls support no resource-level permissions.
    resources = ["*"]
  }

  statement {
    sid    = "DrainThisGroupOnly"
    effect = "Allow"
    actions = [
      "autoscaling:CompleteLifecycleAction",
      "autoscaling:RecordLifecycleActionHeartbeat",
    ]
    resources = [aws_autoscaling_group.workers.arn]
  }

  statement {
    sid    = "ReadThisClustersNoticeQueue"
    effect = "Allow"
    actions = [
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage", # also authorises DeleteMessageBatch, the call the driver makes
    ]
    resources = [aws_sqs_queue.notices.arn]
  }
}

resource "aws_iam_role" "driver" {
  name               = "${var.cluster_name}-driver"
  description        = "cloud-elastic driver of ${var.cluster_name}: discovery, notice queue and lifecycle hook only"
  assume_role_policy = data.aws_iam_policy_document.driver_assume.json
  tags               = module.common.driver_tags
}

resource "aws_iam_role_policy" "driver" {
  name   = "${var.cluster_name}-discovery"
  role   = aws_iam_role.driver.id
  policy = data.aws_iam_policy_document.driver.json
}

resource "aws_iam_instance_profile" "driver" {
  name = "${var.cluster_name}-driver"
  role = aws_iam_role.driver.name
  tags = module.common.driver_tags
}
