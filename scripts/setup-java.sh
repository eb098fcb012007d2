#!/usr/bin/env bash
# Make sure a Java runtime exists for the Spark tests (tests/spark/): PySpark
# starts a JVM.
#
# Idempotent: does nothing when `java` is already on PATH (or JAVA_HOME has one).
# Installs Debian's headless OpenJDK 17 runtime, the Java that PySpark 3.5/4.x
# supports; nothing is configured or started.
#
# Installing needs root and apt-get (Debian/Ubuntu, as in CI). Elsewhere the
# script says what is missing and exits 0, and the Spark tests skip with a reason.
set -euo pipefail

log() { printf '[setup-java] %s\n' "$*" >&2; }

if command -v java >/dev/null 2>&1 || [ -x "${JAVA_HOME:-/nonexistent}/bin/java" ]; then
    exit 0
fi

# shellcheck source=scripts/apt-lib.sh
. "$(dirname "$0")/apt-lib.sh"
apt_or_leave "no java" "install openjdk-17-jre-headless (a Java 17 runtime) by hand, or the Spark tests will skip"

log "installing openjdk-17-jre-headless"
$SUDO apt-get update -q >/dev/null
# The package's postinst needs the man directory that slim images leave out.
$SUDO mkdir -p /usr/share/man/man1
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    openjdk-17-jre-headless >/dev/null

if ! command -v java >/dev/null 2>&1; then
    log "openjdk-17-jre-headless installed but java is not on PATH"
    exit 1
fi
log "installed $(java -version 2>&1 | head -n1 || true)"
