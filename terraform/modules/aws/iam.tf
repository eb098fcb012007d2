# The driver's only cloud permissions: read the group (discovery) and drain
# its terminating instances (lifecycle hook). Workers get no role at all:
# their Spot notices come from the instance metadata service, which needs none.

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
      "ec2:DescribeInstances",
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
}

resource "aws_iam_role" "driver" {
  name               = "${var.cluster_name}-driver"
  description        = "cloud-elastic driver of ${var.cluster_name}: discovery and lifecycle hook only"
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
