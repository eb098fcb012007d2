# GPU workers in a VPC instance group with an autoscale manager, and a CPU
# driver instance. Workers are standard capacity, not Spot: see README.md.

module "common" {
  source = "../common"

  cluster_name       = var.cluster_name
  min_size           = var.min_size
  max_size           = var.max_size
  desired_size       = var.instance_count
  gpus_per_instance  = var.gpus_per_instance
  training_ports     = var.training_ports
  admin_ssh_cidrs    = var.admin_ssh_cidrs
  ssh_user           = var.ssh_user
  ssh_public_key     = var.ssh_public_key
  ssh_identity_file  = var.ssh_identity_file
  pip_spec           = local.pip_spec
  torch_spec         = var.torch_spec
  worker_torch_index = var.worker_torch_index
  checkpoint_root    = var.checkpoint_bucket == null ? null : "s3://${var.checkpoint_bucket}"
  checkpoint_prefix  = var.checkpoint_prefix
  training_command   = var.training_command
  setup_commands     = var.setup_commands
  driver_ip          = ibm_is_instance.driver.primary_network_interface[0].primary_ip[0].address
  tags               = var.tags

  # The IBM provider reads these through the SDK's
  # get_authenticator_from_environment("vpc"): it signs in as the trusted
  # profile via the instance metadata service, with no API key on disk.
  driver_environment = {
    VPC_AUTH_TYPE      = "vpc"
    VPC_AUTH_URL       = "https://api.metadata.cloud.ibm.com"
    VPC_IAM_PROFILE_ID = ibm_iam_trusted_profile.driver.id
  }
}

locals {
  # The s3:// checkpoint directory is read through s3fs, which the ibm extra
  # lacks: without it the run line would stop at start.
  pip_spec = coalesce(var.cloud_elastic_pip_spec, var.checkpoint_bucket == null ? "cloud-elastic[ibm]==0.1.0" : "cloud-elastic[ibm,aws]==0.1.0")
  region   = regex("^(.*)-[0-9]$", var.zone)[0]
  # IBM user tags are single strings, written key:value.
  worker_tags = [for k, v in module.common.worker_tags : "${k}:${v}"]
  driver_tags = [for k, v in module.common.driver_tags : "${k}:${v}"]
}

resource "ibm_is_ssh_key" "this" {
  name           = "${var.cluster_name}-cloud-elastic"
  public_key     = module.common.ssh_public_key
  resource_group = var.resource_group_id
  tags           = local.driver_tags
}

resource "ibm_is_instance_template" "workers" {
  name           = "${var.cluster_name}-worker"
  image          = var.gpu_image_id
  profile        = var.gpu_profile
  vpc            = var.vpc_id
  zone           = var.zone
  keys           = [ibm_is_ssh_key.this.id]
  resource_group = var.resource_group_id
  user_data      = module.common.worker_user_data

  primary_network_interface {
    subnet          = var.subnet_id
    security_groups = [ibm_is_security_group.workers.id]
  }

  # Workers need no metadata service: IBM gives no advance notice to read.
  metadata_service {
    enabled = false
  }
}

resource "ibm_is_instance_group" "workers" {
  name              = "${var.cluster_name}-workers"
  instance_template = ibm_is_instance_template.workers.id
  instance_count    = var.instance_count
  subnets           = [var.subnet_id]
  resource_group    = var.resource_group_id
  tags              = local.worker_tags

  lifecycle {
    ignore_changes = [instance_count]
  }
}

# With no policy attached the manager only holds membership within
# [min, max]; attach an ibm_is_instance_group_manager_policy to scale on a
# metric, or resize the group yourself.
resource "ibm_is_instance_group_manager" "workers" {
  name           = "${var.cluster_name}-workers"
  instance_group = ibm_is_instance_group.workers.id
  manager_type   = "autoscale"
  enable_manager = true
  # An empty group cannot train; the manager keeps at least one member.
  min_membership_count = max(1, var.min_size)
  max_membership_count = var.max_size
  aggregation_window   = 120
  cooldown             = 300
}

resource "ibm_is_instance" "driver" {
  name           = "${var.cluster_name}-driver"
  image          = var.driver_image_id
  profile        = var.driver_profile
  vpc            = var.vpc_id
  zone           = var.zone
  keys           = [ibm_is_ssh_key.this.id]
  resource_group = var.resource_group_id
  user_data      = module.common.driver_user_data
  tags           = local.driver_tags

  primary_network_interface {
    subnet          = var.subnet_id
    security_groups = [ibm_is_security_group.driver.id]
  }

  # The driver authenticates as its trusted profile through the metadata
  # service (see driver_environment above), so no API key sits on its disk.
  metadata_service {
    enabled            = true
    protocol           = "https"
    response_hop_limit = 1
  }

  default_trusted_profile_target    = ibm_iam_trusted_profile.driver.id
  default_trusted_profile_auto_link = true

  lifecycle {
    # The driver runs the job: applying a new image or new user data (any
    # bootstrap setting) would reimage or replace it and kill the job, while
    # first-boot user data would not run again anyway. Replace it on purpose
    # between jobs (docs/terraform.md).
    ignore_changes = [image, user_data]
  }
}

resource "ibm_is_floating_ip" "driver" {
  count = var.driver_public_ip ? 1 : 0

  name           = "${var.cluster_name}-driver"
  target         = ibm_is_instance.driver.primary_network_interface[0].id
  resource_group = var.resource_group_id
  tags           = local.driver_tags
}
