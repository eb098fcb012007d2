# Checkpoint storage (checkpoint_bucket): the driver writes the job record and
# rank 0 writes the checkpoints, and every worker reads the job record before
# it trains, so both service accounts may read, write, list and delete the
# bucket's objects (roles/storage.objectUser; Cloud Storage grants roles per
# bucket, not per prefix). The bucket is the user's: nothing here creates it.

resource "google_storage_bucket_iam_member" "checkpoints" {
  for_each = var.checkpoint_bucket == null ? {} : {
    driver  = google_service_account.driver.email
    workers = google_service_account.workers.email
  }

  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${each.value}"
}
