"""Find a Terraform CLI and an offline provider mirror, and run Terraform offline.

Nothing here downloads: ``init`` reads providers from the mirror alone
(``-plugin-dir``), the checkpoint (version check) call is disabled, and the
user's CLI configuration is replaced by an empty one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Where the offline provider mirror is looked for (a -plugin-dir layout).
PLUGIN_DIR_ENV = "CLOUD_ELASTIC_TF_PLUGIN_DIR"
DEFAULT_PLUGIN_DIR = "/opt/tf-plugins"
#: Comma list of what must be present, failing instead of skipping when it is
#: not: provider sources (``hashicorp/aws``), ``checkov``, or ``all``. Any
#: entry also requires the Terraform CLI. Under CI (``CI`` set, as the
#: Kubernetes tests read it) checkov is required anyway: ``./dev test``
#: installs it from PyPI, so its absence is a broken set-up, not a machine
#: without it. The Terraform CLI comes with the machine or not (no registry
#: this project installs from carries it): without it its tests skip.
REQUIRE_ENV = "CLOUD_ELASTIC_REQUIRE_TERRAFORM"


@dataclass(frozen=True)
class Terraform:
    """A Terraform binary and the environment that keeps it offline."""

    binary: str
    config_dir: Path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
        config = self.config_dir / "terraformrc"
        if not config.exists():
            config.write_text("disable_checkpoint = true\n")
        env.update(
            TF_CLI_CONFIG_FILE=str(config),
            CHECKPOINT_DISABLE="1",
            TF_IN_AUTOMATION="1",
            TF_INPUT="0",
            # Terraform and the AWS provider (started afresh for each run block of `terraform test`: 16 times
            # for modules/aws) spend much of their CPU collecting garbage while they build the provider's
            # schema. A larger heap between collections: 10 s of CPU to 7.7 s for modules/aws's tests,
            # at 0.4 GB of memory instead of 0.33.
            GOGC="400",
        )
        return env

    def run(self, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args, "-no-color"], cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=timeout
        )

    def platform(self) -> str:
        out = self.run("version", "-json", cwd=self.config_dir)
        return json.loads(out.stdout)["platform"]


def find_cli(config_dir: Path) -> Terraform | None:
    binary = shutil.which("terraform")
    return Terraform(binary, config_dir) if binary else None


def find_mirror(platform: str, provider: str = "registry.terraform.io/hashicorp/aws") -> Path | None:
    """The plugin directory if it holds ``provider`` for ``platform``, else None."""
    root = Path(os.environ.get(PLUGIN_DIR_ENV, DEFAULT_PLUGIN_DIR))
    if any(root.glob(f"{provider}/*/{platform}")):
        return root
    return None


def required(what: str = "cli") -> bool:
    """Whether a missing ``what`` (``cli``, ``checkov`` or a provider source) should fail rather than skip."""
    wanted = {w.strip() for w in os.environ.get(REQUIRE_ENV, "").split(",")} - {"", "0"}
    if what.startswith("registry.terraform.io/"):
        what = what[len("registry.terraform.io/"):]
    return "all" in wanted or what in wanted or (what == "cli" and bool(wanted)) or \
        (what == "checkov" and bool(os.environ.get("CI")))
