"""Terraform itself, offline: fmt everywhere; init, validate and mocked `terraform test` where a provider mirror exists.

The CLI and the mirror are detected (tfcli.py), never assumed: without them
these tests skip and say why. Everything runs in a temporary copy of the
tree, so no .terraform directory or lock file lands in the repository.
"""

from __future__ import annotations

import json
import re

import pytest

from cloud_elastic.providers.tags import CLUSTER_TAG, ROLE_DRIVER, ROLE_TAG, ROLE_WORKER

from .conftest import copy_tree, init
from .hcl import CLOUDS, SHARED, TERRAFORM_DIR

pytestmark = pytest.mark.terraform

# terraform test files take the tag names from the package, not from a copy.
TAG_VARS = {
    "expected_role_tag": ROLE_TAG,
    "expected_cluster_tag": CLUSTER_TAG,
    "expected_role_worker": ROLE_WORKER,
    "expected_role_driver": ROLE_DRIVER,
}
TESTED_DIRS = ("modules/common", "modules/aws", "examples/aws-multi-source")


def terraform_test(terraform, workdir):
    # Values of variables the module does not declare are read as HCL, hence json.dumps.
    args = [f"-var={name}={json.dumps(value)}" for name, value in TAG_VARS.items()]
    return terraform.run("test", *args, cwd=workdir, timeout=150)


@pytest.mark.timeout(60)
def test_fmt(terraform):
    result = terraform.run("fmt", "-check", "-recursive", "-diff", str(TERRAFORM_DIR), cwd=TERRAFORM_DIR)
    assert result.returncode == 0, f"terraform fmt would change:\n{result.stdout}{result.stderr}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rel", [*(f"modules/{n}" for n in (*CLOUDS, SHARED)), *(f"examples/{c}" for c in CLOUDS)])
def test_validate(initialised, terraform, rel):
    result = terraform.run("validate", cwd=initialised(rel))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(180)
@pytest.mark.parametrize("rel", TESTED_DIRS)
def test_terraform_test_with_mocked_provider(initialised, terraform, rel):
    workdir = initialised(rel)
    runs = sum(len(re.findall(r'^run "', f.read_text(), re.M)) for f in (workdir / "tests").glob("*.tftest.hcl"))
    assert runs > 0, f"{rel} has no terraform test runs"
    result = terraform_test(terraform, workdir)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"Success! {runs} passed, 0 failed." in output, output


@pytest.mark.timeout(180)
def test_terraform_test_fails_when_imdsv2_is_dropped(terraform, plugin_dir_for, tmp_path):
    """The mocked-provider assertions can fail: a copy with IMDSv1 allowed on the workers must not pass."""
    copy = copy_tree(tmp_path)
    main = copy.root / "modules/aws/main.tf"
    text = main.read_text()
    assert text.count('http_tokens                 = "required"') == 2
    main.write_text(text.replace('http_tokens                 = "required"', 'http_tokens                 = "optional"', 1))
    init(terraform, plugin_dir_for(copy.root / "modules/aws"), copy.root / "modules/aws")
    result = terraform_test(terraform, copy.root / "modules/aws")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert re.search(r'run "plan"\.\.\. fail', output) and "workers must require IMDSv2" in output, output
