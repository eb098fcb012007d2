#!/usr/bin/env bash
# Make sure kubectl exists for the Kubernetes manifest tests (tests/kubernetes/): they render
# deploy/kubernetes/ with `kubectl kustomize`, offline (no cluster is contacted).
#
# Idempotent: does nothing when `kubectl` is already on PATH. Otherwise installs Debian's
# kubernetes-client package; nothing is configured.
#
# The overlays need the kustomize v5 inside kubectl 1.27 or later. Debian 12's package is
# kubectl 1.20, too old for them: the script says so, and the tests then fail (under CI) or skip
# with that reason; install a newer kubectl by hand (the Kubernetes project's own packages).
#
# Installing needs root and apt-get (Debian/Ubuntu, as in CI). Elsewhere the script says what is
# missing and exits 0, and the Kubernetes tests skip with a reason (they fail under CI).
set -euo pipefail

log() { printf '[setup-kubectl] %s\n' "$*" >&2; }

# The minor version of the kubectl on PATH, or nothing.
minor() { kubectl version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -n1; }

check_version() {
    local m
    m=$(minor)
    if [ -n "$m" ] && [ "$m" -lt 27 ]; then
        log "kubectl 1.$m is older than 1.27: its kustomize cannot render deploy/kubernetes/ (install a newer kubectl)"
    fi
}

if command -v kubectl >/dev/null 2>&1; then
    check_version
    exit 0
fi

# shellcheck source=scripts/apt-lib.sh
. "$(dirname "$0")/apt-lib.sh"
apt_or_leave "no kubectl" "install kubectl 1.27+ by hand, or the Kubernetes tests will skip"

log "installing kubernetes-client (kubectl)"
$SUDO apt-get update -q >/dev/null
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    kubernetes-client >/dev/null

if ! command -v kubectl >/dev/null 2>&1; then
    log "kubernetes-client installed but kubectl is not on PATH"
    exit 1
fi
log "installed kubectl $(kubectl version --client 2>/dev/null | head -n1 || true)"
check_version
