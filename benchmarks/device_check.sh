#!/usr/bin/env bash
# The prepared device check (issues 7 and 8): one call, at most 8 minutes on one H200.
#
#   PYTHONPATH=. bash benchmarks/device_check.sh        (from the repository root; nothing is installed)
#   RNSTENSOR_CHECK_SCALE=0.01 bash benchmarks/device_check.sh   (a smoke run: every problem shrunk)
#
# 1. every kernel module built by this machine's NVRTC for the GPU's arch (resources, IMMA/IGMMA counts);
# 2. GPU tests (tests/gpu/): every CudaBackend call and the public features bitwise equal to the CPU backend
#    (the kernels they load are compiled side by side first, one process per core: tests/gpu/conftest.py);
# 3. benchmarks/bench_gpu_product.py (product kernels vs cuBLAS INT8 across shapes), if present;
# 4. benchmarks/bench_gpu.py: ceilings (copy, cuBLAS INT8, issue rates), chain GDoF/s (fused, unfused,
#    steps, composed, CuPy f64 einsum), DGEMM/ZGEMM TFLOP/s with phases vs CuPy, phi = 4 accuracy;
# 5. ncu: executed instructions per entry of the per-entry kernels and the fused kernel (one small chain);
# 6. benchmarks/perf_model.py: predicted vs measured, measured / floor.
# Each step has a timeout taken from what is left of the 8 minutes (DEADLINE_S); the benchmarks get the
# rest as their budget and drop sizes, not checks, when it is short. Prints a short table last; JSON and
# logs under $OUT (or benchmarks/results).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-benchmarks/results}
mkdir -p "$OUTDIR"
export PYTHONPATH=${PYTHONPATH:-.}
# packages the device machine lacks (dask, distributed for tests/gpu/test_dask_cuda.py), carried as
# `pip install --target .carry dask distributed` and the run tool's carry=[".carry"]
[ -d .carry ] && export PYTHONPATH=".carry:$PYTHONPATH"
export PYTHONUNBUFFERED=1
export RNSTENSOR_KERNEL_CACHE=${RNSTENSOR_KERNEL_CACHE:-/tmp/rnstensor-kernels}
PY=${PYTHON:-python3}
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-470}  # leave ~10 s of the 8 minutes for the final table

left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
# cap SECONDS: a step's timeout, never more than what is left minus RESERVE
cap() { local want=$1 reserve=${2:-0} l; l=$(( $(left) - reserve )); (( l < want )) && want=$l; (( want < 5 )) && want=5; echo "$want"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv,noheader 2>&1 | tee "$OUTDIR/gpu.txt"

# the CPU-side kernel tests (tests/test_kernels*.py) take about 3.5 min on 2 cores and run in CI on every
# commit; here only what this machine's own NVRTC makes of the sources: every module for the GPU's arch,
# built side by side, with its registers, spills and IMMA/IGMMA counts
ARCH=$("$PY" -c "from rnstensor.backends.cuda import device_info; print(device_info()['arch'])" 2>/dev/null || echo sm_90a)
echo "== [1/6] NVRTC build of every module for $ARCH (this machine's NVRTC; resources and tensor-core instructions)"
timeout "$(cap 60 360)" "$PY" -m rnstensor.kernels build --arch "$ARCH" --out /tmp/rnstensor-cubins 2>&1 \
    | tee "$OUTDIR/kernel_build.log" | tail -n 40
KERNEL_RC=${PIPESTATUS[0]}
"$PY" -c "from rnstensor.kernels import nvrtc_version; print('nvrtc', nvrtc_version())" 2>&1 | tee -a "$OUTDIR/kernel_build.log"

echo "== [2/6] GPU tests (bitwise equality with the CPU backend) at $(( $(date +%s) - T0 )) s"
# one pytest-xdist worker per test module where xdist is installed: a kernel fault leaves CUDA's error sticky
# for the rest of its process, so it then costs that module's remaining tests, not every later module's
XDIST=""
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n 5 --dist loadfile"
timeout "$(cap 150 240)" "$PY" -m pytest -q -p no:cacheprovider -rs $XDIST tests/gpu 2>&1 | tee "$OUTDIR/gpu_tests.log" | tail -n 25
GPU_RC=${PIPESTATUS[0]}

PRODUCT_RC=skipped
if [ -f benchmarks/bench_gpu_product.py ]; then
    B=$(cap 50 200)
    echo "== [3/6] product kernels vs cuBLAS INT8 (budget ${B} s) at $(( $(date +%s) - T0 )) s"
    timeout $(( B + 20 )) "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gpu_product as b; b.main(sys.argv[1], float(sys.argv[2]))" \
        "$OUTDIR" "$B" 2>&1 | tee "$OUTDIR/bench_gpu_product.log" | tail -n 20
    PRODUCT_RC=${PIPESTATUS[0]}
else
    echo "== [3/6] benchmarks/bench_gpu_product.py not present: skipped"
fi

B=$(cap 200 60)
echo "== [4/6] bench_gpu.py (budget ${B} s) at $(( $(date +%s) - T0 )) s"
timeout $(( B + 30 )) "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_gpu as b; b.main(sys.argv[1], float(sys.argv[2]))" \
    "$OUTDIR" "$B" 2>&1 | tee "$OUTDIR/bench_gpu.log" | tail -n 60
BENCH_RC=${PIPESTATUS[0]}

NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
NCU_RC=skipped
if [ -n "$NCU" ] && (( $(left) > 45 )); then
    echo "== [5/6] ncu instruction counts of one n = 8 chain (2^20 DoFs) at $(( $(date +%s) - T0 )) s"
    timeout "$(cap 40 12)" "$NCU" --clock-control none --target-processes all \
        --kernel-name "regex:rns_drop_extend|rns_chain_fused|rns_decode_fp64|rns_encode|rns_product_n" --launch-count 16 \
        --metrics smsp__inst_executed.sum,smsp__thread_inst_executed.sum,gpu__time_duration.sum --csv --print-units base \
        "$PY" benchmarks/bench_gpu.py --probe > "$OUTDIR/ncu.csv" 2> "$OUTDIR/ncu.err"
    NCU_RC=$?
    grep -m1 '^{' "$OUTDIR/ncu.csv" > "$OUTDIR/probe.json" || true
    tail -n 3 "$OUTDIR/ncu.err"
else
    echo "== [5/6] ncu not found or no time left: skipped (the model uses static SASS estimates)"
fi

echo "== [6/6] performance model at $(( $(date +%s) - T0 )) s"
timeout "$(cap 30 0)" "$PY" benchmarks/perf_model.py --json "$OUTDIR/bench_gpu.json" --ncu "$OUTDIR/ncu.csv" \
    --probe-json "$OUTDIR/probe.json" --out "$OUTDIR/perf_model.json" 2>&1 | tee "$OUTDIR/perf_model.log" | tail -n 45
MODEL_RC=${PIPESTATUS[0]}

echo
echo "kernel build rc=$KERNEL_RC  GPU tests rc=$GPU_RC  product bench rc=$PRODUCT_RC  bench_gpu rc=$BENCH_RC  ncu rc=$NCU_RC  model rc=$MODEL_RC"
"$PY" - "$OUTDIR" <<'PYEOF' 2>&1 || true
# the short table: headline numbers of bench_gpu.json (speeds as ratios against CuPy in the same run)
import json, sys
d = sys.argv[1]
try:
    r = json.load(open(f"{d}/bench_gpu.json"))
except Exception as exc:
    print(f"no bench_gpu.json: {exc}")
    sys.exit(0)
c = r.get("ceilings", {})
if c.get("copy"):
    print(f"ceilings: copy {c['copy']['Bps'] / 1e12:.2f} TB/s, cuBLAS INT8 {c.get('int8_ops_per_s', 0) / 1e12:.0f} TOP/s, "
          f"FFMA {c.get('ffma_rate', {}).get('thread_ops_per_s', 0) / 1e12:.1f} T/s")
for row in r.get("chain", []):
    if "dofs" not in row:
        continue
    cells = [f"{v} {row[v]['gdofs']:.2f}" for v in ("fused", "unfused", "steps", "composed", "f64_einsum")
             if isinstance(row.get(v), dict) and "gdofs" in row[v]]
    print(f"chain n={row['n']:<4} GDoF/s: " + ", ".join(cells))
for key in ("dgemm", "zgemm"):
    for row in r.get(key, []):
        m = row.get("mma") or {}
        if "tflops" in m:
            print(f"{key} N={row['N']:<6} s={row['s']:<3} {m['tflops']:7.1f} TFLOP/s = {m['vs_f64']:.2f}x CuPy ({row['f64']['tflops']:.1f})")
a = r.get("accuracy_phi4", {})
for k, v in a.items():
    if isinstance(v, dict) and "normwise" in v:
        print(f"phi=4 {k:<14} normwise {v['normwise']:.1e}  max ulp {v['max_ulp']:.3g}")
PYEOF
echo "total: $(( $(date +%s) - T0 )) s"
