#!/usr/bin/env bash
# The prepared device check: one call, at most 6 minutes on one H100 or H200, so that a rerun fits the 15 minutes
# of device time a session gets (the machine's start included).
#
#   PYTHONPATH=. bash benchmarks/device_check.sh             (from the repository root; nothing is installed)
#   RNSTENSOR_CHECK_SCALE=0.01 bash benchmarks/device_check.sh   (a smoke run: every problem shrunk)
#   bash benchmarks/device_check.sh --dry-run                 (no GPU: CI runs this)
#
# 0. warm-up: numba's CPU kernels and every CUDA kernel the later steps load (the GPU tests' fused programs, the
#    large batches', the benchmark's), built side by side into the disk caches, so nothing timed compiles;
# 1. every kernel module built by this machine's NVRTC for the GPU's arch (resources, IMMA/IGMMA counts), and
#    every fused launch's shared memory and registers against the arch's limits (rnstensor/kernels/limits.py);
# 2. GPU tests (tests/gpu/): every CudaBackend call and the public features bitwise equal to the CPU backend, one
#    process per test module (pytest-xdist where installed, else one pytest each), so a kernel fault, which leaves
#    CUDA's error sticky for the rest of its process, costs that module's remaining tests only;
# 3. benchmarks/bench_gpu_product.py (product kernels vs cuBLAS INT8 across shapes);
# 4. benchmarks/bench_gpu.py: ceilings (copy, cuBLAS INT8, issue rates), chain GDoF/s (fused, unfused, steps,
#    composed, CuPy f64 einsum), FEM, DGEMM/ZGEMM TFLOP/s with phases vs CuPy, phi = 4 accuracy;
# 5. ncu: executed instructions per entry of the per-entry kernels and the fused kernel (one small chain);
# 6. benchmarks/perf_model.py: predicted vs measured, measured / floor.
# Each step prints its time and has a timeout taken from what is left of the 6 minutes (DEADLINE_S); the
# benchmarks get the rest as their budget and drop sizes, not checks, when it is short. A missing or failing CuPy
# fails the GPU tests (RNSTENSOR_REQUIRE_GPU=1), never skips them. The exit status is 0 only if every step
# passed. Prints a short table last; under $OUT (at most 8 files come back from the device machine):
# summary.json, bench_gpu.json, perf_model.json, gpu_tests.log and logs.tar.gz (every log); without $OUT all of
# it stays in benchmarks/results.
#
# --dry-run (no GPU): every Python process gets the strict CuPy stand-in (tests/standin/sitecustomize.py:
# tests/cupy_standin.py as `cupy`, launches run host builds of the kernels' own sources), problems are shrunk
# (RNSTENSOR_CHECK_SCALE, default 1e-5), the slow large-batch tests are left out, nvidia-smi and ncu are skipped.
# It checks the script, the tests and the benchmarks' code paths, not the device code or its speed.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "device_check.sh: unknown argument $arg (use --dry-run or nothing)" >&2; exit 2 ;;
    esac
done
RESULTS=${OUT:-benchmarks/results}
LOGS="$RESULTS"
[ -n "${OUT:-}" ] && LOGS=$(mktemp -d /tmp/rnstensor-check.XXXXXX)  # the logs travel back as one archive
mkdir -p "$RESULTS" "$LOGS"
export PYTHONPATH=${PYTHONPATH:-.}
# packages the device machine lacks (dask, distributed for tests/gpu/test_dask_cuda.py), carried as
# `pip install --target .carry dask distributed` and the run tool's carry=[".carry"]
[ -d .carry ] && export PYTHONPATH=".carry:$PYTHONPATH"
export PYTHONUNBUFFERED=1
export RNSTENSOR_KERNEL_CACHE=${RNSTENSOR_KERNEL_CACHE:-/tmp/rnstensor-kernels}
export RNSTENSOR_REQUIRE_GPU=1
PY=${PYTHON:-python3}
MARK=()
TESTS_S=150  # the GPU tests' step at most (a GPU runs them in about a minute once the kernels are built)
if (( DRY )); then
    export RNSTENSOR_CUPY_STANDIN=1 PYTHONPATH="tests/standin:$PYTHONPATH"
    export RNSTENSOR_CHECK_SCALE=${RNSTENSOR_CHECK_SCALE:-1e-5}
    MARK=(-m "not slow")
    # CPU threads stand in for the GPU: the tests take minutes, the rest shrinks with the scale
    TESTS_S=600
    DEADLINE_S=${DEADLINE_S:-1000}
fi
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-355}  # leave ~5 s of the 6 minutes for the final table

left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
now() { echo $(( $(date +%s) - T0 )); }
# cap SECONDS: a step's timeout, never more than what is left minus RESERVE
cap() { local want=$1 reserve=${2:-0} l; l=$(( $(left) - reserve )); (( l < want )) && want=$l; (( want < 5 )) && want=5; echo "$want"; }
STEP_T=$T0
took() { local t; t=$(date +%s); echo "-- $1 took $(( t - STEP_T )) s (at $(now) s)"; STEP_T=$t; }

if (( DRY )); then
    echo "dry run: the strict CuPy stand-in in every process, scale $RNSTENSOR_CHECK_SCALE" | tee "$LOGS/gpu.txt"
else
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv,noheader 2>&1 \
        | tee "$LOGS/gpu.txt"
fi

echo "== [0/6] warm-up: numba's CPU kernels and every CUDA kernel the steps load, side by side"
SLOW=--slow
(( DRY )) && SLOW=
timeout "$(cap 120 220)" "$PY" tests/gpu/prebuild.py --bench $SLOW 2>&1 | tee "$LOGS/warm.log" | tail -n 5
WARM_RC=${PIPESTATUS[0]}
took "warm-up"

# the CPU-side kernel tests (tests/test_kernels*.py) run in CI on every commit; here only what this machine's own
# NVRTC makes of the sources: every module for the GPU's arch, with its registers, spills and IMMA/IGMMA counts
ARCH=$("$PY" -c "from rnstensor.backends.cuda import device_info; print(device_info()['arch'])" 2>/dev/null || echo sm_90a)
echo "== [1/6] NVRTC build of every module for $ARCH (this machine's NVRTC; resources and tensor-core instructions)"
timeout "$(cap 60 220)" "$PY" -m rnstensor.kernels build --arch "$ARCH" --out /tmp/rnstensor-cubins 2>&1 \
    | tee "$LOGS/kernel_build.log" | tail -n 40
KERNEL_RC=${PIPESTATUS[0]}
"$PY" -c "from rnstensor.kernels import nvrtc_version; print('nvrtc', nvrtc_version())" 2>&1 | tee -a "$LOGS/kernel_build.log"
echo "   the fused launches against $ARCH's limits (shared memory, registers, blocks an SM):"
timeout "$(cap 30 220)" "$PY" tests/gpu/prebuild.py --bench --slow --limits "$ARCH" 2>&1 | tee -a "$LOGS/kernel_build.log" \
    | tail -n 60
LIMITS_RC=${PIPESTATUS[0]}
(( KERNEL_RC == 0 )) && KERNEL_RC=$LIMITS_RC
took "kernel build"

echo "== [2/6] GPU tests (bitwise equality with the CPU backend), one process per module"
T_TESTS=$(cap "$TESTS_S" 160)
MODULES=(tests/gpu/test_*.py)
if "$PY" -c "import xdist" 2>/dev/null; then
    timeout "$T_TESTS" "$PY" -m pytest -q -p no:cacheprovider -rs "${MARK[@]}" -n "${#MODULES[@]}" --dist loadfile \
        tests/gpu > "$LOGS/gpu_tests.log" 2>&1
    GPU_RC=$?
else
    PIDS=()
    for m in "${MODULES[@]}"; do
        timeout "$T_TESTS" "$PY" -m pytest -q -p no:cacheprovider -rs "${MARK[@]}" "$m" \
            > "$LOGS/gpu_tests.$(basename "$m" .py).log" 2>&1 &
        PIDS+=($!)
    done
    GPU_RC=0
    for p in "${PIDS[@]}"; do wait "$p" || GPU_RC=1; done
    for m in "${MODULES[@]}"; do
        echo "---- $m"
        cat "$LOGS/gpu_tests.$(basename "$m" .py).log"
    done > "$LOGS/gpu_tests.log"
fi
grep -E "^(FAILED|ERROR)|^---- |passed|failed|error|\[tests/gpu\]" "$LOGS/gpu_tests.log" | tail -n 40
took "GPU tests"

B=$(cap 40 130)
echo "== [3/6] product kernels vs cuBLAS INT8 (budget ${B} s)"
timeout $(( B + 20 )) "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gpu_product as b; sys.exit(b.run_checked(sys.argv[1], float(sys.argv[2]), float(sys.argv[3])))" \
    "$LOGS" "$B" "${RNSTENSOR_CHECK_SCALE:-1}" 2>&1 | tee "$LOGS/bench_gpu_product.log" | tail -n 20
PRODUCT_RC=${PIPESTATUS[0]}
took "product benchmark"

B=$(cap 150 45)
echo "== [4/6] bench_gpu.py (budget ${B} s)"
timeout $(( B + 30 )) "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gpu as b; sys.exit(b.run_checked(sys.argv[1], float(sys.argv[2])))" \
    "$LOGS" "$B" 2>&1 | tee "$LOGS/bench_gpu.log" | tail -n 60
BENCH_RC=${PIPESTATUS[0]}
took "bench_gpu"

NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
NCU_RC=skipped
if (( ! DRY )) && [ -n "$NCU" ] && (( $(left) > 45 )); then
    echo "== [5/6] ncu instruction counts of one n = 8 chain (2^20 DoFs)"
    timeout "$(cap 40 12)" "$NCU" --clock-control none --target-processes all \
        --kernel-name "regex:rns_drop_extend|rns_chain_fused|rns_decode_fp64|rns_encode|rns_product_n" --launch-count 16 \
        --metrics smsp__inst_executed.sum,smsp__thread_inst_executed.sum,gpu__time_duration.sum --csv --print-units base \
        "$PY" benchmarks/bench_gpu.py --probe > "$LOGS/ncu.csv" 2> "$LOGS/ncu.err"
    NCU_RC=$?
    grep -m1 '^{' "$LOGS/ncu.csv" > "$LOGS/probe.json" || true
    tail -n 3 "$LOGS/ncu.err"
    took "ncu"
else
    echo "== [5/6] ncu skipped (dry run, not found, or no time left): the model uses static SASS estimates"
fi

echo "== [6/6] performance model"
timeout "$(cap 30 0)" "$PY" benchmarks/perf_model.py --json "$LOGS/bench_gpu.json" --ncu "$LOGS/ncu.csv" \
    --probe-json "$LOGS/probe.json" --out "$LOGS/perf_model.json" 2>&1 | tee "$LOGS/perf_model.log" | tail -n 45
MODEL_RC=${PIPESTATUS[0]}
took "model"

echo
echo "warm-up rc=$WARM_RC  kernel build rc=$KERNEL_RC  GPU tests rc=$GPU_RC  product bench rc=$PRODUCT_RC  bench_gpu rc=$BENCH_RC  ncu rc=$NCU_RC  model rc=$MODEL_RC"
"$PY" benchmarks/bench_gpu.py --summary "$LOGS" 2>&1 | tee "$LOGS/summary.txt"
TOTAL=$(now)
echo "total: ${TOTAL} s"
"$PY" - "$LOGS/summary.json" "$TOTAL" "$DRY" "$WARM_RC" "$KERNEL_RC" "$GPU_RC" "$PRODUCT_RC" "$BENCH_RC" "$NCU_RC" "$MODEL_RC" <<'PYEOF' || true
import json, sys
path, total, dry, *rcs = sys.argv[1:]
steps = dict(zip(("warm", "kernel_build", "gpu_tests", "product_bench", "bench_gpu", "ncu", "model"), rcs))
try:
    summary = json.load(open(path))
except Exception:
    summary = {}
summary.update({"total_s": int(total), "dry_run": dry == "1", "step_rc": steps})
json.dump(summary, open(path, "w"), indent=1)
PYEOF
if [ -n "${OUT:-}" ]; then  # the few files that come back, the rest archived
    for f in summary.json bench_gpu.json perf_model.json gpu_tests.log; do [ -f "$LOGS/$f" ] && cp "$LOGS/$f" "$OUT/"; done
    tar czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null
fi
RC=0
for rc in "$WARM_RC" "$KERNEL_RC" "$GPU_RC" "$PRODUCT_RC" "$BENCH_RC" "$MODEL_RC"; do [ "$rc" = 0 ] || RC=1; done
[ "$NCU_RC" = skipped ] || [ "$NCU_RC" = 0 ] || RC=1
exit $RC
