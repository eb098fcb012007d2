# Example root: one job on three managed instance groups (docs/multi-source.md).
#   spot-a: the module's Spot MIG (and the driver);
#   spot-b: a second Spot MIG of the same workers in another zone, another pool when the first runs dry;
#   on-demand: the fallback (STANDARD provisioning), at target size 0. The driver resizes it (--manage-capacity)
#   only while the Spot MIGs give fewer than --min-np slots, and back to 0 once Spot returns.
#   terraform init && terraform apply -var 'project=...' -var 'ssh_public_key=...' -var 'admin_ssh_cidrs=[...]'

terraform {
  required_version = ">= 1.9, < 2.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.30, < 7.0"
    }
  }
}

provider "google" {
  project = var.project
}

module "cloud_elastic" {
  source = "../../modules/gcp"

  cluster_name       = var.cluster_name
  project            = var.project
  zones              = [var.zone]
  network            = "default"
  subnetwork         = "default"
  gpu_machine_type   = var.gpu_machine_type
  gpu_type           = var.gpu_type
  target_size        = var.workers
  max_size           = var.max_workers
  ssh_public_key     = var.ssh_public_key
  admin_ssh_cidrs    = var.admin_ssh_cidrs
  worker_public_ip   = true
  driver_public_ip   = true
  setup_commands     = var.setup_commands
  worker_torch_index = var.worker_torch_index
}

# A second Spot pool: the module's template, in another zone.
resource "google_compute_instance_group_manager" "spot_b" {
  name               = "${var.cluster_name}-workers-b"
  project            = var.project
  zone               = var.spot_b_zone
  base_instance_name = "${var.cluster_name}-worker-b"
  target_size        = var.workers

  version {
    instance_template = module.cloud_elastic.instance_template_id
  }

  lifecycle {
    ignore_changes = [target_size]
  }
}

# The fallback's template: the same workers on STANDARD (on-demand) capacity.
# Its subnetwork is a bare name, resolved in the template's region (the
# provider sets none): zone's, as the module's template does.
resource "google_compute_instance_template" "on_demand" {
  name_prefix  = "${var.cluster_name}-worker-od-"
  description  = "cloud-elastic on-demand fallback workers of ${var.cluster_name}"
  project      = var.project
  region       = regex("^(.*)-[a-z]$", var.zone)[0]
  machine_type = var.gpu_machine_type

  scheduling {
    provisioning_model  = "STANDARD"
    automatic_restart   = true
    on_host_maintenance = "TERMINATE"
  }

  guest_accelerator {
    type  = var.gpu_type
    count = 1
  }

  disk {
    source_image = var.gpu_image
    disk_size_gb = 100
    disk_type    = "pd-balanced"
    boot         = true
    auto_delete  = true
  }

  network_interface {
    subnetwork = "default"
    access_config {}
  }

  service_account {
    email  = module.cloud_elastic.worker_service_account_email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_vtpm                 = true
    enable_integrity_monitoring = true
    enable_secure_boot          = false
  }

  metadata = module.cloud_elastic.worker_metadata

  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_instance_group_manager" "fallback" {
  name               = "${var.cluster_name}-on-demand"
  project            = var.project
  zone               = var.zone
  base_instance_name = "${var.cluster_name}-worker-od"
  target_size        = 0

  version {
    instance_template = google_compute_instance_template.on_demand.id
  }

  lifecycle {
    # The driver owns the size (--manage-capacity); re-applying must not undo it.
    ignore_changes = [target_size]
  }
}

# Resizing the fallback MIG, and that MIG only (an IAM condition on its name: Compute Engine has no
# per-MIG binding). Reading the other MIGs is the module's grant, which is project-wide.
resource "google_project_iam_custom_role" "resize_fallback" {
  project     = var.project
  role_id     = "cloudElasticResize_${replace(var.cluster_name, "-", "_")}"
  title       = "cloud-elastic fallback resize (${var.cluster_name})"
  description = "Resize the on-demand fallback group of a cloud-elastic job."
  permissions = ["compute.instanceGroupManagers.update"]
}

resource "google_project_iam_member" "driver_resize_fallback" {
  project = var.project
  role    = google_project_iam_custom_role.resize_fallback.id
  member  = "serviceAccount:${module.cloud_elastic.driver_service_account_email}"

  condition {
    title      = "fallback-mig-only"
    expression = "resource.name.endsWith(\"/instanceGroupManagers/${google_compute_instance_group_manager.fallback.name}\")"
  }
}

locals {
  # Inserted after the module's group flags: the other two MIGs, the second one's zone, the fallback mark.
  module_flags = "--gcp-zone ${var.zone}"
  multi_flags = join(" ", [
    "--gcp-zone ${var.zone}",
    "--gcp-mig ${google_compute_instance_group_manager.spot_b.name}",
    "--gcp-mig ${google_compute_instance_group_manager.fallback.name}",
    "--source ${google_compute_instance_group_manager.spot_b.name}:zone=${var.spot_b_zone}",
    "--source ${google_compute_instance_group_manager.fallback.name}:fallback,price=${var.on_demand_price_per_gpu_hour}",
    "--manage-capacity",
  ])
}
