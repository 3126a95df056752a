"""What the classical default costs: ``dgemm(moduli=None)`` against ``moduli='fast'`` and numpy, same run.

``moduli=None`` widens the encoding until the classical componentwise bound
``gamma_k |A||B|`` holds entry by entry (from the rows' and columns' binade
spreads, then one float32 GEMM of the magnitudes,
:func:`rnstensor.gemm.classical_moduli`); rows wider than 49 moduli hold are
split exactly (:func:`rnstensor.gemm.row_slices`). ``'fast'`` is the former default, the 53-bit width. For each data set and N
(square N x N x N): the moduli count of each, the best wall time of
``--repeat`` calls after a warm-up of ``a @ b`` (numpy float64), ``fast``,
the default and the default's moduli count given explicitly (``same-s``: the
cost of the wider width apart from choosing it), measured one after the other; then on a smaller k x k x k
product (``--accuracy-n``) the largest componentwise error relative to
``gamma_k |A||B|`` of numpy, ``fast`` and the default against the exact
product (:mod:`rnstensor.gemm_accuracy`, Python integers).

Data: ``uniform`` U[-1, 1) (``random()``: 53-bit multiples, exact at the
53-bit width), ``normal`` N(0, 1) (full significands), ``phi2`` / ``phi4``
([2610.26945]'s ``(U - 1/2) exp(phi N)``), ``wide``: normal with one row of
``a`` and one column of ``b`` spanning 500 binades, paired so that every
term of their product matters (the split path: one row and one column
sliced).

Then ``moduli='auto'`` on the wide data (``--auto-sizes``): rows beyond 49
moduli split exactly, each entry's slice products summed in Python integers.

Usage: ``python benchmarks/bench_gemm_default.py [--sizes 256 512 1024] [--repeat 3] [--accuracy-n 96] [--auto-sizes 64 128 256] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import rnstensor as rt
from _timing import add_output_options, best_time, progress, parse_args, save_result
from rnstensor import gemm_accuracy as GA

DATA = ("uniform", "normal", "phi2", "phi4", "wide")


def dataset(name: str, N: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    if name in ("uniform", "phi2", "phi4"):
        return GA.gemm_dataset(name, N, N, N, seed)
    a, b = r.standard_normal((N, N)), r.standard_normal((N, N))
    if name == "wide":  # row 0 and column 0 span 500 binades and every term of their product matters
        h = N // 2
        a[0, :h] *= 2.0**-300
        a[0, h:] *= 2.0**200
        b[:h, 0] *= 2.0**300
        b[h:, 0] *= 2.0**-200
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--data", nargs="+", default=list(DATA), choices=DATA)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--accuracy-n", type=int, default=96)
    ap.add_argument("--auto-sizes", type=int, nargs="+", default=[64, 128, 256])
    add_output_options(ap)
    args = parse_args(ap)
    bar = progress(total=len(args.data) * (len(args.sizes) + 1) + len(args.auto_sizes), desc="bench_gemm_default",
                   unit="case")
    rows = []
    print(f"{'data':8} {'N':>5} {'s fast':>6} {'s def':>6} {'numpy ms':>9} {'fast ms':>8} {'def ms':>8} "
          f"{'same-s':>8} {'def/fast':>8} {'def/same':>8} {'def/numpy':>9}")
    for name in args.data:
        for N in args.sizes:
            a, b = dataset(name, N)
            s_fast, s_def = rt.gemm_moduli(a, b, "fast"), rt.gemm_moduli(a, b)
            t_np = best_time(lambda: a @ b, args.repeat)
            t_fast = best_time(lambda: rt.dgemm(a, b, moduli="fast"), args.repeat)
            t_def = best_time(lambda: rt.dgemm(a, b), args.repeat)
            # the same moduli given explicitly: what the wider width costs, apart from choosing it
            t_same = best_time(lambda: rt.dgemm(a, b, moduli=s_def), args.repeat) if s_def != s_fast else t_fast
            row = dict(data=name, N=N, s_fast=s_fast, s_default=s_def, numpy_ms=1e3 * t_np, fast_ms=1e3 * t_fast,
                       default_ms=1e3 * t_def, same_s_ms=1e3 * t_same, default_vs_fast=t_def / t_fast,
                       default_vs_same_s=t_def / t_same, default_vs_numpy=t_def / t_np, load=os.getloadavg()[0])
            rows.append(row)
            bar.update()
            bar.write(f"{name:8} {N:5d} {s_fast:6d} {s_def:6d} {row['numpy_ms']:9.1f} {row['fast_ms']:8.1f} "
                  f"{row['default_ms']:8.1f} {row['same_s_ms']:8.1f} {row['default_vs_fast']:8.2f} "
                  f"{row['default_vs_same_s']:8.2f} {row['default_vs_numpy']:9.1f}")
    auto_rows = []
    bar.write("\nmoduli='auto' on the wide data (split beyond 49 moduli, exact sums in Python integers):")
    bar.write(f"{'N':>5} {'s':>4} {'numpy ms':>9} {'default ms':>11} {'auto ms':>9} {'auto/default':>12}")
    for N in args.auto_sizes:
        a, b = dataset("wide", N)
        t_np = best_time(lambda: a @ b, args.repeat)
        t_def = best_time(lambda: rt.dgemm(a, b), args.repeat)
        t_auto = best_time(lambda: rt.dgemm(a, b, moduli="auto"), 1)
        row = dict(N=N, s=rt.gemm_moduli(a, b, "auto"), numpy_ms=1e3 * t_np, default_ms=1e3 * t_def,
                   auto_ms=1e3 * t_auto)
        auto_rows.append(row)
        bar.update()
        bar.write(f"{N:5d} {row['s']:4d} {row['numpy_ms']:9.2f} {row['default_ms']:11.1f} {row['auto_ms']:9.1f} "
              f"{t_auto / t_def:12.1f}")
    acc = []
    n = args.accuracy_n
    bar.write(f"\nmax componentwise error / (gamma_k |A||B|), {n} x {n} x {n} against the exact product:")
    bar.write(f"{'data':8} {'numpy':>10} {'fast':>10} {'default':>10}")
    for name in args.data:
        a, b = dataset(name, n, seed=1)
        got = {"numpy": a @ b, "fast": rt.dgemm(a, b, moduli="fast"), "default": rt.dgemm(a, b)}
        ref = GA.exact_gemm(a, b)
        e = {key: _componentwise(ref, C, a, b) for key, C in got.items()}
        acc.append(dict(data=name, N=n, **e))
        bar.update()
        bar.write(f"{name:8} {e['numpy']:10.3g} {e['fast']:10.3g} {e['default']:10.3g}")
    bar.close()
    save_result(args, "gemm_default", {"speed": rows, "auto": auto_rows, "accuracy": acc})


def _componentwise(ref, C, A, B) -> float:
    """max |C - AB| / (gamma_k (|A||B|)) with the exact product ``ref = (S, e)`` of :func:`exact_gemm`."""
    S, e = ref
    k = A.shape[1]
    gamma = k * 2.0**-53 / (1 - k * 2.0**-53)
    absS, abse = GA.exact_gemm(np.abs(A), np.abs(B))
    worst = 0.0
    from fractions import Fraction
    for i in range(C.shape[0]):
        for j in range(C.shape[1]):
            exact = Fraction(int(S[i, j])) * Fraction(2) ** int(e[i, j] if np.ndim(e) else e)
            bound = Fraction(int(absS[i, j])) * Fraction(2) ** int(abse[i, j] if np.ndim(abse) else abse)
            if bound:
                worst = max(worst, float(abs(Fraction(float(C[i, j])) - exact) / bound))
    return worst / gamma


if __name__ == "__main__":
    main()
