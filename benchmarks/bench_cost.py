"""What each accuracy policy costs against numpy on this CPU: the README's table, every ratio from one run.

For a chain of three mode products, a GEMM-shaped einsum and a DGEMM (on
U[-1, 1) data, and the DGEMM on phi = 4 data too), the time of numpy's
fastest float64 call and of ``rnstensor`` with ``moduli=None`` (the
default), ``'fast'``, ``rtol=1e-10`` and ``'auto'``, interleaved (a warm-up
round for all, then alternate rounds, best of each). numpy's baseline is the
faster of ``np.einsum(..., optimize=True)`` and ``np.einsum`` with a
precomputed path (``a @ b`` for the DGEMM). Prints one ratio per policy and
case; ``--json PATH`` writes the rows.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rnstensor as rt  # noqa: E402
from _timing import add_output_options, interleaved, parse_args, save_result  # noqa: E402

__all__ = ["cases", "main"]

POLICIES = ("default", "fast", "rtol=1e-10", "auto")


def _numpy_einsum(sub: str, *ops):
    """numpy's fastest einsum of ``ops``: ``optimize=True``, and the same with the path computed once."""
    path = np.einsum_path(sub, *ops, optimize="optimal")[0]
    return {"numpy optimize=True": lambda: np.einsum(sub, *ops, optimize=True),
            "numpy precomputed path": lambda: np.einsum(sub, *ops, optimize=path)}


def cases(scale: float = 1.0) -> list[dict]:
    """``{'name', 'numpy': {label: fn}, 'policies': {policy: fn}}`` per case (``scale`` < 1: smaller sizes)."""
    rng = np.random.default_rng(7)
    out = []
    B = max(64, int(4096 * scale))
    ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
    X = rng.uniform(-1, 1, (B, 8, 8, 8))
    plans = {p: rt.plan_chain(ops, [0, 1, 2], **kw) for p, kw in
             (("default", {}), ("fast", {"moduli": "fast"}), ("rtol=1e-10", {"rtol": 1e-10}), ("auto", {"moduli": "auto"}))}
    sub = "eijk,ai,bj,ck->eabc"
    out.append({"name": f"chain of 3 mode products, {B} x 8^3",
                "numpy": _numpy_einsum(sub, X, *ops),
                "policies": {p: (lambda plan=plan: plan(X)) for p, plan in plans.items()}})
    n = max(8, int(30 * scale ** 0.5))
    a, b = rng.uniform(-1, 1, (8, 8, n, n)), rng.uniform(-1, 1, (n, n, n, n))
    sub = "ijab,abcd->ijcd"
    kws = {"default": {}, "fast": {"moduli": "fast"}, "rtol=1e-10": {"rtol": 1e-10}, "auto": {"moduli": "auto"}}
    out.append({"name": f"einsum {sub} (64 x {n * n} x {n * n})",
                "numpy": _numpy_einsum(sub, a, b),
                "policies": {p: (lambda kw=kw: rt.einsum(sub, a, b, **kw)) for p, kw in kws.items()}})
    N = max(128, int(1024 * scale))
    from rnstensor.gemm_accuracy import gemm_dataset

    for data in ("uniform", "phi4"):
        A, Bm = (rng.uniform(-1, 1, (N, N)), rng.uniform(-1, 1, (N, N))) if data == "uniform" else \
            gemm_dataset("phi4", N, N, N, seed=5)
        out.append({"name": f"dgemm {N}^3, {'U[-1, 1)' if data == 'uniform' else 'phi = 4'}",
                    "numpy": {"numpy a @ b": lambda A=A, Bm=Bm: A @ Bm},
                    "policies": {p: (lambda A=A, Bm=Bm, kw=kw: rt.dgemm(A, Bm, **kw)) for p, kw in kws.items()}})
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="sizes times this (default 1: the README's)")
    ap.add_argument("--rounds", type=int, default=3)
    add_output_options(ap)
    args = parse_args(ap, argv)
    rows = []
    for case in cases(args.scale):
        fns = {**case["numpy"], **case["policies"]}
        best = interleaved(fns, args.rounds)
        base_label = min(case["numpy"], key=best.get)
        base = best[base_label]
        row = {"case": case["name"], "numpy": base_label, "numpy_s": base,
               **{f"{p}_ratio": best[p] / base for p in case["policies"]}}
        rows.append(row)
        print(f"{case['name']:<44} numpy {1e3 * base:8.2f} ms ({base_label})  " +
              "  ".join(f"{p} {row[f'{p}_ratio']:.1f}x" for p in case["policies"]), flush=True)
    save_result(args, "cost", {"rows": rows})
    return rows


if __name__ == "__main__":
    main()
