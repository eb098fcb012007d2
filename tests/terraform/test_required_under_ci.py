"""Under CI a missing Terraform CLI or checkov fails the run instead of skipping every test that needs it; a missing
provider mirror still skips (this machine's mirror holds only hashicorp/aws), unless asked for by name."""

from __future__ import annotations

import pytest

from .conftest import unavailable
from .tfcli import REQUIRE_ENV, required


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_a_missing_cli_or_checkov_fails_and_a_missing_provider_mirror_skips(monkeypatch, ci):
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.setenv("CI", ci)
    assert required("cli") and required("checkov")
    assert not required("registry.terraform.io/hashicorp/google")
    with pytest.raises(pytest.fail.Exception, match="no terraform CLI on PATH"):
        unavailable("no terraform CLI on PATH")
    with pytest.raises(pytest.skip.Exception, match="no offline mirror"):
        unavailable("no offline mirror of google", "registry.terraform.io/hashicorp/google")


def test_outside_ci_they_skip_unless_asked_for(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    assert not required("cli") and not required("checkov")
    monkeypatch.setenv(REQUIRE_ENV, "hashicorp/google")
    assert required("cli") and required("registry.terraform.io/hashicorp/google") and not required("checkov")
