#!/usr/bin/env bash
# The GPU tests (tests/gpu), with this machine's own Python and torch; downloads nothing.
#
#   scripts/test-gpu.sh [tests/gpu/... test paths] [pytest arguments]     PYTHON=... to choose the interpreter
#
# Needs torch (a CUDA build, or every test is skipped: CLOUD_ELASTIC_REQUIRE_GPU=1 makes them fail
# instead), pytest and pytest-timeout. cloud-elastic is made importable by scripts/gpu-env.sh (pip
# --no-deps only when it is not installed; PYTHONPATH otherwise). Each test has its own time bound;
# CE_GPU_TEST_TIMEOUT_S (default 240) bounds any that has none. The whole run takes under five minutes
# on one GPU; tests that need two GPUs are skipped with one.
set -euo pipefail
# shellcheck source=scripts/gpu-env.sh
source "$(dirname "$0")/gpu-env.sh"
gpu_env
cd "$ROOT"
if ! "$PY" -c 'import pytest, pytest_timeout' >/dev/null 2>&1; then
    printf '[test-gpu] %s cannot import pytest and pytest-timeout; nothing is installed here\n' "$PY" >&2
    exit 2
fi
# Test paths given (./dev test-gpu tests/gpu/test_memory.py) replace tests/gpu; other arguments go to pytest.
where=(tests/gpu)
for arg in "$@"; do
    case "$arg" in tests/gpu/*) where=() ;; esac
done
exec "$PY" -m pytest -p no:cacheprovider ${where[@]+"${where[@]}"} -m gpu -q -ra --durations=0 \
    --timeout "${CE_GPU_TEST_TIMEOUT_S:-240}" "$@"
