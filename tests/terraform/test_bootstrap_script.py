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
# pip fails, printing pip-error, until pip-works exists; the venv's python
# answers torch.cuda.is_available() from the file cuda.
STUB = """#!/bin/bash
echo "$(basename "$0") $*" >> "$STUB_ROOT/calls"
case "$(basename "$0")" in
  pip) [ -e "$STUB_ROOT/pip-works" ] || { cat "$STUB_ROOT/pip-error" 2>/dev/null; exit 1; } ;;
  python) case "$*" in *is_available*) [ "$(cat "$STUB_ROOT/cuda" 2>/dev/null)" = yes ] ;; *) echo 13.0 ;; esac ;;
  python3) mkdir -p "$STUB_ROOT/opt/bin" && ln -sf "$STUB_ROOT/bin/pip" "$STUB_ROOT/opt/bin/pip"
           ln -sf "$STUB_ROOT/bin/python" "$STUB_ROOT/opt/bin/python" ;;
esac
"""
# What pip prints when PyPI cannot be reached, and when the pin names no release.
NETWORK_DOWN = ("WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection "
                "broken by 'NewConnectionError(\"Failed to establish a new connection: [Errno -3] Temporary failure in "
                "name resolution\")': /simple/torch/\n"
                "ERROR: Could not find a version that satisfies the requirement torch==2.13.0 (from versions: none)\n")
NO_SUCH_RELEASE = ("ERROR: Could not find a version that satisfies the requirement torch==2.13.0 (from versions: 2.11.0, "
                   "2.12.0)\nERROR: No matching distribution found for torch==2.13.0\n")
VARS = {
    "cluster_name": "demo",
    "ssh_user": "ubuntu",
    "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKmockmockmockmockmockmockmockmockmockmockmo demo",
    "pip_spec": "cloud-elastic[aws]==0.1.0",
    "driver_ip": "10.0.1.10",
}


# The training code, fetched at boot (a stub git writes train/train.py where it runs).
SETUP = "git clone https://github.com/you/train.git train"


def render(initialised, terraform, **extra: str) -> dict[str, str]:
    workdir = initialised("modules/common")
    args = [f"-var={k}={v}" for k, v in {**VARS, **extra}.items()]
    out = {}
    for role in ("worker", "driver"):
        result = subprocess.run(
            [terraform.binary, "console", *args], input=f"jsonencode(local.{role}_user_data)\n", cwd=workdir,
            env=terraform.env(), capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stderr
        out[role] = json.loads(json.loads(result.stdout))
    return out


@pytest.fixture(scope="module")
def rendered(initialised, terraform) -> dict[str, str]:
    return render(initialised, terraform)


@pytest.fixture(scope="module")
def rendered_with_setup(initialised, terraform) -> dict[str, str]:
    return render(initialised, terraform, setup_commands=SETUP)


class Host:
    """A scratch root the script's system paths point into, with stub commands first on PATH."""

    def __init__(self, root: Path, script: str):
        self.root = root
        (root / "bin").mkdir()
        for name in (*STUBBED, "python"):
            (root / "bin" / name).write_text(STUB)
            (root / "bin" / name).chmod(0o755)
        for d in ("etc/sysctl.d", "etc/ssh/sshd_config.d", "etc/systemd/system", "log"):
            (root / d).mkdir(parents=True)
        (root / "etc/environment").write_text('PATH="/usr/bin"\n')
        for old, new in (("/var/lib/", "var/lib/"), ("/var/log/", "log/"), ("/etc/", "etc/"),
                         ("/opt/cloud-elastic", "opt"), ("/usr/local/bin", "bin")):
            script = script.replace(old, f"{root}/{new}")
        (root / "bootstrap.sh").write_text(script)

    def stub(self, name: str, body: str) -> None:
        """Replace (or add) the command ``name`` with a script that logs its call, then runs ``body``."""
        path = self.root / "bin" / name
        path.write_text(f'#!/bin/bash\necho "{name} $*" >> "$STUB_ROOT/calls"\n{body}\n')
        path.chmod(0o755)

    def boot(self) -> tuple[int, list[str]]:
        """Run the script once, as a boot would; its exit status and the stubbed commands it ran."""
        (self.root / "calls").write_text("")
        env = {**os.environ, "PATH": f"{self.root}/bin:{os.environ['PATH']}", "STUB_ROOT": str(self.root)}
        result = subprocess.run([shutil.which("bash"), str(self.root / "bootstrap.sh")], env=env, capture_output=True,
                                text=True, timeout=60)
        self.output = result.stdout + result.stderr
        return result.returncode, (self.root / "calls").read_text().splitlines()


def test_a_worker_whose_network_step_keeps_failing_powers_off_after_retrying(rendered, tmp_path):
    """A fresh VM may reach PyPI where this one could not: the group replaces a worker that powered off."""
    (tmp_path / "pip-error").write_text(NETWORK_DOWN)
    host = Host(tmp_path, rendered["worker"])
    rc, calls = host.boot()
    assert rc != 0
    pip = [c for c in calls if c.startswith("pip ")]
    assert len(pip) > 1 and pip[0] == pip[-1] == "pip install --quiet torch==2.13.0"  # retried, then given up
    assert calls[-1] == "shutdown -h now"
    assert "network step '" in host.output and "pip install --quiet torch==2.13.0' still failing after its retries (exit 1); " \
        "powering off so that the group replaces this VM" in host.output
    assert not (tmp_path / "var/lib/cloud-elastic/bootstrap-done").exists()


@pytest.mark.parametrize("failure", ["no such release", "no python3"])
def test_a_worker_whose_set_up_fails_the_same_way_on_any_vm_stays_up_and_says_so(rendered, tmp_path, failure):
    """Powered off, it would be replaced by an identical VM failing identically, forever, billed."""
    host = Host(tmp_path, rendered["worker"])
    if failure == "no such release":
        (tmp_path / "pip-error").write_text(NO_SUCH_RELEASE)
        step = "pip install --quiet torch==2.13.0' (exit 1)"
    else:
        host.stub("python3", "echo 'python3: command not found' >&2; exit 127")
        step = "python3 -m venv"
    rc, calls = host.boot()
    assert rc != 0
    assert not any(c.startswith("shutdown") for c in calls)
    [line] = [line for line in host.output.splitlines() if "bootstrap failed" in line]
    assert step in line and "would fail the same way on a fresh VM; staying up" in line
    assert not (tmp_path / "var/lib/cloud-elastic/bootstrap-done").exists()


def test_a_worker_with_a_socket_activated_sshd_sets_up(rendered, tmp_path):
    """Ubuntu 22.10+ starts ssh.service at the first connection: at first boot it is not running, and reload fails."""
    host = Host(tmp_path, rendered["worker"])
    (tmp_path / "pip-works").touch()
    host.stub("systemctl", 'case "$1" in reload|restart) echo "Job for $2 failed: not active" >&2; exit 1 ;; esac')
    rc, calls = host.boot()
    assert rc == 0, host.output
    assert not any(c.startswith("shutdown") for c in calls)
    assert (tmp_path / "var/lib/cloud-elastic/bootstrap-done").exists()
    assert "MaxStartups 64:30:256" in (tmp_path / "etc/ssh/sshd_config.d/90-cloud-elastic.conf").read_text()


@pytest.mark.parametrize("cuda", ["yes", "no"])
def test_a_worker_whose_torch_cannot_use_its_gpus_says_so_once_and_stays_in(rendered, tmp_path, cuda):
    """A torch built for a newer CUDA than the image's driver sees no GPU; the log must say why."""
    host = Host(tmp_path, rendered["worker"])
    (tmp_path / "pip-works").touch()
    (tmp_path / "cuda").write_text(cuda)
    host.stub("nvidia-smi", "echo 550.54.15")
    rc, calls = host.boot()
    assert rc == 0 and not any(c.startswith("shutdown") for c in calls)
    errors = [line for line in host.output.splitlines() if "ERROR" in line]
    if cuda == "yes":
        assert errors == []
    else:
        assert len(errors) == 1
        assert "torch==2.13.0 cannot use this VM's GPUs (NVIDIA driver 550.54.15, torch built for CUDA 13.0)" in errors[0]
        assert "worker_torch_index" in errors[0]


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


def _with_home(host: Host, user_after_s: int = 0) -> Path:
    """The SSH user's home; runuser runs its command there as this test's user, HOME set as runuser sets it.

    The user exists once ``user_after_s`` seconds have passed on the clock that
    the stubbed sleep advances (GCP's guest agent creating it meanwhile); never
    with a negative value.
    """
    home = host.root / "home"
    home.mkdir()
    exists = f'[ {user_after_s} -ge 0 ] && [ "$(cat "$STUB_ROOT/clock" 2>/dev/null || echo 0)" -ge {user_after_s} ]'
    host.stub("sleep", 'echo $(( $(cat "$STUB_ROOT/clock" 2>/dev/null || echo 0) + $1 )) > "$STUB_ROOT/clock"')
    host.stub("getent", f'[ "$1 $2" = "passwd ubuntu" ] && {exists} && echo "ubuntu:x:1000:1000::{home}:/bin/bash" || exit 2')
    host.stub("runuser", f'{exists} || {{ echo "runuser: user ubuntu does not exist" >&2; exit 1; }}\n'
                         f'while [ "$1" != -- ]; do shift; done; shift; HOME={home} exec "$@"')
    host.stub("git", "mkdir -p train && echo 'print(1)' > train/train.py")
    return home


@pytest.mark.parametrize("role", ["worker", "driver"])
def test_setup_commands_put_the_code_in_the_home_directory_the_run_line_starts_in(rendered_with_setup, tmp_path, role):
    """Workers start in the driver's directory: the code must be at that path on every VM, a replacement too."""
    host = Host(tmp_path, rendered_with_setup[role])
    home = _with_home(host)
    (tmp_path / "pip-works").touch()
    rc, calls = host.boot()
    assert rc == 0, host.output
    assert (home / "train/train.py").read_text() == "print(1)\n"
    runuser = [c for c in calls if c.startswith("runuser ")]
    assert runuser == [f"runuser -u ubuntu -- bash -c cd && exec bash -eo pipefail {tmp_path}/var/lib/cloud-elastic/setup-commands.sh"]
    # Last: after cloud-elastic is installed, and the marker only once they succeeded.
    assert calls.index(runuser[0]) > calls.index("pip install --quiet cloud-elastic[aws]==0.1.0")
    assert calls[calls.index(runuser[0]) + 1] == SETUP
    assert (tmp_path / "var/lib/cloud-elastic/bootstrap-done").exists()


@pytest.mark.parametrize("error, powers_off", [("fatal: unable to access 'https://github.com/you/train.git/': "
                                                 "Could not resolve host: github.com", True),
                                                ("fatal: repository 'https://github.com/you/train.git/' not found", False)])
def test_a_worker_whose_setup_commands_fail_is_handled_like_a_failed_install(rendered_with_setup, tmp_path, error,
                                                                             powers_off):
    """A worker without the code would fail every launch: a network error powers it off, anything else says so."""
    host = Host(tmp_path, rendered_with_setup["worker"])
    _with_home(host)
    (tmp_path / "pip-works").touch()
    host.stub("git", f'echo "{error}" >&2; exit 128')
    rc, calls = host.boot()
    assert rc != 0
    assert len([c for c in calls if c.startswith("runuser ")]) == 5
    assert (calls[-1] == "shutdown -h now") is powers_off
    said = "network step 'setup_commands' still failing" if powers_off else "'setup_commands' (exit 1) would fail the same"
    assert said in host.output
    assert not (tmp_path / "var/lib/cloud-elastic/bootstrap-done").exists()


@pytest.mark.parametrize("role", ["worker", "driver"])
def test_setup_commands_wait_for_a_user_the_guest_agent_creates_late(rendered_with_setup, tmp_path, role):
    """On GCP the guest agent creates ssh_user from the ssh-keys metadata while the script runs: later than the
    retries of a failed step would wait (150 s) must still set up, not leave the VM without its code."""
    host = Host(tmp_path, rendered_with_setup[role])
    home = _with_home(host, user_after_s=200)
    (tmp_path / "pip-works").touch()
    rc, calls = host.boot()
    assert rc == 0, host.output
    assert (home / "train/train.py").read_text() == "print(1)\n"
    assert len([c for c in calls if c.startswith("runuser ")]) == 1
    assert (tmp_path / "var/lib/cloud-elastic/bootstrap-done").exists()


def test_a_worker_whose_ssh_user_never_appears_says_so_and_stays_up(rendered_with_setup, tmp_path):
    """A wrong ssh_user waits a bounded time, then names the user in one line instead of failing the set-up 5 times."""
    host = Host(tmp_path, rendered_with_setup["worker"])
    _with_home(host, user_after_s=-1)
    (tmp_path / "pip-works").touch()
    rc, calls = host.boot()
    assert rc != 0
    assert not any(c.startswith(("runuser", "shutdown")) for c in calls)
    assert int((tmp_path / "clock").read_text()) == 600
    [line] = [line for line in host.output.splitlines() if "still missing" in line]
    assert "user ubuntu (ssh_user) or its home directory still missing after 600 s" in line
    [failed] = [line for line in host.output.splitlines() if "bootstrap failed" in line]
    assert "'wait for user ubuntu' (exit 1)" in failed and "staying up" in failed
    assert not (tmp_path / "var/lib/cloud-elastic/bootstrap-done").exists()
