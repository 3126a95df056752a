"""Emulated DGEMM / ZGEMM on the CPU: effective GFLOP/s vs numpy float64 matmul in the same run, phase breakdown.

For square N x N x N problems (U[-1, 1) data) and each s: the best wall time
of ``rnstensor.dgemm(a, b, moduli=s)`` over ``--repeat`` calls after a
warm-up, its rate ``2 N^3 / time``, the rate of ``a @ b`` (numpy float64
BLAS) measured in the same run right before each s, and the phase split of
that best call (``rnstensor.gemm.PHASES``): encode (scaling + residues),
residue products (``mode_product``), decode (exact reconstruction), for
ZGEMM the 3M sums and differences in residues, and other (checks, moduli
choice, the rest of the wall time). ZGEMM (3M, ``8 N^3`` flops) with
``--complex``. Prints a table and writes JSON (``--json PATH``) with the
1-minute load average per row.

Usage: ``python benchmarks/bench_gemm.py [--sizes 256 512 1024 2048] [--moduli 8 12 16 20] [--complex] [--repeat 3] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import rnstensor as rt
from _timing import add_output_options, best_time, progress, parse_args, save_result
from rnstensor import gemm as G


def _best_instrumented(fn, repeat: int) -> tuple[float, dict]:
    """Best wall time of ``repeat`` calls after a warm-up, with the phase split (``G.PHASES``) of that best call.

    The phase hook costs a few ``perf_counter`` calls per GEMM; ``other`` is
    the rest of the wall time (checks, moduli choice, Python overhead).
    """
    fn()
    best, best_phases = float("inf"), {}
    for _ in range(repeat):
        G.PHASES = {}
        t0 = time.perf_counter()
        try:
            fn()
        finally:
            total = time.perf_counter() - t0
            phases, G.PHASES = dict(G.PHASES), None
        if total < best:
            phases["other"] = phases.get("other", 0.0) + max(total - sum(phases.values()), 0.0)
            best, best_phases = total, phases
    return best, best_phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--moduli", type=int, nargs="+", default=[8, 12, 16, 20])
    ap.add_argument("--complex", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    add_output_options(ap)
    args = parse_args(ap)

    rng = np.random.default_rng(0)
    cplx = args.complex
    flops_per = 8 if cplx else 2
    gemm = rt.zgemm if cplx else rt.dgemm
    results = []
    bar = progress(total=len(args.sizes) * len(args.moduli), desc="bench_gemm", unit="run")
    for N in args.sizes:
        a = rng.uniform(-1, 1, (N, N))
        b = rng.uniform(-1, 1, (N, N))
        if cplx:
            a = a + 1j * rng.uniform(-1, 1, (N, N))
            b = b + 1j * rng.uniform(-1, 1, (N, N))
        flops = flops_per * N**3
        for s in args.moduli:
            t_np = best_time(lambda: a @ b, args.repeat)  # right before each s: the ratio survives load changes
            # min_bits=0: every s is timed, however few bits it keeps
            t, phases = _best_instrumented(lambda: gemm(a, b, moduli=s, min_bits=0), args.repeat)
            total = t
            row = dict(
                N=N,
                s=s,
                t=G.gemm_width(s, N, "complex" if cplx else "real"),
                seconds=t,
                gflops=flops / t / 1e9,
                numpy_seconds=t_np,
                numpy_gflops=flops / t_np / 1e9,
                ratio_vs_numpy=t_np / t,
                phases={k: v / total for k, v in phases.items()},
                loadavg=os.getloadavg()[0],
            )
            results.append(row)
            ph = row["phases"]
            bar.update()
            bar.write(
                f"N={N:5d} s={s:2d} t={row['t']:3d}  {t * 1e3:9.1f} ms  {row['gflops']:7.2f} GFLOP/s  "
                f"numpy {row['numpy_gflops']:7.2f} GFLOP/s  x{row['ratio_vs_numpy']:.3f}  "
                f"encode {ph.get('encode', 0):5.1%} products {ph.get('products', 0):5.1%} "
                f"decode {ph.get('decode', 0):5.1%} other {ph.get('other', 0):5.1%}"
                + (f" 3M sums {ph.get('3m', 0):5.1%}" if cplx else "")
                + f"  load {row['loadavg']:.2f}"
            )
    bar.close()
    save_result(args, "gemm_throughput", {"rows": results})


if __name__ == "__main__":
    main()
