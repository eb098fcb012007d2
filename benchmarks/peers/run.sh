#!/usr/bin/env bash
# Issue 15's benchmarks, all of them: cloud-elastic against plain DDP, torchrun elastic and torchft
# (step time on the MLP and on a 400-tensor AdamW model, step time against model size, kill -9,
# SIGSTOP, allreduce and commit bandwidth, host added, the timeline, the kill profile and false alarms
# of short heartbeat timeouts), driver scale, and the
# commit cost per optimizer (issue 13's table). Install, measure, draw.
#   benchmarks/peers/run.sh            the full run (about 110 minutes on 2 cores, estimated from its parts)
#   benchmarks/peers/run.sh --quick    a smoke run of every benchmark (13 minutes here when the lock is free), into
#                                      results-quick.json files; the published results and figures stay
# Every measurement holds /tmp/bench.lock so benchmarks of different people never overlap.
# Results: benchmarks/peers/results.json (merged per scenario), benchmarks/peers/host_added.json,
# benchmarks/scale/results.json, benchmarks/commit_cost.md; figures: docs/images/peers_*.png;
# markdown tables on stdout (for docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
QUICK=()
ADAMW=()  # the step-time variants on the AdamW model; a smoke run: DDP and commit every step
for a in "$@"; do [[ $a == --quick ]] && QUICK=(--quick) && ADAMW=(--quick --variants "commit every step"); done
"$PY" -m pip install -q --disable-pip-version-check -r requirements/bench.txt
flock /tmp/bench.lock "$PY" benchmarks/peers/run_peers.py "$@"
# The same step-time variants on a model of 400 small tensors trained with AdamW.
flock /tmp/bench.lock "$PY" benchmarks/peers/run_peers.py --only steps --adamw-tensors 400 \
  --steps-key step_time_adamw "${ADAMW[@]}"
flock /tmp/bench.lock "$PY" benchmarks/peers/allreduce_bw.py "${QUICK[@]}"
flock /tmp/bench.lock "$PY" benchmarks/peers/commit_bw.py "${QUICK[@]}"
if [[ ${#QUICK[@]} -eq 0 ]]; then
  flock /tmp/bench.lock "$PY" benchmarks/peers/host_added.py --repeats 7
  flock /tmp/bench.lock "$PY" benchmarks/scale/driver_scale.py
  flock /tmp/bench.lock "$PY" benchmarks/commit_cost.py --out benchmarks/commit_cost.md
  flock /tmp/bench.lock "$PY" benchmarks/peers/kill_profile.py --kills 12   # where a kill's time goes
  flock /tmp/bench.lock "$PY" benchmarks/peers/false_alarms.py              # short heartbeat timeouts under load
else  # smoke runs: beside the other quick results, or on stdout only
  flock /tmp/bench.lock "$PY" benchmarks/peers/host_added.py --repeats 1 --bound 30 \
    --out benchmarks/peers/results-quick.json
  flock /tmp/bench.lock "$PY" benchmarks/scale/driver_scale.py --rounds 64 256 1024 --steady 1024 \
    --live 2048 --live-seconds 3 --out benchmarks/scale/results-quick.json
  flock /tmp/bench.lock "$PY" benchmarks/commit_cost.py --quick --only blocks:adamw
  flock /tmp/bench.lock "$PY" benchmarks/peers/kill_profile.py --kills 1 --out benchmarks/peers/kill_profile-quick.json
  flock /tmp/bench.lock "$PY" benchmarks/peers/false_alarms.py --timeouts 1 --seconds 20 --stops 1 \
    --out benchmarks/peers/false_alarms-quick.json
fi
if [[ ${#QUICK[@]} -eq 0 ]]; then
  flock /tmp/bench.lock "$PY" benchmarks/peers/timeline_run.py
  "$PY" benchmarks/peers/plots.py
else  # a smoke run: its own results file, the published figures untouched
  "$PY" benchmarks/peers/plots.py benchmarks/peers/results-quick.json --no-draw
fi
