# Checkpoint storage (checkpoint_container): the driver writes the job record
# and rank 0 writes the checkpoints, and every worker reads the job record
# before it trains, so the driver and the workers may read, write, list and
# delete the container's blobs (Storage Blob Data Contributor on that
# container only). The container is the user's: nothing here creates it.
#
# The workers get a user-assigned identity for this alone. The driver's
# system-assigned identity gets the role directly: a second identity on the
# driver would need AZURE_CLIENT_ID, which would switch its discovery
# credential (DefaultAzureCredential) to the identity without the discovery
# role. adlfs finds the account in AZURE_STORAGE_ACCOUNT_NAME (main.tf).

locals {
  checkpoints        = var.checkpoint_container != null
  checkpoint_account = local.checkpoints ? regex("[^/]+$", var.checkpoint_container.storage_account_id) : null
  checkpoint_scope   = local.checkpoints ? "${var.checkpoint_container.storage_account_id}/blobServices/default/containers/${var.checkpoint_container.name}" : null
}

resource "azurerm_user_assigned_identity" "workers" {
  count = local.checkpoints ? 1 : 0

  name                = "${var.cluster_name}-workers"
  resource_group_name = azurerm_resource_group.this.name
  location            = azurerm_resource_group.this.location
  tags                = module.common.worker_tags
}

resource "azurerm_role_assignment" "workers_checkpoints" {
  count = local.checkpoints ? 1 : 0

  scope                = local.checkpoint_scope
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = azurerm_user_assigned_identity.workers[0].principal_id
}

resource "azurerm_role_assignment" "driver_checkpoints" {
  count = local.checkpoints ? 1 : 0

  scope                = local.checkpoint_scope
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = azurerm_linux_virtual_machine.driver.identity[0].principal_id
}
