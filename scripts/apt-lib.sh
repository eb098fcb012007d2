# Sourced by the scripts/setup-*.sh that install a Debian package (not run itself: ./dev runs only setup-*.sh).
#
# apt_or_leave MISSING HINT: sets SUDO to "" as root or "sudo -n" with passwordless sudo, so that the caller
# can run "$SUDO apt-get ...". Without apt-get, or without root or passwordless sudo, it logs
# "MISSING and no apt-get: HINT" (or "... and not root ...") and ends the calling script with status 0: the
# tests that need the package then skip, or fail under CI. The caller defines log().
apt_or_leave() {
    local missing=$1 hint=$2
    if ! command -v apt-get >/dev/null 2>&1; then
        log "$missing and no apt-get: $hint"
        exit 0
    fi
    SUDO=
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            SUDO="sudo -n"
        else
            log "$missing and not root (no passwordless sudo): $hint"
            exit 0
        fi
    fi
}
