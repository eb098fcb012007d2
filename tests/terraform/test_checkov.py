"""Security scan of terraform/ with checkov, offline, against the accepted findings in terraform/checkov-skips.json.

checkov lives in its own virtualenv (.venv-checkov, made by
scripts/setup-checkov.sh) because its HCL parser clashes with python-hcl2.
Any finding not in the skips file fails, and so does a skip that no longer
matches a finding, so the file stays an exact list with a reason for each.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from .hcl import REPO, TERRAFORM_DIR
from .conftest import unavailable

pytestmark = pytest.mark.terraform

CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
SKIPS_FILE = TERRAFORM_DIR / "checkov-skips.json"


def _skips() -> list[dict]:
    return json.loads(SKIPS_FILE.read_text())["skips"]


@lru_cache(maxsize=1)
def _scan(checkov: Path) -> dict:
    """One checkov run over terraform/ (passed and failed checks), shared by the tests below."""
    # Offline: no policy download, no mapping download, no check for a newer checkov.
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true"}
    result = subprocess.run(
        [str(checkov), "--directory", str(TERRAFORM_DIR), "--framework", "terraform", "--skip-download",
         "--compact", "--output", "json"],
        capture_output=True, text=True, timeout=150, cwd=REPO, env=env,
    )
    assert result.returncode in (0, 1), f"checkov failed to run:\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout)
    assert isinstance(report, dict), "expected one terraform report"
    assert report["summary"]["parsing_errors"] == 0, f"checkov could not parse: {report['summary']}"
    return report["results"]


def _key(finding: dict) -> tuple[str, str, str]:
    return finding["check_id"], finding["resource"], finding["file_path"]


@pytest.fixture(scope="module")
def results() -> dict:
    if not CHECKOV.exists():
        unavailable(f"checkov is not installed at {CHECKOV.relative_to(REPO)}: run scripts/setup-checkov.sh", "checkov")
    return _scan(CHECKOV)


def test_every_skip_has_a_reason_and_names_one_resource():
    for skip in _skips():
        assert set(skip) == {"check_id", "resource", "file", "reason"}, skip
        assert len(skip["reason"].split()) >= 8, f"{skip['check_id']}: give a real reason"


def test_docs_list_every_skipped_check():
    docs = (REPO / "docs" / "terraform.md").read_text()
    missing = sorted({s["check_id"] for s in _skips() if s["check_id"] not in docs})
    assert not missing, f"docs/terraform.md does not mention {missing}"


@pytest.mark.timeout(180)
def test_no_new_findings(results):
    accepted = {(s["check_id"], s["resource"], s["file"]) for s in _skips()}
    new = sorted(set(map(_key, results["failed_checks"])) - accepted)
    assert not new, "new checkov findings (fix them, or add them to terraform/checkov-skips.json with a reason):\n" + "\n".join(
        "  ".join(f) for f in new)


@pytest.mark.timeout(180)
def test_no_stale_skips(results):
    failed = set(map(_key, results["failed_checks"]))
    stale = [s for s in _skips() if (s["check_id"], s["resource"], s["file"]) not in failed]
    assert not stale, f"these skips match no finding any more; remove them: {stale}"


@pytest.mark.timeout(180)
def test_scan_covered_the_modules(results):
    """Guard against a scan that silently checked nothing. checkov has no checks for these IBM resources."""
    scanned = {f["file_path"].split("/")[2] for f in results["passed_checks"] + results["failed_checks"]
               if f["file_path"].startswith("/modules/")}
    assert {"aws", "gcp", "azure"} <= scanned, scanned
