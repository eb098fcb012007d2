#!/usr/bin/env bash
# Make sure an OpenSSH server binary exists for the SSH tests (tests/ssh/).
#
# Idempotent: does nothing when /usr/sbin/sshd is already installed.
# It only installs the package: the system sshd service is neither enabled nor
# started and no system configuration is changed. The tests start their own
# sshd on a loopback port with a generated config, host key and client key
# in a temporary directory (tests/ssh/conftest.py).
#
# Installing needs root and apt-get (Debian/Ubuntu, as in CI). Elsewhere the
# script says what is missing and exits 0, and the SSH tests skip with a reason.
set -euo pipefail

SSHD=/usr/sbin/sshd

log() { printf '[setup-sshd] %s\n' "$*" >&2; }

if [ -x "$SSHD" ]; then
    exit 0
fi

# shellcheck source=scripts/apt-lib.sh
. "$(dirname "$0")/apt-lib.sh"
apt_or_leave "no $SSHD" "install openssh-server by hand, or the SSH tests will skip"

# policy-rc.d exit code 101 keeps the package's maintainer scripts from
# starting (or enabling a start of) the system sshd during installation.
POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    CREATED_POLICY=1
fi
cleanup() { if [ "$CREATED_POLICY" = 1 ]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT

log "installing openssh-server (the system service is not started)"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    openssh-server openssh-client >/dev/null

if [ ! -x "$SSHD" ]; then
    log "openssh-server installed but $SSHD is missing"
    exit 1
fi
log "installed $($SSHD -V 2>&1 | head -n1 || true)"
