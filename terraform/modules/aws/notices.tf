# Queue mode (--aws-notice-queue): EventBridge forwards the notices that
# concern the workers to one SQS queue, which the driver reads centrally.
# The Spot and rebalance events carry only an instance id, not the group, so
# that rule matches them for the whole account and region; the driver keeps
# the ones for instances of its group and deletes the rest. The lifecycle
# rule is filtered to this group.

locals {
  notice_queue_name = "${var.cluster_name}-notices"
  # A notice is worth reading until the lifecycle hook lets the instance go;
  # older messages are noise, so the queue keeps them no longer than that.
  notice_retention_s = max(300, var.lifecycle_heartbeat_timeout_s)
}

resource "aws_sqs_queue" "notices" {
  name                      = local.notice_queue_name
  message_retention_seconds = local.notice_retention_s
  # SQS-managed keys: EventBridge may send to the queue without a KMS grant.
  sqs_managed_sse_enabled = true
  tags                    = module.common.driver_tags
}

resource "aws_cloudwatch_event_rule" "spot_notices" {
  name        = "${var.cluster_name}-spot-notices"
  description = "EC2 Spot interruption warnings and rebalance recommendations, to ${local.notice_queue_name}"
  event_pattern = jsonencode({
    source      = ["aws.ec2"]
    detail-type = ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]
  })
  tags = module.common.driver_tags
}

resource "aws_cloudwatch_event_rule" "lifecycle_notices" {
  name        = "${var.cluster_name}-lifecycle-notices"
  description = "Terminate lifecycle actions of ${aws_autoscaling_group.workers.name}, to ${local.notice_queue_name}"
  event_pattern = jsonencode({
    source      = ["aws.autoscaling"]
    detail-type = ["EC2 Instance-terminate Lifecycle Action"]
    detail = {
      AutoScalingGroupName = [aws_autoscaling_group.workers.name]
    }
  })
  tags = module.common.driver_tags
}

resource "aws_cloudwatch_event_target" "spot_notices" {
  rule      = aws_cloudwatch_event_rule.spot_notices.name
  target_id = "notice-queue"
  arn       = aws_sqs_queue.notices.arn
}

resource "aws_cloudwatch_event_target" "lifecycle_notices" {
  rule      = aws_cloudwatch_event_rule.lifecycle_notices.name
  target_id = "notice-queue"
  arn       = aws_sqs_queue.notices.arn
}

data "aws_iam_policy_document" "notice_queue" {
  statement {
    sid       = "EventBridgeRulesOfThisClusterSend"
    effect    = "Allow"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.notices.arn]

    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }

    # Only these two rules, not any rule in any account.
    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [aws_cloudwatch_event_rule.spot_notices.arn, aws_cloudwatch_event_rule.lifecycle_notices.arn]
    }
  }
}

resource "aws_sqs_queue_policy" "notices" {
  queue_url = aws_sqs_queue.notices.id
  policy    = data.aws_iam_policy_document.notice_queue.json
}
