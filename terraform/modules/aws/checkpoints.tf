# Checkpoint storage (checkpoint_bucket): the driver writes the job record and
# rank 0 writes the checkpoints, and every worker reads the job record before
# it trains, so the driver and every worker need the same access, scoped to
# the checkpoint prefix. The bucket is the user's: nothing here creates it.

locals {
  checkpoints        = var.checkpoint_bucket != null
  checkpoint_objects = "arn:aws:s3:::${coalesce(var.checkpoint_bucket, "-")}/${module.common.checkpoint_prefix}"
}

data "aws_iam_policy_document" "checkpoints" {
  count = local.checkpoints ? 1 : 0

  # Not limited to the prefix (s3:prefix): S3 answers a read of a missing
  # object with 404 only to a caller who may list the bucket, and with 403
  # otherwise, which the checkpoint store could not tell from a refusal.
  # Listing shows key names, not contents.
  statement {
    sid       = "ListTheCheckpointBucket"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = ["arn:aws:s3:::${var.checkpoint_bucket}"]
  }

  statement {
    sid    = "ReadWriteCheckpointObjects"
    effect = "Allow"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      # s3fs uploads large checkpoints in parts; an interrupted upload is aborted.
      "s3:AbortMultipartUpload",
    ]
    resources = ["${local.checkpoint_objects}/*"]
  }
}

resource "aws_iam_role_policy" "driver_checkpoints" {
  count = local.checkpoints ? 1 : 0

  name   = "${var.cluster_name}-checkpoints"
  role   = aws_iam_role.driver.id
  policy = data.aws_iam_policy_document.checkpoints[0].json
}

# The workers' only permissions: the checkpoint prefix. Without a bucket they
# get no role at all.
resource "aws_iam_role" "workers" {
  count = local.checkpoints ? 1 : 0

  name               = "${var.cluster_name}-workers"
  description        = "cloud-elastic workers of ${var.cluster_name}: the checkpoint prefix only"
  assume_role_policy = data.aws_iam_policy_document.driver_assume.json
  tags               = module.common.worker_tags
}

resource "aws_iam_role_policy" "workers_checkpoints" {
  count = local.checkpoints ? 1 : 0

  name   = "${var.cluster_name}-checkpoints"
  role   = aws_iam_role.workers[0].id
  policy = data.aws_iam_policy_document.checkpoints[0].json
}

resource "aws_iam_instance_profile" "workers" {
  count = local.checkpoints ? 1 : 0

  name = "${var.cluster_name}-workers"
  role = aws_iam_role.workers[0].name
  tags = module.common.worker_tags
}
