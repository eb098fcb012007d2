"""The rendered first-boot script, run by bash against stub commands in a scratch root.

Terraform renders ``modules/common``'s bootstrap for a worker and a driver;
the system paths are moved under a temporary directory and every command
that would change the machine (apt-get, pip, systemctl, shutdown...) is a
stub that records its call. Skips without a Terraform CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.terraform, pytest.mark.timeout(120)]

STUBBED = ("sysctl", "systemctl", "apt-get", "python3", "pip", "shutdown", "sleep")
STUB = """#!/bin/bash
echo "$(basename "$0") $*" >> "$STUB_ROOT/calls"
case "$(basename "$0")" in
  pip) [ -e "$STUB_ROOT/pip-works" ] || exit 1 ;;
  python3) mkdir -p "$STUB_ROOT/opt/bin" && ln -sf "$STUB_ROOT/bin/pip" "$STUB_ROOT/opt/bin/pip" ;;
esac
"""
VARS = {
    "cluster_name": "demo",
    "ssh_user": "ubuntu",
    "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKmockmockmockmockmockmockmockmockmockmockmo demo",
    "pip_spec": "cloud-elastic[aws]==0.1.0",
    "driver_ip": "10.0.1.10",
}


@pytest.fixture(scope="module")
def rendered(initialised, terraform) -> dict[str, str]:
    workdir = initialised("modules/common")
    args = [f"-var={k}={v}" for k, v in VARS.items()]
    out = {}
    for role in ("worker", "driver"):
        result = subprocess.run(
            [terraform.binary, "console", *args], input=f"jsonencode(local.{role}_user_data)\n", cwd=workdir,
            env=terraform.env(), capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stderr
        out[role] = json.loads(json.loads(result.stdout))
    return out


class Host:
    """A scratch root the script's system paths point into, with stub commands first on PATH."""

    def __init__(self, root: Path, script: str):
        self.root = root
        (root / "bin").mkdir()
        for name in STUBBED:
            (root / "bin" / name).write_text(STUB)
            (root / "bin" / name).chmod(0o755)
        for d in ("etc/sysctl.d", "etc/ssh/sshd_config.d", "etc/systemd/system", "log"):
            (root / d).mkdir(parents=True)
        (root / "etc/environment").write_text('PATH="/usr/bin"\n')
        for old, new in (("/var/lib/", "var/lib/"), ("/var/log/", "log/"), ("/etc/", "etc/"),
                         ("/opt/cloud-elastic", "opt"), ("/usr/local/bin", "bin")):
            script = script.replace(old, f"{root}/{new}")
        (root / "bootstrap.sh").write_text(script)

    def boot(self) -> tuple[int, list[str]]:
        """Run the script once, as a boot would; its exit status and the stubbed commands it ran."""
        (self.root / "calls").write_text("")
        env = {**os.environ, "PATH": f"{self.root}/bin:{os.environ['PATH']}", "STUB_ROOT": str(self.root)}
        rc = subprocess.run([shutil.which("bash"), str(self.root / "bootstrap.sh")], env=env, capture_output=True,
                            timeout=60).returncode
        return rc, (self.root / "calls").read_text().splitlines()


def test_a_worker_whose_install_keeps_failing_powers_off_after_retrying(rendered, tmp_path):
    rc, calls = Host(tmp_path, rendered["worker"]).boot()
    assert rc != 0
    pip = [c for c in calls if c.startswith("pip ")]
    assert len(pip) > 1 and pip[0] == pip[-1] == "pip install --quiet torch==2.13.0"  # retried, then given up
    assert calls[-1] == "shutdown -h now"
    assert not (tmp_path / "var/lib/cloud-elastic/bootstrap-done").exists()


def test_a_driver_whose_install_fails_stays_up_and_tries_again_at_the_next_boot(rendered, tmp_path):
    host = Host(tmp_path, rendered["driver"])
    rc, calls = host.boot()
    assert rc != 0 and not any(c.startswith("shutdown") for c in calls)
    (tmp_path / "pip-works").touch()
    rc, calls = host.boot()
    assert rc == 0 and "systemctl enable cloud-elastic-driver.service" in calls


@pytest.mark.parametrize("role", ["worker", "driver"])
def test_the_bootstrap_runs_at_the_first_boot_only(rendered, tmp_path, role):
    """GCP runs startup-script metadata at every boot: a later boot must not re-enable a finished job's driver."""
    host = Host(tmp_path, rendered[role])
    (tmp_path / "pip-works").touch()
    rc, calls = host.boot()
    assert rc == 0
    assert "pip install --quiet cloud-elastic[aws]==0.1.0" in calls
    assert calls.index("pip install --quiet cloud-elastic[aws]==0.1.0") > calls.index(
        next(c for c in calls if c.startswith("pip install --quiet") and "torch==2.13.0" in c))
    rc, calls = host.boot()
    assert rc == 0 and calls == []
