# Sourced by scripts/test-gpu.sh and scripts/gpu-check.sh: make this checkout importable with the
# machine's own Python and torch, downloading nothing (a GPU machine may have no network).
#
# Sets PY (the interpreter: $PYTHON, else python3) and ROOT (this checkout), and exports
# PYTHONPATH with ROOT first, so that the tests' drivers, workers and helpers import this
# checkout whatever else is installed. cloud-elastic's providers are found through its entry
# points, which need an installed distribution: when `import cloud_elastic` fails, the project is
# installed with `pip install --no-deps --no-build-isolation --no-index -e .` (nothing fetched;
# torch and click must be there already); if pip cannot, a distribution record holding only the
# entry points (from pyproject.toml) is written to a temporary directory put on PYTHONPATH.
# Returns non-zero, having said why, when Python or torch is missing.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
case "$PY" in  # a relative path (PYTHON=.venv/bin/python) must survive the cd's below; links are kept
    */*) PY="$(cd "$(dirname "$PY")" 2>/dev/null && pwd)/$(basename "$PY")" ;;
esac

_gpu_env_log() { printf '[gpu-env] %s\n' "$*" >&2; }

_gpu_env_shim() {
    # A dist-info with the entry points only: importlib.metadata finds it on sys.path.
    local shim
    shim=$(mktemp -d "${TMPDIR:-/tmp}/cloud-elastic-gpu-env.XXXXXX") || return 1
    "$PY" - "$ROOT/pyproject.toml" "$shim" <<'PYEOF' || return 1
import pathlib
import re
import sys

text = pathlib.Path(sys.argv[1]).read_text()
try:
    import tomllib
    project = tomllib.loads(text)["project"]
    name, version = project["name"], project["version"]
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
except ImportError:  # Python 3.10: the two tables this needs, read by hand
    name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M).group(1)
    version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)
    groups = {}
    for header, body in re.findall(r'^\[project\.(scripts|entry-points\."[^"]+")\]\n(.*?)(?=^\[|\Z)', text, re.M | re.S):
        group = "console_scripts" if header == "scripts" else header.split('"')[1]
        groups[group] = dict(re.findall(r'^(\S+)\s*=\s*"([^"]+)"', body, re.M))
info = pathlib.Path(sys.argv[2]) / f"{name.replace('-', '_')}-{version}.dist-info"
info.mkdir()
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
(info / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in groups.items()))
PYEOF
    printf '%s\n' "$shim"
}

gpu_env() {
    if ! command -v "$PY" >/dev/null 2>&1; then
        _gpu_env_log "no $PY (set PYTHON to the interpreter that has torch)"
        return 2
    fi
    if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
        _gpu_env_log "$PY cannot import torch; nothing is installed here (set PYTHON to the interpreter that has it)"
        return 2
    fi
    local extra=""
    # From / : the current directory must not be what makes the import work.
    if ! (cd / && "$PY" -c 'import cloud_elastic') >/dev/null 2>&1; then
        _gpu_env_log "cloud_elastic is not installed for $PY; installing this checkout (pip --no-deps --no-index -e)"
        if ! "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --no-index \
                -e "$ROOT" >&2; then
            _gpu_env_log "pip could not install it; using PYTHONPATH=$ROOT and its entry points from pyproject.toml"
            extra=$(_gpu_env_shim) || { _gpu_env_log "could not write the entry points"; return 2; }
        fi
    fi
    export PYTHONPATH="$ROOT${extra:+:$extra}${PYTHONPATH:+:$PYTHONPATH}"
    (cd / && "$PY" -c '
import importlib.metadata as md, cloud_elastic, torch
eps = sorted(ep.name for ep in md.entry_points(group="cloud_elastic.providers"))
print(f"[gpu-env] cloud_elastic from {cloud_elastic.__path__[0]}, providers {eps}; torch {torch.__version__}, "
      f"CUDA available: {torch.cuda.is_available()}")
' >&2)
}
