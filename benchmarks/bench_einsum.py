"""einsum overhead on the CPU: the sum-factorization chain through einsum / contract_expression vs mode_chain.

Expression ``'eijk,ai,bj,ck->eabc'`` (three n x n operators on a batch of n^3
tensors), s = 15 moduli. For each n: the best wall time of
``rnstensor.einsum`` (path and plan cached after the first call, operands
encoded per call), of a ``contract_expression`` with the operators as
constants (encoded once), of the equivalent ``mode_chain`` plan
(``plan_chain(...)(X)``), and of float64 ``numpy.einsum(optimize=True)`` and
``opt_einsum.contract`` — all in the same process on the same data. Two more
expressions (a batched GEMM and a three-operand network) show the general
path. Prints a table and writes JSON (``--json PATH``).

Usage: ``python benchmarks/bench_einsum.py [--sizes 4 8 16] [--batch 4096] [--repeat 5] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import opt_einsum

import rnstensor as rt
from _timing import add_output_options, best_time, progress, parse_args, save_result

EQ = "eijk,ai,bj,ck->eabc"


def chain_row(n: int, batch: int, repeat: int, seed: int = 0) -> dict:
    r = np.random.default_rng(seed)
    X = r.uniform(-1, 1, (batch, n, n, n))
    ops = [r.uniform(-1, 1, (n, n)) for _ in range(3)]
    expr = rt.contract_expression(EQ, X.shape, *ops, constants=[1, 2, 3])
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    times = {
        "einsum": best_time(lambda: rt.einsum(EQ, X, *ops), repeat),
        "expression": best_time(lambda: expr(X), repeat),
        "mode_chain": best_time(lambda: plan(X), repeat),
        "numpy": best_time(lambda: np.einsum(EQ, X, *ops, optimize=True), repeat),
        "opt_einsum": best_time(lambda: opt_einsum.contract(EQ, X, *ops), repeat),
    }
    ref = np.einsum(EQ, X, *ops, optimize=True)
    err = float(np.abs(expr(X) - ref).max() / np.abs(ref).max())
    return {"expr": EQ, "n": n, "batch": batch, "times": times, "max_rel_diff_vs_numpy": err}


def general_rows(repeat: int) -> list[dict]:
    r = np.random.default_rng(1)
    cases = [
        ("bij,bjk->bik", [(4096, 8, 8), (4096, 8, 8)]),
        ("abc,cd,db->a", [(64, 32, 64), (64, 48), (48, 32)]),
    ]
    rows = []
    for eq, shapes in cases:
        ops = [r.uniform(-1, 1, s) for s in shapes]
        times = {
            "einsum": best_time(lambda: rt.einsum(eq, *ops), repeat),
            "numpy": best_time(lambda: np.einsum(eq, *ops, optimize=True), repeat),
            "opt_einsum": best_time(lambda: opt_einsum.contract(eq, *ops), repeat),
        }
        rows.append({"expr": eq, "shapes": shapes, "times": times})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    add_output_options(ap)
    args = parse_args(ap)
    rows = []
    for n in progress(args.sizes, desc="bench_einsum", unit="size"):
        # n = 16 at batch 4096 is 2^24 entries: keep every size near 2^21 DoFs or the given batch, whichever is smaller
        batch = min(args.batch, max(1, (1 << 21) // n**3)) if n > 8 else args.batch
        rows.append(chain_row(n, batch, args.repeat))
    general = general_rows(args.repeat)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "threads": os.environ.get("NUMBA_NUM_THREADS", "default"),
        "s": 15,
    }
    print(f"\n{EQ}, s = 15, best of {args.repeat}; {meta['machine']}, numba threads {meta['threads']}, {meta['date']}")
    print("  n  batch | ms: einsum  expression  mode_chain   numpy  opt_einsum | expr/chain  einsum/chain  expr/numpy | rel diff")
    for row in rows:
        t = {k: v * 1e3 for k, v in row["times"].items()}
        print(
            f"{row['n']:3d} {row['batch']:6d} | {t['einsum']:10.1f} {t['expression']:11.1f} {t['mode_chain']:11.1f} "
            f"{t['numpy']:7.1f} {t['opt_einsum']:11.1f} | {t['expression'] / t['mode_chain']:10.3f} "
            f"{t['einsum'] / t['mode_chain']:13.3f} {t['expression'] / t['numpy']:11.2f} | {row['max_rel_diff_vs_numpy']:.1e}"
        )
    print("\ngeneral expressions (ms): einsum / numpy einsum(optimize=True) / opt_einsum")
    for row in general:
        t = {k: v * 1e3 for k, v in row["times"].items()}
        print(f"  {row['expr']:16s} {str(row['shapes']):32s} {t['einsum']:8.1f} {t['numpy']:8.1f} {t['opt_einsum']:8.1f}")
    save_result(args, "einsum_overhead", {"meta": meta, "chain": rows, "general": general})


if __name__ == "__main__":
    main()
