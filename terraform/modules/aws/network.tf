# Inbound, and nothing else: the driver reaches the workers on SSH; workers
# reach each other and the driver on the training ports; optionally admins
# reach the driver on SSH. Outbound is open (cloud APIs, pip, datasets).

resource "aws_security_group" "workers" {
  name        = "${var.cluster_name}-workers"
  description = "cloud-elastic GPU workers of ${var.cluster_name}"
  vpc_id      = var.vpc_id
  tags        = module.common.worker_tags
}

resource "aws_security_group" "driver" {
  name        = "${var.cluster_name}-driver"
  description = "cloud-elastic driver of ${var.cluster_name}"
  vpc_id      = var.vpc_id
  tags        = module.common.driver_tags
}

resource "aws_vpc_security_group_ingress_rule" "workers_ssh_from_driver" {
  security_group_id            = aws_security_group.workers.id
  description                  = "SSH from the driver"
  ip_protocol                  = "tcp"
  from_port                    = 22
  to_port                      = 22
  referenced_security_group_id = aws_security_group.driver.id
  tags                         = module.common.worker_tags
}

resource "aws_vpc_security_group_ingress_rule" "workers_training_from_workers" {
  security_group_id            = aws_security_group.workers.id
  description                  = "Gloo/NCCL between workers"
  ip_protocol                  = "tcp"
  from_port                    = module.common.training_ports.from
  to_port                      = module.common.training_ports.to
  referenced_security_group_id = aws_security_group.workers.id
  tags                         = module.common.worker_tags
}

resource "aws_vpc_security_group_ingress_rule" "driver_training_from_workers" {
  security_group_id            = aws_security_group.driver.id
  description                  = "TCPStore and control plane from workers"
  ip_protocol                  = "tcp"
  from_port                    = module.common.training_ports.from
  to_port                      = module.common.training_ports.to
  referenced_security_group_id = aws_security_group.workers.id
  tags                         = module.common.driver_tags
}

resource "aws_vpc_security_group_ingress_rule" "driver_ssh_from_admins" {
  for_each = toset(module.common.admin_ssh_cidrs)

  security_group_id = aws_security_group.driver.id
  description       = "SSH from an admin network"
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
  cidr_ipv4         = each.value
  tags              = module.common.driver_tags
}

resource "aws_vpc_security_group_egress_rule" "workers_out" {
  security_group_id = aws_security_group.workers.id
  description       = "Outbound: cloud APIs, package mirrors, datasets"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
  tags              = module.common.worker_tags
}

resource "aws_vpc_security_group_egress_rule" "driver_out" {
  security_group_id = aws_security_group.driver.id
  description       = "Outbound: cloud APIs, package mirrors, workers"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
  tags              = module.common.driver_tags
}
