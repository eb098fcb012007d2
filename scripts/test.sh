#!/usr/bin/env bash
# The whole test suite, or the tests named in the arguments (scripts/run_tests.py says how).
# ./dev test runs this after setting everything up: exec scripts/test.sh "$@".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON_FOR_TESTS:-.venv/bin/python}
[ -d .venv/bin ] && export PATH="$PWD/.venv/bin:$PATH"
[ -x "$PY" ] || PY=python3
exec "$PY" scripts/run_tests.py "$@"
