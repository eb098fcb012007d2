# Shared pieces of the four cloud modules: the discovery tags, the first-boot
# script and the cloud-independent tail of the `cloud-elastic run` line.
# No resources and no provider: it only computes values.

locals {
  # The Python discovery providers look these names up
  # (cloud_elastic/providers/tags.py); tests/terraform asserts they match.
  worker_tags = {
    "cloud-elastic-role"    = "worker"
    "cloud-elastic-cluster" = var.cluster_name
  }
  driver_tags = {
    "cloud-elastic-role"    = "driver"
    "cloud-elastic-cluster" = var.cluster_name
  }

  # Two separate values, not one map: the driver's script must not depend
  # on driver_ip, which is the driver's own address.
  worker_user_data = templatefile("${path.module}/node-init.sh.tftpl", {
    role       = "worker"
    port_from  = var.training_ports.from
    port_to    = var.training_ports.to
    ssh_user   = var.ssh_user
    driver_ip  = var.driver_ip
    pip_spec   = var.pip_spec
    torch_spec = var.torch_spec
    # "" is PyPI, whose Linux torch is a CUDA build (for the newest CUDA).
    torch_index    = var.worker_torch_index
    env            = var.worker_environment
    setup_commands = var.setup_commands
  })
  driver_user_data = templatefile("${path.module}/node-init.sh.tftpl", {
    role       = "driver"
    port_from  = var.training_ports.from
    port_to    = var.training_ports.to
    ssh_user   = var.ssh_user
    driver_ip  = ""
    pip_spec   = var.pip_spec
    torch_spec = var.torch_spec
    # The driver trains nothing: the CPU build is a tenth of the CUDA one's size.
    torch_index    = "https://download.pytorch.org/whl/cpu"
    env            = var.driver_environment
    setup_commands = var.setup_commands
  })

  checkpoint_prefix = coalesce(var.checkpoint_prefix, var.cluster_name)
  checkpoint_dir    = var.checkpoint_root == null ? null : "${var.checkpoint_root}/${local.checkpoint_prefix}"

  np     = var.desired_size * var.gpus_per_instance
  min_np = max(1, var.min_size) * var.gpus_per_instance
  max_np = var.max_size * var.gpus_per_instance
}
