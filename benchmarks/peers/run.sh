#!/usr/bin/env bash
# cloud-elastic against plain DDP, torchrun elastic and torchft: install, measure, draw.
#   benchmarks/peers/run.sh [run_peers.py options, e.g. --quick]
# Every measurement holds /tmp/bench.lock so benchmarks of different people never overlap.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m pip install -q --disable-pip-version-check -r requirements/bench.txt
flock /tmp/bench.lock "$PY" benchmarks/peers/run_peers.py "$@"
flock /tmp/bench.lock "$PY" benchmarks/peers/timeline_run.py
"$PY" benchmarks/peers/plots.py
