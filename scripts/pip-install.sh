#!/usr/bin/env bash
# pip install into a virtualenv, through uv when it can: scripts/pip-install.sh VENV PIP-ARGS...
#
# uv installs the same packages as pip in about half the time (it unpacks in parallel), which is
# a minute or two of every fresh clone's set-up (./dev, scripts/setup-checkov.sh). uv does not
# read pip's configuration, so pip's own settings (`pip config list`: index URLs, find-links,
# constraints, certificate, from its files and PIP_* variables) are handed to uv as UV_* and
# SSL_CERT_FILE, with every index equally trusted as pip does. When uv cannot be installed or
# fails, plain pip installs instead, as before; CLOUD_ELASTIC_PIP=pip always uses plain pip.
set -euo pipefail
VENV=$1
shift
log() { printf '[pip-install] %s\n' "$*" >&2; }

pip_install() { "$VENV/bin/pip" install -q --disable-pip-version-check "$@"; }

uv_install() {
    [ "${CLOUD_ELASTIC_PIP:-}" != pip ] || return 1
    if [ ! -x "$VENV/bin/uv" ]; then
        pip_install uv >/dev/null 2>&1 || return 1
    fi
    local key value
    local -a env=(UV_INDEX_STRATEGY=unsafe-best-match)
    while IFS= read -r line; do
        key=${line%%=*}
        key=${key##*.}
        value=${line#*=}
        value=${value#\'}
        value=${value%\'}
        case "$key" in
            index-url) env+=("UV_DEFAULT_INDEX=$value") ;;
            extra-index-url) env+=("UV_EXTRA_INDEX_URL=$value") ;;
            find-links) env+=("UV_FIND_LINKS=${value// /,}") ;;
            constraint) env+=("UV_CONSTRAINT=$value") ;;
            cert) env+=("SSL_CERT_FILE=$value") ;;
        esac
    done < <("$VENV/bin/pip" config list 2>/dev/null | sort -r || true)  # :env: last: it wins, as in pip
    # No --compile-bytecode (35 s of a fresh clone's 64 s install of requirements/dev.txt): ./dev lets
    # Python cache what it compiles (it unsets PYTHONDONTWRITEBYTECODE), so a module is compiled once,
    # by the first process that imports it, and the many that nothing imports are never compiled.
    env "${env[@]}" "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" "$@"
}

if uv_install "$@"; then
    exit 0
fi
[ "${CLOUD_ELASTIC_PIP:-}" = pip ] || log "uv did not install $*; installing with pip"
pip_install "$@"
