# The driver's trusted profile may view VPC infrastructure in the cluster's
# resource group: the instance group's memberships and the member instances'
# addresses. Viewer is IBM's read-only platform role; nothing else is granted.
# Workers get no profile.

resource "ibm_iam_trusted_profile" "driver" {
  name        = "${var.cluster_name}-driver"
  description = "cloud-elastic driver of ${var.cluster_name}: reads its instance group"
}

resource "ibm_iam_trusted_profile_policy" "driver_discovery" {
  profile_id  = ibm_iam_trusted_profile.driver.id
  description = "Read the cloud-elastic instance group and its instances"
  roles       = ["Viewer"]

  resources {
    service           = "is"
    resource_group_id = var.resource_group_id
  }
}
