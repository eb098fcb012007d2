#!/usr/bin/env bash
# The whole GPU check in one call, for a machine with a GPU: the GPU tests, then the quick GPU benchmark.
#
#   scripts/gpu-check.sh            PYTHON=... to choose the interpreter; OUT=dir to keep the results
#
# With $OUT set, everything printed is also written to $OUT/gpu-check.log, and the benchmark's table
# to $OUT/gpu-bench.md. CLOUD_ELASTIC_REQUIRE_GPU defaults to 1 here: a GPU check that found no GPU
# fails instead of skipping. Each part has a time bound (CE_GPU_TESTS_BUDGET_S, default 330 s;
# CE_GPU_BENCH_BUDGET_S, default 200 s), so the check ends within nine and a half minutes whatever hangs.
# On one H100 (docs/gpu.md) the tests took about 250 s and the quick benchmark about 150 s.
# CE_GPU_BENCH_ARGS (default --quick) are the benchmark's arguments: empty for the full run (raise its budget).
# CE_GPU_PROFILE_STEPS=N adds a third part: benchmarks/gpu.py --quick --profile N for DDP and the variants
# in CE_GPU_PROFILE_ONLY (default every1,every10; bounded by CE_GPU_PROFILE_BUDGET_S, default 150 s): the
# host's waits on the device and the device's busy time per step; with $OUT, each variant's Chrome trace too.
# Exit code: 0 when the tests and the benchmark passed (the profile is information only).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export CLOUD_ELASTIC_REQUIRE_GPU=${CLOUD_ELASTIC_REQUIRE_GPU:-1}
LOG=/dev/null
BENCH_OUT=()
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    LOG=$OUT/gpu-check.log
    BENCH_OUT=(--out-md "$OUT/gpu-bench.md")
fi

check() {
    # shellcheck source=scripts/gpu-env.sh
    source "$HERE/gpu-env.sh"
    echo "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    gpu_env || return 2
    "$PY" - <<'PYEOF'
import sys, torch
nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
print(f"== python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"devices {torch.cuda.device_count()}, NCCL {nccl}")
PYEOF
    echo "== tests (scripts/test-gpu.sh)"
    timeout -s INT -k 30 "${CE_GPU_TESTS_BUDGET_S:-330}" bash "$HERE/test-gpu.sh"
    local tests=$?
    local bench_args
    read -r -a bench_args <<< "${CE_GPU_BENCH_ARGS---quick}"
    echo "== benchmark (benchmarks/gpu.py ${bench_args[*]})"
    (cd "$ROOT" && timeout -s INT -k 30 "${CE_GPU_BENCH_BUDGET_S:-200}" "$PY" benchmarks/gpu.py ${bench_args[@]+"${bench_args[@]}"} \
        ${BENCH_OUT[@]+"${BENCH_OUT[@]}"})
    local bench=$?
    if [ "${CE_GPU_PROFILE_STEPS:-0}" -gt 0 ]; then
        local only=${CE_GPU_PROFILE_ONLY:-every1,every10}
        echo "== profile (benchmarks/gpu.py --quick --profile $CE_GPU_PROFILE_STEPS --only $only)"
        (cd "$ROOT" && timeout -s INT -k 30 "${CE_GPU_PROFILE_BUDGET_S:-150}" "$PY" benchmarks/gpu.py --quick \
            --profile "$CE_GPU_PROFILE_STEPS" --only "$only" ${OUT:+--trace-dir "$OUT"})
    fi
    echo "== gpu-check: tests exit $tests, benchmark exit $bench (124: out of time)"
    [ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
}

check 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
