# GPU Spot workers in a managed instance group (zonal for one zone, regional
# for several), and an on-demand CPU driver. See README.md.

module "common" {
  source = "../common"

  cluster_name       = var.cluster_name
  min_size           = var.min_size
  max_size           = var.max_size
  desired_size       = var.target_size
  gpus_per_instance  = var.gpus_per_instance
  training_ports     = var.training_ports
  admin_ssh_cidrs    = var.admin_ssh_cidrs
  ssh_user           = var.ssh_user
  ssh_public_key     = var.ssh_public_key
  ssh_identity_file  = var.ssh_identity_file
  pip_spec           = var.cloud_elastic_pip_spec
  torch_spec         = var.torch_spec
  worker_torch_index = var.worker_torch_index
  checkpoint_root    = var.checkpoint_bucket == null ? null : "gs://${var.checkpoint_bucket}"
  checkpoint_prefix  = var.checkpoint_prefix
  training_command   = var.training_command
  setup_commands     = var.setup_commands
  driver_ip          = google_compute_instance.driver.network_interface[0].network_ip
  tags               = var.labels
}

locals {
  region   = regex("^(.*)-[a-z]$", var.zones[0])[0]
  regional = length(var.zones) > 1
  mig_name = "${var.cluster_name}-workers"
  ssh_keys = "${var.ssh_user}:${module.common.ssh_public_key}"
}

resource "google_compute_instance_template" "workers" {
  name_prefix  = "${var.cluster_name}-worker-"
  description  = "cloud-elastic GPU workers of ${var.cluster_name}"
  project      = var.project
  region       = local.region
  machine_type = var.gpu_machine_type
  labels       = module.common.worker_tags

  scheduling {
    provisioning_model          = "SPOT"
    preemptible                 = true
    automatic_restart           = false
    on_host_maintenance         = "TERMINATE"
    instance_termination_action = "DELETE"
  }

  guest_accelerator {
    type  = var.gpu_type
    count = var.gpus_per_instance
  }

  disk {
    source_image = var.gpu_image
    disk_size_gb = var.worker_disk_gb
    disk_type    = "pd-balanced"
    boot         = true
    auto_delete  = true
  }

  network_interface {
    subnetwork = var.subnetwork

    dynamic "access_config" {
      for_each = var.worker_public_ip ? [1] : []
      content {}
    }
  }

  service_account {
    email  = google_service_account.workers.email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_vtpm                 = true
    enable_integrity_monitoring = true
    # NVIDIA's kernel modules in most GPU images are not signed for Secure Boot.
    enable_secure_boot = false
  }

  # Keys come from ssh-keys alone: no project-wide keys, no OS Login users.
  metadata = {
    ssh-keys               = local.ssh_keys
    block-project-ssh-keys = true
    enable-oslogin         = false
    startup-script         = module.common.worker_user_data
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_instance_group_manager" "workers" {
  count = local.regional ? 0 : 1

  name               = local.mig_name
  project            = var.project
  zone               = var.zones[0]
  base_instance_name = "${var.cluster_name}-worker"
  target_size        = var.target_size

  version {
    instance_template = google_compute_instance_template.workers.id
  }

  # Template changes apply to new workers only; running ones keep training.
  update_policy {
    type           = "OPPORTUNISTIC"
    minimal_action = "REPLACE"
  }

  lifecycle {
    ignore_changes = [target_size]
  }
}

resource "google_compute_region_instance_group_manager" "workers" {
  count = local.regional ? 1 : 0

  name                             = local.mig_name
  project                          = var.project
  region                           = local.region
  distribution_policy_zones        = var.zones
  distribution_policy_target_shape = "ANY"
  base_instance_name               = "${var.cluster_name}-worker"
  target_size                      = var.target_size

  version {
    instance_template = google_compute_instance_template.workers.id
  }

  update_policy {
    type                         = "OPPORTUNISTIC"
    minimal_action               = "REPLACE"
    instance_redistribution_type = "NONE"
    max_surge_fixed              = 0
    max_unavailable_fixed        = length(var.zones)
  }

  lifecycle {
    ignore_changes = [target_size]
  }
}

resource "google_compute_instance" "driver" {
  name         = "${var.cluster_name}-driver"
  project      = var.project
  zone         = var.zones[0]
  machine_type = var.driver_machine_type
  labels       = module.common.driver_tags

  scheduling {
    provisioning_model  = "STANDARD"
    preemptible         = false
    automatic_restart   = true
    on_host_maintenance = "MIGRATE"
  }

  boot_disk {
    initialize_params {
      image = var.driver_image
      size  = 20
    }
  }

  network_interface {
    subnetwork = var.subnetwork

    dynamic "access_config" {
      for_each = var.driver_public_ip ? [1] : []
      content {}
    }
  }

  service_account {
    email  = google_service_account.driver.email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  # Keys come from ssh-keys alone: no project-wide keys, no OS Login users.
  metadata = {
    ssh-keys               = local.ssh_keys
    block-project-ssh-keys = true
    enable-oslogin         = false
    startup-script         = module.common.driver_user_data
  }

  lifecycle {
    # The driver runs the job: a driver_image family whose newest image the
    # provider does not match to the family by name would replace it at the
    # next apply. Replace it on purpose between jobs (docs/terraform.md).
    ignore_changes = [boot_disk[0].initialize_params[0].image]
  }
}
