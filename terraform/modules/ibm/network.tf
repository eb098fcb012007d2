# Inbound, and nothing else: the driver reaches the workers on SSH; workers
# reach each other and the driver on the training ports; optionally admins
# reach the driver on SSH. VPC security groups deny what they do not allow.

resource "ibm_is_security_group" "workers" {
  name           = "${var.cluster_name}-workers"
  vpc            = var.vpc_id
  resource_group = var.resource_group_id
  tags           = local.worker_tags
}

resource "ibm_is_security_group" "driver" {
  name           = "${var.cluster_name}-driver"
  vpc            = var.vpc_id
  resource_group = var.resource_group_id
  tags           = local.driver_tags
}

resource "ibm_is_security_group_rule" "workers_ssh_from_driver" {
  group     = ibm_is_security_group.workers.id
  direction = "inbound"
  remote    = ibm_is_security_group.driver.id

  tcp {
    port_min = 22
    port_max = 22
  }
}

resource "ibm_is_security_group_rule" "workers_training_from_workers" {
  group     = ibm_is_security_group.workers.id
  direction = "inbound"
  remote    = ibm_is_security_group.workers.id

  tcp {
    port_min = module.common.training_ports.from
    port_max = module.common.training_ports.to
  }
}

resource "ibm_is_security_group_rule" "driver_training_from_workers" {
  group     = ibm_is_security_group.driver.id
  direction = "inbound"
  remote    = ibm_is_security_group.workers.id

  tcp {
    port_min = module.common.training_ports.from
    port_max = module.common.training_ports.to
  }
}

resource "ibm_is_security_group_rule" "driver_ssh_from_admins" {
  for_each = toset(module.common.admin_ssh_cidrs)

  group     = ibm_is_security_group.driver.id
  direction = "inbound"
  remote    = each.value

  tcp {
    port_min = 22
    port_max = 22
  }
}

resource "ibm_is_security_group_rule" "outbound" {
  for_each = {
    workers = ibm_is_security_group.workers.id
    driver  = ibm_is_security_group.driver.id
  }

  group     = each.value
  direction = "outbound"
  remote    = "0.0.0.0/0"
}
