"""GPU benchmarks of issue 8: chain throughput, the two ceilings, DGEMM/ZGEMM, accuracy on phi = 4 data.

Run on a CUDA device (CuPy): ``python benchmarks/bench_gpu.py [--out DIR] [--budget 200] [--scale 1]``,
or ``main(outdir, budget_s)`` from ``benchmarks/device_check.sh``; without one,
``--cpu-smoke`` (NumPy and the CPU backend) or ``--standin --scale 1e-5`` (the CUDA backend on
tests/cupy_standin.py) dry-run the script. Writes
``DIR/bench_gpu.json`` and prints a short table. Every speed is a ratio
against a baseline timed in the same process on the same device:

* **ceilings** -- a device-to-device copy (``cudaMemcpyAsync``, bytes read plus
  written), a cuBLAS INT8 GEMM (``cublasGemmEx``, TN, int32 out, random
  residues), and the FP32 / INT32 issue rates of three tiny kernels (independent
  FFMA, IMAD and LOP3+IADD3 chains); ``benchmarks/perf_model.py`` builds its
  floors and predictions from these numbers.
* **chain** -- GDoF/s for n in {4, 8, 16, 32, 64, 128}, d = 3 (axes 0, 1, 2),
  s = 15, 2^24 DoFs (times ``--scale``): the fused whole-chain kernel
  (``plan.run(X, backend='cuda', fused=True)``, n <= 16), the unfused RescaleBE
  (``fused=False``), the same steps as raw backend calls on device arrays with a
  per-kernel breakdown, Composed, and CuPy float64 einsum of the same chain
  (the baseline); each variant's normwise error against the float64 result;
  the floor of each (bytes / copy rate, INT8 work / INT8 rate; the instruction
  floor is added by perf_model.py, which reads the per-entry instruction counts).
* **dgemm / zgemm** -- effective TFLOP/s (2N^3, 8N^3 for ZGEMM) of the
  public ``rnstensor.dgemm(a, b, moduli=s)`` / ``zgemm`` on CuPy arrays (CuPy
  out, correctly rounded exact decode) for N in {4096, 8192, 16384}, s in
  {8, 12, 14, 16} (the other product engines at s = 14 and 16), with its
  phase split (scan, encode, products, decode; synchronized per phase in a
  second, instrumented call), against CuPy float64 / complex128 matmul.
* **peers** -- :mod:`bench_gpu_peers`: rt's default, ``'fast'`` and ``'auto'``
  against native FP64, cuBLAS's FP64 emulation (both strategies, a child
  process each) and nvmath's 8XINT8 where it imports, speed and accuracy on
  the same inputs, and the table of which call to make.
* **accuracy** -- phi = 4 data (``rnstensor.gemm_accuracy.gemm_dataset('phi4')``)
  of a smaller shape: the public ``rt.dgemm`` on device arrays (default s and
  each s) and CuPy float64 against the exact product (``ExactReference``:
  Python integers).

Timing: CUDA events around each call, warm-ups first, the median of several
repetitions (fewer when one call is long). A budget in seconds drops sizes
(recorded as skipped), never a correctness check. Missing pieces (the fused
kernel, CuPy input to the public API, another product engine) only skip their
row, with the error recorded. ``--probe`` runs one small n = 8 chain (for
``ncu``'s instruction counts; see device_check.sh) and exits.

``--cpu-smoke`` runs the same code with NumPy and the CPU backend at a tiny
scale (no GPU): it checks this script's shapes and arithmetic, not speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_gpu_peers  # noqa: E402  (benchmarks/ on the path, above)
from _gpu_env import Env  # noqa: E402

CHAIN_SIZES = (8, 4, 16, 32, 64, 128)  # n = 8 (the issue's target) first: a short budget drops the others
CHAIN_DOFS = 1 << 24
FUSED_MAX_N = 16
GEMM_SIZES = (4096, 8192, 16384)
GEMM_MODULI = (8, 12, 14, 16)
ZGEMM_MODULI = (14,)
PROBE_DOFS = 1 << 20  # the --probe chain: 2^20 DoFs at n = 8 (ncu divides its counts by this)

def _scale() -> float:
    return float(os.environ.get("RNSTENSOR_CHECK_SCALE", "1"))


class Budget:
    """Wall-clock budget: a section deadline and a check before each size."""

    def __init__(self, total_s: float):
        self.t0 = time.perf_counter()
        self.total = float(total_s)

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.t0)

    def deadline(self, share: float) -> float:
        """A section's deadline: ``share`` of what is left now."""
        return time.perf_counter() + share * max(self.left(), 0.0)


# ----- ceilings ---------------------------------------------------------------------------------

_MICRO = r"""
extern "C" __global__ void ffma_rate(float* out, float a, float b, int iters) {
    float x[8];
    #pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = threadIdx.x * 1e-3f + j;
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int u = 0; u < 8; ++u) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = fmaf(x[j], a, b);
        }
    }
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < 8; ++j) s += x[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void imad_rate(int* out, int a, int b, int iters) {
    int x[8];
    #pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = threadIdx.x + j;
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int u = 0; u < 8; ++u) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = x[j] * a + b;
        }
    }
    int s = 0;
    #pragma unroll
    for (int j = 0; j < 8; ++j) s ^= x[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void alu_rate(int* out, int a, int b, int iters) {
    int x[8];
    #pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = threadIdx.x + j;
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int u = 0; u < 8; ++u) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = (x[j] ^ a) + b;
        }
    }
    int s = 0;
    #pragma unroll
    for (int j = 0; j < 8; ++j) s ^= x[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def ceilings(env: Env, res: dict, rows: list, scale: float) -> None:
    """Copy bandwidth, cuBLAS INT8 GEMM rate and FP32 / INT32 thread-instruction rates, measured now."""
    cp = env.xp
    out: dict = {}
    res["ceilings"] = out
    if env.cpu:
        out["note"] = "cpu smoke run: no ceilings measured"
        return
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    sms = int(props["multiProcessorCount"])
    out["sms"] = sms
    out["clock_khz_max"] = int(props.get("clockRate", 0))
    out["l2_bytes"] = int(props.get("l2CacheSize", 0))
    # copy: 2 GiB (scaled), bytes read + bytes written
    nbytes = max(1 << 24, int((2 << 30) * scale)) // 16 * 16
    src = cp.random.random(nbytes // 8)
    dst = cp.empty_like(src)
    t = env.time(lambda: dst.data.copy_from_device_async(src.data, nbytes), reps=10, warm=2)
    t2 = env.time(lambda: cp.copyto(dst, src), reps=10, warm=2)
    best = min(t["median_s"], t2["median_s"])
    out["copy"] = {"bytes": nbytes, "memcpy_s": t["median_s"], "copyto_s": t2["median_s"],
                   "Bps": 2 * nbytes / best, "equal": bool((dst == src).all())}
    del src, dst
    env.free()
    rows.append(("ceiling: D2D copy", f"{2 * nbytes / best / 1e12:8.2f} TB/s", f"{nbytes / 2**30:.2f} GiB, read+write"))
    if env.standin:  # no cuBLAS and no device to time micro kernels on: the model takes its leads
        out["int8_skipped"] = out["issue_rates_skipped"] = "the CuPy stand-in: a real GPU measures it"
        rows.append(("ceiling: cuBLAS INT8, issue rates", "skipped", out["int8_skipped"]))
        return
    try:
        _int8_ceiling(env, out, rows, scale)
    except Exception as exc:  # the issue rates below still get measured
        traceback.print_exc()
        out["int8_error"] = f"{type(exc).__name__}: {exc}"
    _issue_rates(env, out, rows, sms)


def _int8_ceiling(env: Env, out: dict, rows: list, scale: float) -> None:
    """cuBLAS INT8 GEMM, TN, int32 out: the INT8 ceiling (random residues in [-128, 127])."""
    from rnstensor.backends.cuda import _cublas_bindings

    cp = env.xp
    cublas = _cublas_bindings()
    if cublas is None:
        raise RuntimeError("this CuPy has no cuBLAS bindings (cupy_backends.cuda.libs.cublas, cupy.cuda.cublas)")
    for N in sorted({max(256, int(8192 * scale ** (1 / 3)) // 256 * 256), max(256, int(16384 * scale ** (1 / 3)) // 256 * 256)}):
        A = cp.random.randint(-128, 128, (N, N), dtype=cp.int8)
        B = cp.random.randint(-128, 128, (N, N), dtype=cp.int8)
        C = cp.empty((N, N), cp.int32)
        one, zero = np.array(1, np.int32), np.array(0, np.int32)
        h = cp.cuda.device.get_cublas_handle()
        if hasattr(cublas, "setPointerMode"):
            cublas.setPointerMode(h, getattr(cublas, "CUBLAS_POINTER_MODE_HOST", 0))
        R8I = getattr(cp.cuda.runtime, "CUDA_R_8I", 3)
        R32I = getattr(cp.cuda.runtime, "CUDA_R_32I", 10)
        C32I = getattr(cublas, "CUBLAS_COMPUTE_32I", 72)

        def gemm():
            # C (col-major N x N) = A^T B with A, B K-contiguous (row-major N x K): the TN layout
            cublas.gemmEx(h, 1, 0, N, N, N, one.ctypes.data, A.data.ptr, R8I, N, B.data.ptr, R8I, N,
                          zero.ctypes.data, C.data.ptr, R32I, N, C32I, -1)

        t = env.time(gemm, reps=10, warm=2)
        # spot check: 64 entries against an int64 product on the host
        rng = np.random.default_rng(1)
        ii, jj = rng.integers(0, N, 64), rng.integers(0, N, 64)
        Ah, Bh, Ch = cp.asnumpy(A).astype(np.int64), cp.asnumpy(B).astype(np.int64), cp.asnumpy(C)
        ok = bool(all(Ch[j, i] == int(Ah[i] @ Bh[j]) for i, j in zip(ii, jj)))  # C[j, i] (row-major view) = A_i . B_j
        ops = 2.0 * N**3
        out.setdefault("int8_gemm", []).append({"N": N, "s": t["median_s"], "ops_per_s": ops / t["median_s"], "correct": ok})
        rows.append((f"ceiling: cuBLAS INT8 GEMM N={N}", f"{ops / t['median_s'] / 1e12:8.1f} TOP/s", f"spot check {'ok' if ok else 'WRONG'}"))
        del A, B, C
        env.free()
    out["int8_ops_per_s"] = max(r["ops_per_s"] for r in out["int8_gemm"])


def _issue_rates(env: Env, out: dict, rows: list, sms: int) -> None:
    """FFMA / IMAD / LOP3+IADD3 thread-instruction rates: independent chains, 64 ops per thread per iteration."""
    cp = env.xp
    mod = cp.RawModule(code=_MICRO)
    threads, blocks, iters = 256, sms * 8, 2048
    buf = cp.empty(threads * blocks, cp.float32)
    for name, a, b in (("ffma_rate", np.float32(0.999), np.float32(1e-3)), ("imad_rate", np.int32(3), np.int32(7)),
                       ("alu_rate", np.int32(0x5a5a), np.int32(13))):
        fn = mod.get_function(name)
        t = env.time(lambda: fn((blocks,), (threads,), (buf, a, b, np.int32(iters))), reps=5, warm=1)
        rate = threads * blocks * iters * 64 / t["median_s"]
        out[name] = {"thread_ops_per_s": rate, "s": t["median_s"],
                     "ops_per_sm_per_clk_at_max_clock": rate / sms / (out["clock_khz_max"] * 1e3) if out["clock_khz_max"] else None}
    ffma = out["ffma_rate"]["thread_ops_per_s"]
    out["issue_warp_inst_per_s"] = ffma / 32  # FFMA issues one warp instruction per clock per SMSP on sm_80..sm_90
    out["clock_hz_from_ffma"] = ffma / (sms * 128)
    rows.append(("ceiling: FFMA / IMAD / LOP3+IADD3", f"{ffma / 1e12:8.1f} Tops/s",
                 f"{out['imad_rate']['thread_ops_per_s'] / 1e12:.1f} / {out['alu_rate']['thread_ops_per_s'] / 1e12:.1f}; clock {out['clock_hz_from_ffma'] / 1e9:.2f} GHz"))
    del buf


# ----- chain ------------------------------------------------------------------------------------


def _chain_bytes_ops(plan, n: int, dofs: int) -> dict:
    """Bytes each kernel of the unfused RescaleBE chain moves at least, and the useful INT8 work (per run)."""
    s = len(plan.basis)
    L = s
    by = {"encode": dofs * (8 + L)}
    ops = 0.0
    prod_bytes = 0
    drop_bytes = 0
    for i, st in enumerate(plan.schedule.steps):
        prod_bytes += dofs * 2 * L  # L planes in, L out (square operators: DoF count unchanged)
        ops += 2.0 * n * L * dofs
        if st.dropped:
            out_L = s  # RescaleBE restores the basis
            drop_bytes += dofs * (L + out_L)
            L = out_L
    by["products"] = prod_bytes
    by["drop_extend"] = drop_bytes
    by["decode"] = dofs * (L + 8)
    return {"bytes": by, "bytes_total": sum(by.values()), "bytes_fused": 16 * dofs, "int8_ops": ops,
            "drops": [len(st.dropped) for st in plan.schedule.steps]}


def _chain_steps(env: Env, plan, X, n: int):
    """The RescaleBE chain as raw backend calls on device arrays: returns a callable and its event list.

    Timing only: the decode applies no scale (the kernels do the same work), so
    its output is not compared. Same calls as ChainPlan.apply.
    """
    be = env.engine("mma")
    basis, bits = plan.basis, plan.input_bits
    xp = env.xp
    Xh = env.asnumpy(X)
    E = X.shape[0]
    e = (bits - np.frexp(np.abs(Xh).reshape(E, -1).max(axis=1))[1]).astype(np.int64).reshape(E, 1, 1, 1)
    ops = [xp.asarray(np.asarray(op.residues)) for op in plan.encoded_operators]
    steps = plan.schedule.steps
    zero_e = np.zeros((E, 1, 1, 1), np.int64)
    marks: list = []

    def run(record: bool = False):
        if record:
            marks.clear()
            marks.append(("start", env.mark()))
        T = be.encode(X, e, basis.moduli, bits)
        if record:
            marks.append(("encode", env.mark()))
        active = basis.moduli
        for i, (A, st) in enumerate(zip(ops, steps)):
            idx = [basis.moduli.index(p) for p in active]
            T = be.product(A[idx] if len(idx) != len(basis) else A, T, active, i + 1)
            if record:
                marks.append((f"product{i}", env.mark()))
            if st.dropped:
                T, active = be.drop_extend(T, active, basis, tuple(st.dropped), True)
                if record:
                    marks.append((f"drop_extend{i}", env.mark()))
        y = be.decode(T, active, zero_e, 1, "fp64")
        if record:
            marks.append(("decode", env.mark()))
        return y

    def breakdown():
        run(record=True)
        env.sync()
        return {name: env.between(marks[i - 1][1], marks[i][1]) for i, (name, _) in enumerate(marks) if i > 0}

    return run, breakdown


def _run_api(env: Env, plan, X, fused):
    """``plan.run`` on the device array (CuPy in -> CuPy out) if the API takes it, else on a NumPy copy.

    ``fused=None`` passes no keyword; ``fused=False`` falls back to a plain
    ``plan.run`` when the API has no ``fused`` keyword yet (that is the unfused
    step-by-step path); ``fused=True`` without the keyword raises (recorded).
    Returns ``(callable, io, result)`` with io 'device' or 'numpy'.
    """
    kw = {} if fused is None else {"fused": fused}

    def call(x, kw):
        return plan.run(x, decode="fp64", backend=env.backend_name, **kw)

    def attempt(x):
        nonlocal kw
        try:
            return call(x, kw)
        except TypeError as exc:
            if "fused" in str(exc) and kw:
                if fused:
                    raise
                kw = {}
                return call(x, kw)
            raise

    try:
        y = attempt(X)
        if env.cpu or isinstance(y, env.xp.ndarray):
            k = dict(kw)
            return (lambda: call(X, k)), "device", y
    except TypeError as exc:
        if "fused" in str(exc):
            raise
    except Exception:
        pass
    Xh = env.asnumpy(X)
    y = attempt(Xh)
    k = dict(kw)
    return (lambda: call(Xh, k)), "numpy", y


def _relerr(env, y, ref) -> float:
    y = env.xp.asarray(y)
    return float(env.xp.linalg.norm((y - ref).ravel()) / env.xp.linalg.norm(ref.ravel()))


def _chain_plans(n: int):
    """RescaleBE and Composed plans of the n x n chain (d = 3, s = 15), and the generator that drew the operators."""
    import rnstensor as rt

    rng = np.random.default_rng(n)
    ops = [rng.uniform(-1, 1, (n, n)) for _ in range(3)]
    basis = rt.Basis.int8(15)
    return (ops, rt.plan_chain(ops, [0, 1, 2], moduli=basis, method="rescale_be"),
            rt.plan_chain(ops, [0, 1, 2], moduli=basis, method="composed"), rng)


def _fem_setup(kind: str, P: int, k: int, backend: str):
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    basis = TensorBasis(P)
    mesh = box_mesh(basis, shape=(k, k, k), curved=0.1)
    make = MassOperator if kind == "mass" else PoissonOperator
    data = mesh.qdata if kind == "mass" else mesh.G
    return basis, mesh, make, data, make(basis, data, backend=backend)


def fused_programs() -> list:
    """The fused programs the sections run (the chain's and the FEM operators'), for a build ahead of time."""
    from rnstensor.kernels import fused

    programs = [fused.compile_request(_chain_plans(n)[1].fusion_request((n, n, n)))
                for n in CHAIN_SIZES if n <= FUSED_MAX_N]
    return programs + [fused.compile_request(_fem_setup(kind, P, 1, "cpu")[4].fusion_request()) for kind, P in FEM_CASES]


def prebuild(env: Env, res: dict, rows: list) -> None:
    """Every kernel the sections load, compiled side by side (one process per core) before anything is timed."""
    if env.cpu:
        return
    from rnstensor.backends import get_backend
    from rnstensor.kernels import fused

    t0 = time.perf_counter()
    builds = get_backend("cuda").prebuild(fused_programs())
    res["prebuild"] = {"builds": builds, "seconds": time.perf_counter() - t0, "jobs": len(os.sched_getaffinity(0))}
    rows.append(("kernel builds (NVRTC, side by side)", f"{res['prebuild']['seconds']:.1f} s", f"{builds} builds"))


def bench_chain(env: Env, res: dict, rows: list, scale: float, deadline: float) -> None:

    xp = env.xp
    out: list = []
    res["chain"] = out
    dofs_target = max(1, int(CHAIN_DOFS * scale))
    ceil = res.get("ceilings", {})
    bw = (ceil.get("copy") or {}).get("Bps")
    r8 = ceil.get("int8_ops_per_s")
    for n in CHAIN_SIZES:
        if time.perf_counter() > deadline:
            out.append({"n": n, "skipped": "budget"})
            continue
        if n**3 > 64 * dofs_target:  # one tensor alone is far beyond the scaled problem (a smoke or dry run)
            out.append({"n": n, "skipped": f"scale: one {n}^3 tensor is over 64x the {dofs_target} DoFs asked for"})
            continue
        E = max(1, dofs_target // n**3)
        dofs = E * n**3
        row: dict = {"n": n, "E": E, "dofs": dofs, "d": 3, "s": 15}
        out.append(row)
        try:
            ops, plan, planc, rng = _chain_plans(n)
            row.update(drops=list(plan.drops), bits=plan.bits)
            row.update(_chain_bytes_ops(plan, n, dofs))
            X = xp.asarray(rng.uniform(-1, 1, (E, n, n, n)))
            O = [xp.asarray(o) for o in ops]

            def f64():
                Y = xp.einsum("ai,eijk->eajk", O[0], X)
                Y = xp.einsum("bj,eajk->eabk", O[1], Y)
                return xp.einsum("ck,eabk->eabc", O[2], Y)

            ref = f64()
            t = env.time(f64)
            row["f64_einsum"] = {**t, "gdofs": dofs / t["median_s"] / 1e9}
            variants = [("unfused", plan, False), ("composed", planc, None)]
            if n <= FUSED_MAX_N:
                # the plan-specialized fused build (the default) and the generic one (plan read from memory)
                variants[:0] = [("fused", plan, True), ("fused_generic", plan, True)]
            results = {}
            for name, p, fused in variants:
                be = None
                try:
                    if name == "fused_generic" and not env.cpu:
                        from rnstensor.backends import get_backend

                        be = get_backend("cuda")
                        be.specialize_chains = False
                    fn, io, y = _run_api(env, p, X, fused)
                    results[name] = y
                    t = env.time(fn, reps=5, max_s=4.0)
                    row[name] = {**t, "io": io, "gdofs": dofs / t["median_s"] / 1e9, "relerr_vs_f64": _relerr(env, y, ref),
                                 "vs_f64": row["f64_einsum"]["median_s"] / t["median_s"]}
                except Exception as exc:
                    row[name] = {"error": f"{type(exc).__name__}: {exc}"}
                finally:
                    if be is not None:
                        be.specialize_chains = "auto"
            if "fused" in results and "unfused" in results:
                a, b = env.asnumpy(results["fused"]), env.asnumpy(results["unfused"])
                row["fused"]["bitwise_equal_unfused"] = bool(np.array_equal(np.asarray(a).view(np.uint64), np.asarray(b).view(np.uint64)))
            # the unfused steps as raw backend calls (device arrays, no API overhead) + per-kernel times
            try:
                run, breakdown = _chain_steps(env, plan, X, n)
                t = env.time(run, reps=5, max_s=3.0)
                parts = [breakdown() for _ in range(3)]
                row["steps"] = {**t, "gdofs": dofs / t["median_s"] / 1e9,
                                "kernels_s": {k: float(statistics.median(p[k] for p in parts)) for k in parts[0]}}
            except Exception as exc:
                row["steps"] = {"error": f"{type(exc).__name__}: {exc}"}
            # floors from the two ceilings (the instruction floor: perf_model.py)
            if bw and r8:
                row["floor_bytes_s"] = {"fused": row["bytes_fused"] / bw, "unfused": row["bytes_total"] / bw}
                row["floor_int8_s"] = row["int8_ops"] / r8
            del X, O, ref, results
            env.free()
        except Exception as exc:
            traceback.print_exc()
            row["error"] = f"{type(exc).__name__}: {exc}"
        cells = []
        for v in ("fused", "unfused", "steps", "composed", "f64_einsum"):
            r = row.get(v)
            if isinstance(r, dict) and "gdofs" in r:
                cells.append(f"{v} {r['gdofs']:.2f}")
            elif isinstance(r, dict) and "error" in r:
                cells.append(f"{v} ERR")
        rows.append((f"chain n={n} ({dofs / 2**20:.0f} Mi DoF)", "GDoF/s", ", ".join(cells)))


# ----- DGEMM / ZGEMM --------------------------------------------------------------------------


def _gemm_sizes(scale: float) -> list[int]:
    f = scale ** (1 / 3)
    # largest first (N = 16384 is the issue's target): a short budget drops the small sizes
    return sorted({max(128, int(N * f) // 64 * 64) for N in GEMM_SIZES}, reverse=True)


class _Engine:
    """The public API on one product engine: the registered 'cuda' backend swapped for ``env.engine(name)``."""

    def __init__(self, env: Env, name: str):
        self.env, self.name = env, name

    def __enter__(self):
        from rnstensor import backends

        self.saved = backends._BACKENDS.get(self.env.backend_name)
        backends._BACKENDS[self.env.backend_name] = self.env.engine(self.name)

    def __exit__(self, *exc):
        from rnstensor import backends

        backends._BACKENDS[self.env.backend_name] = self.saved


def _time_phases(env: Env, fn, reps: int, max_s: float) -> dict:
    """Median of ``fn()`` with the public GEMM's phase split (``rnstensor.gemm.PHASES``, synchronized at each phase).

    The call is timed twice: bare (the number reported) and instrumented (the split; each phase boundary
    synchronizes the device, so the phases add up to a little more than the bare call).
    """
    import rnstensor.gemm as G

    t = env.time(fn, reps=reps, max_s=max_s)
    G.PHASES, G.PHASE_SYNC = {}, env.sync
    try:
        fn()
        env.sync()
        t["phases_s"] = dict(G.PHASES)
    finally:
        G.PHASES, G.PHASE_SYNC = None, None
    return t


def _infeasible(key: str, k: int, s: int) -> str | None:
    """Why ``rt.dgemm`` / ``rt.zgemm`` refuses ``moduli=s`` at contraction length ``k`` (the ``min_bits`` rule), or None.

    Asked of the library's own width rule, so the benchmark's moduli lists need
    not follow its defaults: a refused point is a skip with the reason, never
    an error row.
    """
    import rnstensor as rt
    from rnstensor.gemm import gemm_width
    from rnstensor.planner.methods import MIN_BITS

    try:
        t = gemm_width(s, k, "complex" if key == "zgemm" else "real")
    except (rt.PlanError, rt.RNSRangeError) as exc:
        return f"infeasible: {exc}"
    if t < MIN_BITS:
        return (f"infeasible: {s} moduli keep {t} bits at k={k}, below min_bits={MIN_BITS} (the library refuses "
                "the plan)")
    return None


def bench_gemm(env: Env, res: dict, rows: list, scale: float, deadline: float, cplx: bool) -> None:
    """The public ``rt.dgemm`` / ``rt.zgemm`` on device arrays (CuPy in, CuPy out) against CuPy float64 matmul."""
    import rnstensor as rt

    xp = env.xp
    key = "zgemm" if cplx else "dgemm"
    out: list = []
    res[key] = out
    rng = np.random.default_rng(16)
    moduli = ZGEMM_MODULI if cplx else GEMM_MODULI
    flops_per = 8.0 if cplx else 2.0
    fn = rt.zgemm if cplx else rt.dgemm
    for N in _gemm_sizes(scale):
        if time.perf_counter() > deadline:
            out.append({"N": N, "skipped": "budget"})
            continue
        if cplx:
            a = xp.asarray(rng.standard_normal((N, N)) + 1j * rng.standard_normal((N, N)))
            b = xp.asarray(rng.standard_normal((N, N)) + 1j * rng.standard_normal((N, N)))
        else:
            a = xp.asarray(rng.standard_normal((N, N)))
            b = xp.asarray(rng.standard_normal((N, N)))
        fl = flops_per * N**3
        t64 = env.time(lambda: a @ b, reps=5, max_s=3.0)
        ref = a @ b
        base = {"N": N, "f64": {**t64, "tflops": fl / t64["median_s"] / 1e12}}
        for s in moduli:
            if time.perf_counter() > deadline:
                out.append({**base, "s": s, "skipped": "budget"})
                continue
            row = {**base, "s": s, "timed": f"rnstensor.{key}(a, b, moduli={s}) on {'NumPy' if env.cpu else 'CuPy'} "
                                             "arrays (the public API)"}
            out.append(row)
            why = _infeasible(key, N, s)
            if why:
                row["skipped"] = why
                rows.append((f"rt.{key} N={N} s={s}", "skipped", why))
                continue
            for eng in env.engines:
                if eng != "mma" and s not in (14, 16):
                    continue  # the other engines at the issue's headline points
                try:
                    with _Engine(env, eng):
                        t = _time_phases(env, lambda: fn(a, b, moduli=s, backend=env.backend_name), 3, 3.0)
                        c = fn(a, b, moduli=s, backend=env.backend_name)
                    row[eng] = {**t, "tflops": fl / t["median_s"] / 1e12, "vs_f64": t64["median_s"] / t["median_s"],
                                "relerr_vs_f64": _relerr(env, c, ref),
                                "int8_ops": (3.0 if cplx else 1.0) * 2.0 * s * N**3}
                    del c
                except Exception as exc:
                    traceback.print_exc()
                    row[eng] = {"error": f"{type(exc).__name__}: {exc}"}
                env.free()
            for eng in env.engines:
                r = row.get(eng, {})
                if "tflops" in r:
                    ph = r.get("phases_s", {})
                    split = "/".join(f"{ph.get(k, 0.0) * 1e3:.1f}" for k in ("other", "encode", "products", "decode"))
                    rows.append((f"rt.{key} N={N} s={s} ({eng}, {'NumPy' if env.cpu else 'CuPy'} in/out)", f"{r['tflops']:8.2f} TFLOP/s",
                                 f"{r['vs_f64']:.2f}x CuPy f64 ({base['f64']['tflops']:.1f}); scan/enc/prod/dec {split} ms"))
        del a, b, ref
        env.free()
        rows.append((f"{key.upper()} N={N} CuPy {'complex128' if cplx else 'float64'} matmul",
                     f"{base['f64']['tflops']:8.2f} TFLOP/s", "baseline"))


def bench_accuracy(env: Env, res: dict, rows: list, scale: float, deadline: float) -> None:
    """phi = 4 data: the public ``rt.dgemm`` on device arrays (default s and s in GEMM_MODULI) and CuPy f64 vs exact."""
    import rnstensor as rt
    from rnstensor.gemm_accuracy import ExactReference, gemm_dataset

    m = n = 256 if scale >= 0.05 else 32
    k = 4096 if scale >= 0.05 else 256
    A, B = gemm_dataset("phi4", m, k, n, seed=4)
    t0 = time.perf_counter()
    ref = ExactReference.of(A, B)
    out: dict = {"m": m, "k": k, "n": n, "dataset": "phi4", "reference_s": time.perf_counter() - t0}
    res["accuracy_phi4"] = out
    xp = env.xp
    a, b = xp.asarray(A), xp.asarray(B)
    out["cupy_f64"] = ref.metrics(env.asnumpy(a @ b))
    rows.append((f"accuracy phi=4 {m}x{k}x{n} CuPy f64", f"{out['cupy_f64']['normwise']:.1e}", f"max ulp {out['cupy_f64']['max_ulp']:.3g}"))
    for label, kw in [("api_default", {})] + [(f"api_s{s}", {"moduli": s}) for s in GEMM_MODULI + (20,)]:
        if time.perf_counter() > deadline:
            out[label] = {"skipped": "budget"}
            continue
        why = _infeasible("dgemm", k, kw["moduli"]) if kw else None
        if why:
            out[label] = {"skipped": why}
            rows.append((f"accuracy phi=4 rt.dgemm {kw}", "skipped", why))
            continue
        try:
            c = rt.dgemm(a, b, backend=env.backend_name, **kw)  # device arrays in, a device array out
            out[label] = met = ref.metrics(np.asarray(env.asnumpy(c)))
            rows.append((f"accuracy phi=4 rt.dgemm {kw or 'default s'}", f"{met['normwise']:.1e}",
                         f"max ulp {met['max_ulp']:.3g}, CR {met['cr_percent']:.1f}%"))
        except Exception as exc:
            out[label] = {"error": f"{type(exc).__name__}: {exc}"}


# ----- the probe for ncu --------------------------------------------------------------------------


def probe(env: Env) -> dict:
    """One small n = 8 chain (PROBE_DOFS DoFs): the steps path, then the fused API; for ncu's counters."""
    n = 8
    E = PROBE_DOFS // n**3
    _, plan, _, rng = _chain_plans(n)  # the benchmark's n = 8 plan: its kernel is in the cache already
    X = env.xp.asarray(rng.uniform(-1, 1, (E, n, n, n)))
    run, _ = _chain_steps(env, plan, X, n)
    run()
    info = {"n": n, "dofs": E * n**3, "drops": list(plan.drops)}
    try:
        plan.run(X, decode="fp64", backend=env.backend_name, fused=True)
        info["fused"] = True
    except Exception as exc:
        info["fused"] = f"{type(exc).__name__}: {exc}"
    env.sync()
    return info


# ----- main ---------------------------------------------------------------------------------------


def _device(env: Env) -> dict:
    if env.cpu:
        return {"name": "cpu smoke run (NumPy + CPU backend)"}
    from rnstensor.backends.cuda import device_info

    return device_info()


FEM_DOFS = 1 << 22  # nodal DoFs (element-local) per FEM operator run, times --scale
FEM_CASES = (("mass", 4), ("poisson", 4), ("mass", 8), ("poisson", 8))


def bench_fem(env: Env, res: dict, rows: list, scale: float, deadline: float) -> None:
    """FEM operators as one kernel (``CudaBackend.chain`` on device arrays) vs the same program in CuPy float64.

    The baseline runs the operator's own program (``FloatRunner``) with
    ``xp.einsum`` products and the float64 fields on the device. The fused
    result is checked bit for bit against the CPU backend on the first 32
    elements. Elements are cubes of a ``k x k x k`` box (curved), ``P`` nodes
    per axis, ``Q = P + 1`` Gauss points.
    """
    from rnstensor.backends import get_backend
    from rnstensor.fem.operators import _matrices
    from rnstensor.fem.program import FloatRunner
    from rnstensor.kernels import fused
    from rnstensor.fem.fused import operator_field

    xp = env.xp
    out: list = []
    res["fem"] = out
    rng = np.random.default_rng(6)
    for kind, P in FEM_CASES:
        if time.perf_counter() > deadline:
            out.append({"kind": kind, "P": P, "skipped": "budget"})
            continue
        k = max(1, round((max(1, int(FEM_DOFS * scale)) / P**3) ** (1 / 3)))
        row: dict = {"kind": kind, "P": P, "elements": k**3, "dofs": k**3 * P**3}
        out.append(row)
        try:
            basis, mesh, make, data, op = _fem_setup(kind, P, k, env.backend_name)
            u = rng.standard_normal((mesh.nelem,) + (P,) * 3)
            ud = xp.asarray(u)
            mats = {key: xp.asarray(A) for key, A in _matrices(basis).items()}
            fields = {key: xp.asarray(F) for key, F in op._float_fields().items()}

            def product(z, key, ax):
                sub = "ijk"
                o = sub[:ax] + "z" + sub[ax + 1:]
                return xp.einsum(f"z{sub[ax]},e{sub}->e{o}", mats[key], z)

            run = FloatRunner(product, fields)
            t = env.time(lambda: op._program(run, ud, 3), reps=5, max_s=3.0)
            row["f64"] = {**t, "gdofs": row["dofs"] / t["median_s"] / 1e9}
            rows.append((f"FEM {kind} P={P} CuPy float64 program", f"{row['f64']['gdofs']:.2f} GDoF/s", "baseline"))
            if env.cpu:
                continue
            be = get_backend("cuda")
            prog = fused.compile_request(op.fusion_request())
            field, fexp = operator_field(op)
            fd, fe = xp.asarray(field), xp.asarray(fexp)
            row["program"] = {"ops": int(prog.ints[1]), "slots": int(prog.ints[20]), "tensors_per_block": prog.nb,
                              "shared_bytes": prog.shared_bytes, "specialized": fused.specialize_by_default(prog)}
            y = be.chain(prog, ud, "fp64", field=fd, fexp=fe)
            t = env.time(lambda: be.chain(prog, ud, "fp64", field=fd, fexp=fe), reps=5, max_s=3.0)
            row["fused"] = {**t, "gdofs": row["dofs"] / t["median_s"] / 1e9,
                            "vs_f64": row["f64"]["median_s"] / t["median_s"]}
            n = min(32, mesh.nelem)
            ref = make(basis, data[:n], backend="cpu").apply(u[:n])
            row["fused"]["bitwise_cpu_first_elements"] = bool(np.array_equal(
                np.asarray(env.asnumpy(y[:n])).view(np.uint64), ref.view(np.uint64)))
            rows.append((f"FEM {kind} P={P} fused kernel", f"{row['fused']['gdofs']:.2f} GDoF/s",
                         f"{row['fused']['vs_f64']:.2f}x CuPy f64; bitwise {row['fused']['bitwise_cpu_first_elements']}"))
        except Exception as exc:
            traceback.print_exc()
            row["error"] = f"{type(exc).__name__}: {exc}"
        env.free()


def main(outdir: str = "benchmarks/results", budget_s: float = 200.0, scale: float | None = None,
         cpu_smoke: bool = False) -> dict:
    scale = _scale() if scale is None else float(scale)
    os.makedirs(outdir, exist_ok=True)
    env = Env(cpu_smoke)
    budget = Budget(budget_s)
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": _device(env), "scale": scale,
                 "budget_s": budget_s, "engines": env.engines, "engines_missing": env._engines.get("_missing", {})}
    rows: list = []
    sections = (
        ("prebuild", 0.0, lambda dl: prebuild(env, res, rows)),
        ("ceilings", 0.10, lambda dl: ceilings(env, res, rows, scale)),
        ("chain", 0.35, lambda dl: bench_chain(env, res, rows, scale, dl)),
        ("fem", 0.2, lambda dl: bench_fem(env, res, rows, scale, dl)),
        # which call a GPU user should make: rt's policies, native FP64, cuBLAS's emulation, nvmath (same run)
        ("peers", 0.5, lambda dl: bench_gpu_peers.bench_peers(env, res, rows, scale, dl)),
        ("dgemm", 0.5, lambda dl: bench_gemm(env, res, rows, scale, dl, cplx=False)),
        ("zgemm", 0.4, lambda dl: bench_gemm(env, res, rows, scale, dl, cplx=True)),
        ("accuracy", 0.95, lambda dl: bench_accuracy(env, res, rows, scale, dl)),
    )
    timings = res.setdefault("section_s", {})

    def save() -> None:  # after each section: a kill keeps the rest
        with open(os.path.join(outdir, "bench_gpu.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)

    for name, share, body in sections:
        t0 = time.perf_counter()
        if budget.left() <= 1.0:
            res[name + "_skipped"] = "budget"
            continue
        try:
            body(budget.deadline(share))
        except Exception as exc:  # every section reports what it could
            traceback.print_exc()
            res[name + "_error"] = f"{type(exc).__name__}: {exc}"
        timings[name] = time.perf_counter() - t0
        print(f"-- {name}: {timings[name]:.1f} s", flush=True)
        save()
    save()  # the sections skipped at the end
    print()
    print(f"device: {res['device']}   scale {scale}   engines {env.engines}")
    for r in rows:
        print(f"{r[0]:<44} {r[1]:>18}   {r[2]}")
    for k, v in res.items():
        if k.endswith("_error"):
            print(f"{k}: {v}")
    return res


def failures(res) -> list[str]:
    """Every error a run recorded (``"error"`` and ``"*_error"`` entries, anywhere in ``res``), as ``path: message``.

    Skips (a budget, an infeasible plan, a peer that needs a real GPU) are not
    failures; a section or row that raised is.
    """
    out: list[str] = []

    def walk(x, path: str) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if (k == "error" or str(k).endswith("_error")) and isinstance(v, str):
                    out.append(f"{path}{k}: {v}")
                else:
                    walk(v, f"{path}{k}.")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{path}{i}.")

    walk(res, "")
    return out


def run_checked(outdir: str = "benchmarks/results", budget_s: float = 200.0) -> int:
    """:func:`main`, then 0 if nothing failed, else 1 with every failure printed (device_check.sh's step 4)."""
    bad = failures(main(outdir, budget_s))
    for line in bad:
        print(f"FAILED {line}")
    return 1 if bad else 0


def summary(resdir: str) -> dict:
    """The short table of a run's JSON under ``resdir`` (printed last by device_check.sh), also as ``summary.json``.

    Speeds are ratios against CuPy measured in the same run.
    """
    lines: list[str] = []
    out: dict = {"lines": lines}
    try:
        with open(os.path.join(resdir, "bench_gpu.json")) as f:
            r = json.load(f)
    except (OSError, ValueError) as exc:
        lines.append(f"no bench_gpu.json: {exc}")
        r = {}
    c = r.get("ceilings", {})
    if c.get("copy"):
        lines.append(f"ceilings: copy {c['copy']['Bps'] / 1e12:.2f} TB/s, cuBLAS INT8 "
                     f"{c.get('int8_ops_per_s', 0) / 1e12:.0f} TOP/s, "
                     f"FFMA {c.get('ffma_rate', {}).get('thread_ops_per_s', 0) / 1e12:.1f} T/s")
    for row in r.get("chain", []):
        if "dofs" not in row:
            continue
        cells = [f"{v} {row[v]['gdofs']:.2f}" for v in ("fused", "unfused", "steps", "composed", "f64_einsum")
                 if isinstance(row.get(v), dict) and "gdofs" in row[v]]
        lines.append(f"chain n={row['n']:<4} GDoF/s: " + ", ".join(cells))
    for key in ("dgemm", "zgemm"):
        for row in r.get(key, []):
            m = row.get("mma") or {}
            if "tflops" in m:
                lines.append(f"{key} N={row['N']:<6} s={row['s']:<3} {m['tflops']:7.1f} TFLOP/s = {m['vs_f64']:.2f}x "
                             f"CuPy ({row['f64']['tflops']:.1f})")
    for k, v in r.get("accuracy_phi4", {}).items():
        if isinstance(v, dict) and "normwise" in v:
            lines.append(f"phi=4 {k:<14} normwise {v['normwise']:.1e}  max ulp {v['max_ulp']:.3g}")
    peers = r.get("peers") or {}
    for name, info in (peers.get("peers") or {}).items():
        state = info.get("skipped") or ("active" if info.get("active") else info.get("note", ""))
        lines.append(f"peer {name}: {state}")
    if peers.get("table"):
        lines += ["", "which call to make (same run, same device; speed against native FP64):"] + list(peers["table"])
    out["verdicts"] = peers.get("verdicts", [])
    out["failures"] = failures(r)
    lines += [f"FAILED {f}" for f in out["failures"]]
    with open(os.path.join(resdir, "summary.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--summary", metavar="DIR", help="print the short table of DIR/bench_gpu.json and write DIR/summary.json")
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--scale", type=float, default=None, help="problem-size factor (default $RNSTENSOR_CHECK_SCALE or 1)")
    ap.add_argument("--cpu-smoke", action="store_true", help="NumPy + CPU backend, tiny sizes: checks the script, no GPU")
    ap.add_argument("--probe", action="store_true", help="one n = 8 chain of 2^20 DoFs for ncu, then exit")
    ap.add_argument("--standin", action="store_true",
                    help="dry run of the GPU code paths without a GPU: CuPy replaced by tests/cupy_standin.py, whose "
                         "launches run host builds of the kernels (checks the script, not speed; use a small --scale)")
    args = ap.parse_args()
    if args.summary:
        print("\n".join(summary(args.summary)["lines"]))
        sys.exit(0)
    if args.standin:
        sys.path.insert(0, os.path.join(HERE, "..", "tests"))
        import cupy_standin

        cupy_standin.install_for_process()  # strict: CuPy's rules, as on the device
    if args.probe:
        print(json.dumps(probe(Env(args.cpu_smoke))))
    else:
        res = main(args.out, args.budget, args.scale if args.scale is not None else (2e-4 if args.cpu_smoke else None),
                   args.cpu_smoke)
        sys.exit(1 if failures(res) else 0)
