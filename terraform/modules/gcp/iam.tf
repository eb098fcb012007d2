# The driver may read the worker group, its instances (for their private IPs)
# and machine types (for their GPU counts); with checkpoint_bucket, both
# accounts may also use that bucket's objects (checkpoints.tf), which is all
# the workers' account ever gets: the preemption notice comes from the
# metadata server, which needs no role.
#
# Compute Engine has no per-MIG IAM binding, so the custom role is granted at
# project level; its four read-only permissions are the whole grant.

resource "google_service_account" "driver" {
  project      = var.project
  account_id   = "${var.cluster_name}-driver"
  display_name = "cloud-elastic driver of ${var.cluster_name}"
}

resource "google_service_account" "workers" {
  project      = var.project
  account_id   = "${var.cluster_name}-workers"
  display_name = "cloud-elastic workers of ${var.cluster_name}"
}

resource "google_project_iam_custom_role" "discovery" {
  project     = var.project
  role_id     = "cloudElasticDiscovery_${replace(var.cluster_name, "-", "_")}"
  title       = "cloud-elastic discovery (${var.cluster_name})"
  description = "Read a managed instance group, its instances' addresses and GPU counts."
  permissions = [
    "compute.instanceGroupManagers.get",
    "compute.instances.get",
    "compute.instances.list",
    # GPUs per machine type: used only by a run line without --slots-per-host
    # (the module's cli_command has it); kept for such a line.
    "compute.machineTypes.get",
  ]
}

resource "google_project_iam_member" "driver_discovery" {
  project = var.project
  role    = google_project_iam_custom_role.discovery.id
  member  = "serviceAccount:${google_service_account.driver.email}"
}
