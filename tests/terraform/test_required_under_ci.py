"""Under CI a missing checkov fails the run instead of skipping its scan (``./dev test`` installs it); a missing
Terraform CLI or provider mirror still skips (the machine has them or not), unless asked for by name."""

from __future__ import annotations

import pytest

from .conftest import unavailable
from .tfcli import REQUIRE_ENV, required


def test_under_ci_a_missing_checkov_fails_and_a_missing_cli_or_provider_mirror_skips(monkeypatch):
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.setenv("CI", "true")
    assert required("checkov")
    assert not required("cli") and not required("registry.terraform.io/hashicorp/google")
    with pytest.raises(pytest.fail.Exception, match="checkov is not installed"):
        unavailable("checkov is not installed", "checkov")
    with pytest.raises(pytest.skip.Exception, match="no terraform CLI on PATH"):
        unavailable("no terraform CLI on PATH")


def test_outside_ci_they_skip_unless_asked_for(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    assert not required("cli") and not required("checkov")
    monkeypatch.setenv(REQUIRE_ENV, "hashicorp/google")
    assert required("cli") and required("registry.terraform.io/hashicorp/google") and not required("checkov")
