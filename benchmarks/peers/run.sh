#!/usr/bin/env bash
# cloud-elastic against plain DDP, torchrun elastic and torchft: install, measure, draw.
#   benchmarks/peers/run.sh            the full run (about 50 minutes on 2 cores)
#   benchmarks/peers/run.sh --quick    a smoke run of every scenario (a few minutes), into
#                                      results-quick.json; the published results and figures stay
# Every measurement holds /tmp/bench.lock so benchmarks of different people never overlap.
# Results: benchmarks/peers/results.json (merged per scenario), figures: docs/images/peers_*.png,
# markdown tables on stdout (for docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
QUICK=()
for a in "$@"; do [[ $a == --quick ]] && QUICK=(--quick); done
"$PY" -m pip install -q --disable-pip-version-check -r requirements/bench.txt
flock /tmp/bench.lock "$PY" benchmarks/peers/run_peers.py "$@"
flock /tmp/bench.lock "$PY" benchmarks/peers/allreduce_bw.py "${QUICK[@]}"
flock /tmp/bench.lock "$PY" benchmarks/peers/commit_bw.py "${QUICK[@]}"
if [[ ${#QUICK[@]} -eq 0 ]]; then
  flock /tmp/bench.lock "$PY" benchmarks/peers/host_added.py --repeats 7
else
  flock /tmp/bench.lock "$PY" benchmarks/peers/host_added.py --repeats 1 --bound 30 \
    --out benchmarks/peers/results-quick.json  # a smoke run: beside the other quick results
fi
if [[ ${#QUICK[@]} -eq 0 ]]; then
  flock /tmp/bench.lock "$PY" benchmarks/peers/timeline_run.py
  "$PY" benchmarks/peers/plots.py
else  # a smoke run: its own results file, the published figures untouched
  "$PY" benchmarks/peers/plots.py benchmarks/peers/results-quick.json --no-draw
fi
