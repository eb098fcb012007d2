"""The driver VM's bootstrap runs the driver under systemd, so a crash or a reboot resumes the job.

Structural checks of ``terraform/modules/common/node-init.sh.tftpl`` (the one
bootstrap every cloud module renders for its driver VM), and of the modules'
use of it; ``terraform test`` checks the rendered output where Terraform runs.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2] / "terraform" / "modules"
TEMPLATE = (ROOT / "common" / "node-init.sh.tftpl").read_text()


def _driver_branch() -> str:
    m = re.search(r'%\{ if role == "driver" ~\}(.*?)%\{ endif ~\}', TEMPLATE, re.S)
    assert m, "no driver-only section in the bootstrap"
    return m.group(1)


def _unit() -> configparser.ConfigParser:
    m = re.search(r"cat > /etc/systemd/system/cloud-elastic-driver\.service <<'UNIT'\n(.*?)\nUNIT\n", _driver_branch(), re.S)
    assert m, "the driver section writes no cloud-elastic-driver.service"
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read_string(m.group(1))
    return unit


def test_the_unit_restarts_the_driver_on_failure_but_not_on_a_config_error():
    service = _unit()["Service"]
    assert service["Restart"] == "on-failure"
    assert float(service["RestartSec"]) > 0
    assert service["RestartPreventExitStatus"] == "2"
    assert service["ExecStart"] == "/usr/local/bin/cloud-elastic-driver"


def test_the_unit_starts_at_boot_as_the_ssh_user_and_lets_the_driver_stop_its_workers():
    unit = _unit()
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert unit["Service"]["User"] == "${ssh_user}"  # whose key reaches the workers
    assert unit["Service"]["KillMode"] == "mixed"
    assert int(unit["Service"]["TimeoutStopSec"]) >= 30
    assert unit["Unit"]["ConditionPathExists"] == "/etc/cloud-elastic/run"
    assert "systemctl enable cloud-elastic-driver.service" in _driver_branch()


def test_a_succeeded_job_is_not_started_again_at_boot():
    post = _unit()["Service"]["ExecStopPost"]
    assert post.startswith("+") and "systemctl disable cloud-elastic-driver" in post and "EXIT_STATUS" in post


def test_only_the_driver_gets_the_service():
    outside = TEMPLATE.replace(_driver_branch(), "")
    assert "cloud-elastic-driver" not in outside


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure", "ibm"])
def test_every_cloud_boots_its_driver_vm_with_the_driver_bootstrap(cloud):
    main = (ROOT / cloud / "main.tf").read_text()
    assert "module.common.driver_user_data" in main
