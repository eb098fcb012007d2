# Inbound, and nothing else: the driver reaches the workers on SSH; workers
# reach each other and the driver on the training ports; optionally admins
# reach the driver on SSH. Rules match service accounts, which (unlike
# network tags) only an IAM grant can put on a VM. A low-priority deny keeps
# wider rules of the network (such as the default network's allow-ssh) off
# the cluster.

resource "google_compute_firewall" "workers_ssh_from_driver" {
  name                    = "${var.cluster_name}-workers-ssh-from-driver"
  project                 = var.project
  network                 = var.network
  direction               = "INGRESS"
  priority                = 1000
  source_service_accounts = [google_service_account.driver.email]
  target_service_accounts = [google_service_account.workers.email]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

resource "google_compute_firewall" "training_from_workers" {
  name                    = "${var.cluster_name}-training-from-workers"
  project                 = var.project
  network                 = var.network
  direction               = "INGRESS"
  priority                = 1000
  source_service_accounts = [google_service_account.workers.email]
  target_service_accounts = [google_service_account.workers.email, google_service_account.driver.email]

  allow {
    protocol = "tcp"
    ports    = ["${module.common.training_ports.from}-${module.common.training_ports.to}"]
  }
}

resource "google_compute_firewall" "driver_ssh_from_admins" {
  count = length(module.common.admin_ssh_cidrs) > 0 ? 1 : 0

  name                    = "${var.cluster_name}-driver-ssh-from-admins"
  project                 = var.project
  network                 = var.network
  direction               = "INGRESS"
  priority                = 1000
  source_ranges           = module.common.admin_ssh_cidrs
  target_service_accounts = [google_service_account.driver.email]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

resource "google_compute_firewall" "deny_other_inbound" {
  name                    = "${var.cluster_name}-deny-other-inbound"
  project                 = var.project
  network                 = var.network
  direction               = "INGRESS"
  priority                = 65000
  source_ranges           = ["0.0.0.0/0"]
  target_service_accounts = [google_service_account.workers.email, google_service_account.driver.email]

  deny {
    protocol = "all"
  }
}
