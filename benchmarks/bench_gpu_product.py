"""Residue product TOP/s on the GPU: the Hopper wgmma kernel vs the mma.sync kernel vs cuBLAS INT8, same run.

For each shape, every engine contracts the last axis of ``(L, M, K)`` residue
planes with an ``(L, N, K)`` operator (``CudaBackend.product``, CuPy arrays in
and out, the centered reduction included):

- ``wgmma``: product_wgmma.cu (sm_90a only; K % 16 == 0), reduction fused;
- ``mma``: product.cu (mma.sync), reduction fused;
- ``cublas``: ``cublasGemmStridedBatchedEx`` INT8 -> INT32 (TN) alone, the
  baseline's tensor-core rate, and ``cublas+red``: the backend's cuBLAS engine
  (the same GEMM plus the reduction kernel, 9 bytes per output entry).

Shapes: square GEMMs (M = N = K = 1024 .. 16384, L = 15 planes) and mode
products of an order-4 tensor (E, n, n, n) along its last axis with an n x n
operator (n = 8 .. 128, M = E n^2 rows, L = 15). Times are CUDA-event medians
of a few runs after a warm-up; TOP/s counts 2 L M N K; "floor" is
max(ops / INT8 peak, bytes / HBM bandwidth) (H200 datasheet numbers). Every
engine's output is compared bit for bit with the mma.sync kernel's. The run
keeps to a time budget: shapes go small to large and a shape whose predicted
cost exceeds what is left is skipped (and listed as skipped).

Usage: ``python benchmarks/bench_gpu_product.py OUTDIR [--budget 60] [--scale 1.0]``
or ``main(outdir, budget_s)`` from another script. Importable without a GPU.
Writes ``OUTDIR/bench_gpu_product.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

__all__ = ["main", "run_checked", "mismatches", "plan_shapes", "Shape", "INT8_PEAK", "HBM"]

INT8_PEAK = 1979e12  # dense INT8 tensor-core ops/s, H100/H200 SXM datasheet
HBM = 4.8e12  # bytes/s, H200 datasheet
L_PLANES = 15


class Shape:
    """One benchmark problem: ``L`` planes of ``(M, K) x (N, K)^T``."""

    def __init__(self, label: str, M: int, N: int, K: int, L: int = L_PLANES):
        self.label, self.M, self.N, self.K, self.L = label, int(M), int(N), int(K), int(L)

    @property
    def ops(self) -> float:
        return 2.0 * self.L * self.M * self.N * self.K

    @property
    def bytes(self) -> float:
        """int8 in and out (the fused kernels' traffic)."""
        return float(self.L) * (self.M * self.K + self.N * self.K + self.M * self.N)

    def floor_s(self) -> float:
        return max(self.ops / INT8_PEAK, self.bytes / HBM)

    def as_dict(self) -> dict:
        return dict(label=self.label, M=self.M, N=self.N, K=self.K, L=self.L, ops=self.ops, bytes=self.bytes)


def plan_shapes(scale: float = 1.0) -> list[Shape]:
    """The shapes, cheapest first; ``scale < 1`` shrinks them (a smoke run)."""

    def s(n, lo=16):
        return max(lo, int(round(n * scale / 16)) * 16)

    out = []
    for n in (8, 16, 32, 64, 128):  # mode products: (E, n, n, n) along the last axis, 2^24 entries a plane
        E = max(1, (1 << 24) // n**3)
        out.append(Shape(f"mode n={n}", max(1, int(E * n * n * scale)), n, n))
    for n in (1024, 2048, 4096, 8192, 16384):
        out.append(Shape(f"gemm {n}", s(n), s(n), s(n)))
    return sorted(out, key=lambda sh: sh.floor_s())


def _timed(cp, fn, reps: int, warm: int = 1) -> float:
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


def _planes(cp, moduli, shape):
    """Random centered residues on the device, one plane at a time (no int64 temporaries of the whole array)."""
    out = cp.empty((len(moduli),) + tuple(shape), cp.int8)
    for i, p in enumerate(moduli):
        out[i] = cp.random.randint(-(p // 2), (p + 1) // 2, size=shape, dtype=np.int32).astype(cp.int8)
    return out


def main(outdir: str | os.PathLike = ".", budget_s: float = 60.0, scale: float = 1.0, shapes=None) -> dict:
    """Run the benchmark within ``budget_s`` seconds of wall time; write ``outdir/bench_gpu_product.json``; return it."""
    import cupy as cp

    from rnstensor.backends.cuda import CudaBackend, _cublas_bindings, device_info, wgmma_fits
    from rnstensor.basis import Basis

    cublas = _cublas_bindings()  # None: no cuBLAS rows, the custom kernels still run

    t_start = time.perf_counter()
    info = device_info()
    if not info:
        raise RuntimeError("bench_gpu_product needs a CUDA device (CuPy sees none)")
    hopper = info["arch"] == "sm_90a"
    engines = {"mma": CudaBackend("mma")}
    if cublas is not None:
        engines["cublas"] = CudaBackend("cublas")
    if hopper:
        engines["wgmma"] = CudaBackend("wgmma")
    moduli = Basis.int8(L_PLANES).moduli
    # compile (or load) every kernel before the clock matters
    for be in engines.values():
        be.built_kernels()
    if cublas is not None:
        handle = cp.cuda.device.get_cublas_handle()
        if hasattr(cublas, "setPointerMode"):
            cublas.setPointerMode(handle, getattr(cublas, "CUBLAS_POINTER_MODE_HOST", 0))
        compute_32i = getattr(cublas, "CUBLAS_COMPUTE_32I", 72)
    one, zero = np.array(1, np.int32), np.array(0, np.int32)

    res = {"device": info, "budget_s": budget_s, "scale": scale, "int8_peak": INT8_PEAK, "hbm": HBM,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shapes": [], "skipped": [],
           "cublas": "available" if cublas is not None else "no cuBLAS bindings in this CuPy"}
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(os.fspath(outdir), "bench_gpu_product.json")

    def save() -> None:  # after every shape: a run stopped by its timeout keeps what it measured
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    # the slowest engine's rate on the last shape run: shapes grow, so it predicts the next one's cost cautiously
    slow_rate = 50e12  # ops/s assumed before the first measurement
    for sh in shapes if shapes is not None else plan_shapes(scale):
        left = budget_s - (time.perf_counter() - t_start)
        runs = 4 * (1 + 1 + 5)  # engines x (warm-up + check + reps)
        predicted = runs * max(sh.ops / slow_rate, sh.bytes / 1e12) + 0.5 + sh.bytes / 2e10  # + data setup
        if predicted > left:
            res["skipped"].append(dict(sh.as_dict(), predicted_s=predicted, left_s=left))
            continue
        row = sh.as_dict()
        row["floor_s"] = sh.floor_s()
        X = _planes(cp, moduli, (sh.M, sh.K))
        A = _planes(cp, moduli, (sh.N, sh.K))
        reps = 3 if sh.ops > 1e13 else 5
        ref = engines["mma"].product(A, X, moduli, 1)
        rates = []
        for name, be in engines.items():
            if name == "wgmma" and not wgmma_fits(be.arch, sh.M, sh.K, 1, sh.N, sh.L):
                row[name] = None  # K % 16 != 0: the engine would fall back to mma.sync
                continue
            t = _timed(cp, lambda: be.product(A, X, moduli, 1), reps)
            equal = bool((be.product(A, X, moduli, 1) == ref).all())
            key = "cublas+red" if name == "cublas" else name
            row[key] = dict(s=t, tops=sh.ops / t / 1e12, of_floor=sh.floor_s() / t, equal_mma=equal)
            rates.append(sh.ops / t)
        # cuBLAS GEMM alone (int32 out): the INT8 tensor-core baseline, no reduction
        if cublas is not None and sh.K % 4 == 0:
            acc = cp.empty((sh.L, sh.M, sh.N), cp.int32)

            def gemm_only():
                cublas.gemmStridedBatchedEx(handle, 1, 0, sh.N, sh.M, sh.K, one.ctypes.data, A.data.ptr, 3, sh.K,
                                            sh.N * sh.K, X.data.ptr, 3, sh.K, sh.M * sh.K, zero.ctypes.data,
                                            acc.data.ptr, 10, sh.N, sh.M * sh.N, sh.L, compute_32i, -1)

            t = _timed(cp, gemm_only, reps)
            row["cublas"] = dict(s=t, tops=sh.ops / t / 1e12, of_floor=sh.floor_s() / t)
            del acc
        slow_rate = min(rates)
        res["shapes"].append(row)
        save()
        del X, A, ref
        cp.get_default_memory_pool().free_all_blocks()
    res["elapsed_s"] = time.perf_counter() - t_start
    save()
    print(_table(res))
    print(f"wrote {path} ({res['elapsed_s']:.1f} s)")
    return res


def mismatches(res: dict) -> list[str]:
    """The shapes where an engine's residues differ from the mma.sync kernel's (each a failure of the check)."""
    return [f"{r['label']} {name}" for r in res.get("shapes", []) for name, v in r.items()
            if isinstance(v, dict) and v.get("equal_mma") is False]


def run_checked(outdir, budget_s: float = 60.0, scale: float = 1.0) -> int:
    """:func:`main`, then 0 if every engine agreed bit for bit, else 1 with the shapes named (device_check.sh)."""
    bad = mismatches(main(outdir, budget_s, scale))
    for what in bad:
        print(f"FAILED bitwise: {what}")
    return 1 if bad else 0


def _table(res: dict) -> str:
    cols = ("wgmma", "mma", "cublas", "cublas+red")
    lines = [f"residue product TOP/s, L = {L_PLANES} planes, {res['device'].get('name', '?')} ({res['device'].get('arch', '?')})",
             f"{'shape':<14}{'M':>9}{'N':>7}{'K':>7}" + "".join(f"{c:>12}" for c in cols) + f"{'best/floor':>12}{'bits':>6}"]
    for r in res["shapes"]:
        cells, best = [], 0.0
        for c in cols:
            v = r.get(c)
            cells.append(f"{v['tops']:12.1f}" if v else f"{'n/a':>12}")
            if v and c != "cublas":  # the GEMM alone produces no residues
                best = max(best, v["of_floor"])
        equal = all(v.get("equal_mma", True) for c in cols if (v := r.get(c)))
        lines.append(f"{r['label']:<14}{r['M']:>9}{r['N']:>7}{r['K']:>7}" + "".join(cells)
                     + f"{best:>12.1%}{'ok' if equal else 'DIFF':>6}")
    for r in res["skipped"]:
        lines.append(f"{r['label']:<14} skipped: predicted {r['predicted_s']:.1f} s > {r['left_s']:.1f} s left")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=60.0, help="seconds of wall time for the whole run (default 60)")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the shapes (a smoke run)")
    a = ap.parse_args()
    sys.exit(0 if main(a.outdir, a.budget, a.scale) else 1)
