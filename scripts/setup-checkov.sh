#!/usr/bin/env bash
# Install checkov into its own virtualenv (.venv-checkov) for the Terraform
# security scan in tests/terraform/test_checkov.py.
#
# checkov gets its own environment because its HCL parser (bc-python-hcl2)
# clashes with python-hcl2, which the structural tests use from .venv.
#
# Idempotent: does nothing when .venv-checkov/bin/checkov already runs and
# matches the pinned range. Needs only PyPI (no other network): the tests run
# checkov with --skip-download, so it never fetches policies or updates.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-checkov
SPEC='checkov>=3.2,<4'
PY=${PYTHON:-python3}
STAMP=$VENV/.cloud-elastic-installed

log() { printf '[setup-checkov] %s\n' "$*" >&2; }

if [ -x "$VENV/bin/checkov" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC" ]; then
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$PY" -m venv "$VENV"
fi
log "installing $SPEC into $VENV (a minute or two the first time)"
bash scripts/pip-install.sh "$VENV" "$SPEC"
# Once: checkov imports most of itself even for --version (5-6 CPU-seconds of a fresh clone's set-up).
version=$("$VENV/bin/checkov" --version)
echo "$SPEC" > "$STAMP"
log "installed checkov $version"
