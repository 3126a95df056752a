#!/usr/bin/env bash
# The prepared device check for the CUDA backend (issue 7): one call, about 8 minutes on one H200.
#
#   PYTHONPATH=. bash benchmarks/device_check.sh        (from the repository root; nothing is installed)
#
# 1. the kernel build + host-arithmetic tests (CPU-side, as in CI) and the GPU tests (tests/gpu/):
#    every CudaBackend call and the public features bitwise equal to the CPU backend;
# 2. benchmarks, each timed with CUDA events (median of a few runs after a warm-up):
#    - residue product kernel (INT8 mma.sync + fused reduction) TOP/s vs cuBLAS INT8 (gemmStridedBatchedEx, TN),
#      at a GEMM shape and at the n = 8 mode-product shape;
#    - chain GDoF/s at n = 8 (3 mode products, RescaleBE drops + extension, fp64 decode) vs CuPy float64 einsum;
#    - DGEMM at N = 8192, s = 15 (encode, 15 residue GEMMs, fp64 decode on the GPU) vs CuPy float64 matmul.
# Prints a short table last and writes JSON (and logs) under $OUT (or benchmarks/results).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-benchmarks/results}
mkdir -p "$OUTDIR"
export PYTHONPATH=${PYTHONPATH:-.}
export PYTHONUNBUFFERED=1
export RNSTENSOR_KERNEL_CACHE=${RNSTENSOR_KERNEL_CACHE:-/tmp/rnstensor-kernels}
PY=${PYTHON:-python3}
T0=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader 2>&1 | tee "$OUTDIR/gpu.txt"

echo "== [1/3] kernel build and host-arithmetic tests (no GPU needed)"
timeout 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_host.py \
    tests/test_kernels_backend.py tests/test_kernels_simt.py 2>&1 | tee "$OUTDIR/kernel_tests.log" | tail -n 4
KERNEL_RC=${PIPESTATUS[0]}

echo "== [2/3] GPU tests (bitwise equality with the CPU backend)"
timeout 180 "$PY" -m pytest -q -p no:cacheprovider -rs tests/gpu 2>&1 | tee "$OUTDIR/gpu_tests.log" | tail -n 25
GPU_RC=${PIPESTATUS[0]}

echo "== [3/3] benchmarks (elapsed so far: $(( $(date +%s) - T0 )) s)"
timeout 180 "$PY" - "$OUTDIR" "$KERNEL_RC" "$GPU_RC" <<'PYEOF' 2>&1 | tee "$OUTDIR/bench.log"
import json, math, sys, time, traceback

import numpy as np
import cupy as cp

import rnstensor as rt
from rnstensor import arith
from rnstensor.basis import Basis
from rnstensor.backends.cuda import CudaBackend, device_info

outdir, kernel_rc, gpu_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
INT8_PEAK = 1979e12  # dense INT8 tensor-core ops/s (H100/H200 SXM datasheet), the floor's rate
HBM = 4.8e12  # bytes/s, H200 datasheet
res = {"device": device_info(), "kernel_tests_rc": kernel_rc, "gpu_tests_rc": gpu_rc, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
rows = []
# RNSTENSOR_CHECK_SCALE < 1 shrinks every problem (a smoke run of this script off the GPU)
SCALE = float(__import__("os").environ.get("RNSTENSOR_CHECK_SCALE", "1"))


def sz(n, lo=1):
    return max(lo, int(n * SCALE))


def timed(fn, reps=5, warm=1):
    for _ in range(warm):
        fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return float(np.median(ts))


def section(name, body):
    t = time.time()
    try:
        body()
    except Exception as exc:  # keep going: every section reports what it could
        traceback.print_exc()
        res[name + "_error"] = f"{type(exc).__name__}: {exc}"
    print(f"-- {name}: {time.time() - t:.1f} s", flush=True)


mma = CudaBackend("mma")
cub = CudaBackend("cublas")
rng = np.random.default_rng(0)


def rand_planes(moduli, shape):
    return cp.asarray(np.stack([rng.integers(-(p // 2), (p + 1) // 2, shape, dtype=np.int64) for p in moduli]).astype(np.int8))


# ---- product kernel vs cuBLAS INT8 -----------------------------------------------------------
def bench_product():
    basis = Basis.int8(15)
    L = len(basis)
    out = {}
    for label, M, N, K in (("gemm4096", sz(4096, 64), sz(4096, 64), sz(4096, 64)), ("n8", sz(1 << 21, 256), 8, 8)):
        X = rand_planes(basis.moduli, (M, K))  # contract the last axis: K-contiguous rows
        A = rand_planes(basis.moduli, (N, K))
        ops = 2.0 * L * M * N * K
        t_mma = timed(lambda: mma.product(A, X, basis.moduli, 1))
        t_cub = timed(lambda: cub.product(A, X, basis.moduli, 1))
        same = bool((mma.product(A, X, basis.moduli, 1) == cub.product(A, X, basis.moduli, 1)).all())
        # cuBLAS GEMM alone (int32 out), the INT8 baseline
        from cupy_backends.cuda.libs import cublas
        acc = cp.empty((L, M, N), cp.int32)
        one, zero = np.array(1, np.int32), np.array(0, np.int32)
        h = cp.cuda.device.get_cublas_handle()

        def gemm_only():
            cublas.gemmStridedBatchedEx(h, 1, 0, N, M, K, one.ctypes.data, A.data.ptr, 3, K, N * K, X.data.ptr, 3, K,
                                        M * K, zero.ctypes.data, acc.data.ptr, 10, N, M * N, L,
                                        getattr(cublas, "CUBLAS_COMPUTE_32I", 72), -1)

        if hasattr(cublas, "setPointerMode"):
            cublas.setPointerMode(h, getattr(cublas, "CUBLAS_POINTER_MODE_HOST", 0))
        t_gemm = timed(gemm_only)
        byts = L * (M * K + N * K + M * N)
        floor = max(ops / INT8_PEAK, byts / HBM)
        out[label] = dict(M=M, N=N, K=K, L=L, mma_s=t_mma, cublas_plus_reduce_s=t_cub, cublas_gemm_only_s=t_gemm,
                          mma_tops=ops / t_mma / 1e12, cublas_tops=ops / t_gemm / 1e12, floor_s=floor, equal=same)
        rows.append((f"product {label} (L={L}) mma", f"{ops / t_mma / 1e12:8.1f} TOP/s", f"{floor / t_mma:6.1%} of floor"))
        rows.append((f"product {label} cuBLAS gemm", f"{ops / t_gemm / 1e12:8.1f} TOP/s", f"+reduce {ops / t_cub / 1e12:.1f}"))
        if label == "gemm4096":
            # the fused 3M complex product: three residue GEMMs + the 3M combination in one kernel
            Xi, Ai = rand_planes(basis.moduli, (M, K)), rand_planes(basis.moduli, (N, K))
            t3 = timed(lambda: mma.product_3m(A, Ai, X, Xi, basis.moduli, 1), reps=3)
            out[label].update(product3m_s=t3, product3m_tops=3 * ops / t3 / 1e12)
            rows.append((f"product 3M {label} (3 GEMMs)", f"{3 * ops / t3 / 1e12:8.1f} TOP/s", f"vs 3 x mma {t3 / (3 * t_mma):.2f}x time"))
            del Xi, Ai
        del X, A, acc
        cp.get_default_memory_pool().free_all_blocks()
    res["product"] = out


# ---- chain at n = 8 --------------------------------------------------------------------------
def bench_chain():
    n, E = 8, sz(1 << 16, 64)
    ops_np = [rng.uniform(-1, 1, (n, n)) for _ in range(3)]
    plan = rt.plan_chain(ops_np, [0, 1, 2])
    basis, bits, drops = plan.basis, plan.bits, plan.drops
    Xh = rng.uniform(-1, 1, (E, n, n, n))
    X = cp.asarray(Xh)
    e = (bits - np.frexp(np.abs(Xh).max(axis=(1, 2, 3), keepdims=True))[1]).astype(np.int64)
    opl = []
    for op in ops_np:
        eo = (bits - np.frexp(np.abs(op).max(axis=1, keepdims=True))[1]).astype(np.int64)
        opl.append(cp.asarray(mma.encode(cp.asarray(op), eo, basis.moduli, bits)))

    def chain(be):
        T = be.encode(X, e, basis.moduli, bits)
        active = basis.moduli
        for i, A in enumerate(opl):
            idx = [basis.moduli.index(p) for p in active]
            T = be.product(A[idx] if len(idx) != len(basis) else A, T, active, i + 1)
            if drops[i]:
                T, active = be.drop_extend(T, active, basis, drops[i], True)
        return be.decode(T, active, np.zeros((E, 1, 1, 1), np.int64), 1, "fp64")

    t = timed(lambda: chain(mma), reps=3)
    # CPU backend, same calls, on a slice (bitwise check of the whole chain on it)
    from rnstensor.backends.cpu import CpuBackend
    cpu = CpuBackend()
    Es = min(E, 1 << 12)
    Xs, es = Xh[:Es], e[:Es]
    opl_h = [cp.asnumpy(A) for A in opl]

    def chain_cpu():
        T = cpu.encode(Xs, es, basis.moduli, bits)
        active = basis.moduli
        for i, A in enumerate(opl_h):
            T = cpu.product(A, T, active, i + 1)
            if drops[i]:
                T, active = cpu.drop_extend(T, active, basis, drops[i], True)
        return cpu.decode(T, active, np.zeros((Es, 1, 1, 1), np.int64), 1, "fp64")

    chain_cpu()
    t0 = time.perf_counter(); ycpu = chain_cpu(); t_cpu = (time.perf_counter() - t0) * E / Es
    ygpu = cp.asnumpy(chain(mma))[:Es]
    equal = bool(np.array_equal(ycpu.view(np.uint64), ygpu.view(np.uint64)))
    # baseline: CuPy float64 contractions, same three mode products
    O = [cp.asarray(o) for o in ops_np]

    def f64():
        Y = cp.einsum("ai,eijk->eajk", O[0], X)
        Y = cp.einsum("bj,eajk->eabk", O[1], Y)
        return cp.einsum("ck,eabk->eabc", O[2], Y)

    t64 = timed(f64, reps=3)
    dof = E * n**3
    res["chain"] = dict(n=n, E=E, moduli=len(basis), drops=drops, bits=bits, gpu_s=t, cpu_s_scaled=t_cpu, f64_s=t64,
                        gdofs=dof / t / 1e9, f64_gdofs=dof / t64 / 1e9, cpu_gdofs=dof / t_cpu / 1e9, equal_cpu=equal)
    rows.append((f"chain n=8 E={E} (s={len(basis)})", f"{dof / t / 1e9:8.2f} GDoF/s", f"f64 einsum {dof / t64 / 1e9:.2f}, CPU {dof / t_cpu / 1e9:.3f}"))
    # the public API, NumPy in/out (moves every call's planes): as the layers above call backends today
    t0 = time.perf_counter(); plan.run(Xh[:Es], "fp64", backend="cuda"); t_api = time.perf_counter() - t0
    res["chain"]["api_numpy_io_s_for_E4096"] = t_api


# ---- DGEMM N = 8192, s = 15 ------------------------------------------------------------------
def bench_dgemm():
    N, s = sz(8192, 64), 15
    basis = Basis.int8(s)
    from rnstensor.gemm import gemm_width
    t_bits = gemm_width(s, N)
    a = cp.asarray(rng.standard_normal((N, N)))
    b = cp.asarray(rng.standard_normal((N, N)))

    def emu(be):
        # C^T = B^T A^T with both operands K-contiguous (the TN layout of INT8 tensor cores):
        # a's rows and b's columns each get one exponent (runs of the trailing axis)
        bt = cp.ascontiguousarray(b.T)
        ea = (t_bits - cp.frexp(cp.abs(a).max(axis=1, keepdims=True))[1]).astype(cp.int64)
        eb = (t_bits - cp.frexp(cp.abs(bt).max(axis=1, keepdims=True))[1]).astype(cp.int64)
        A = be.encode(a, ea, basis.moduli, t_bits)  # (L, M, K)
        Bt = be.encode(bt, eb, basis.moduli, t_bits)  # (L, N, K)
        Zt = be.product(A, Bt, basis.moduli, 1)  # (L, N, M): contract K
        ct = be.decode(Zt, basis.moduli, -eb, 1, "fp64")  # column scales as row runs of C^T
        return (ct * cp.ldexp(cp.ones((1, N)), -ea.reshape(1, N).astype(cp.int32))).T  # row scales: exact powers of two

    t_mma = timed(lambda: emu(mma), reps=3)
    t_cub = timed(lambda: emu(cub), reps=3)
    t64 = timed(lambda: a @ b, reps=3)
    c = emu(mma)
    ref = a @ b
    err = float(cp.abs(c - ref).max() / cp.abs(ref).max())
    fl = 2.0 * N**3
    res["dgemm"] = dict(N=N, s=s, t=t_bits, mma_s=t_mma, cublas_s=t_cub, f64_s=t64, mma_tflops=fl / t_mma / 1e12,
                        cublas_tflops=fl / t_cub / 1e12, f64_tflops=fl / t64 / 1e12, maxrel_vs_f64=err)
    rows.append((f"DGEMM N={N} s={s} (mma)", f"{fl / t_mma / 1e12:8.2f} TFLOP/s", f"CuPy f64 {fl / t64 / 1e12:.1f}"))
    rows.append((f"DGEMM N={N} s={s} (cuBLAS)", f"{fl / t_cub / 1e12:8.2f} TFLOP/s", f"max rel err vs f64 {err:.1e}"))


section("product", bench_product)
section("chain", bench_chain)
section("dgemm", bench_dgemm)

with open(f"{outdir}/device_check.json", "w") as f:
    json.dump(res, f, indent=1, default=str)
print()
print(f"device: {res['device']}   kernel tests rc={kernel_rc}   GPU tests rc={gpu_rc}")
for r in rows:
    print(f"{r[0]:<36} {r[1]:>18}   {r[2]}")
for k, v in res.items():
    if k.endswith("_error"):
        print(f"{k}: {v}")
PYEOF
echo "total: $(( $(date +%s) - T0 )) s"
