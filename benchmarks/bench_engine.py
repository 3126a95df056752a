"""One engine choice (issue 32, item 3): ``rt.matmul`` of a stack against ``rt.einsum`` of it, and a GEMM-shaped
``rt.einsum`` against ``rt.dgemm`` of its GEMM, every ratio from one interleaved run.

Cases, each on U[-1, 1) data and on phi = 4 data (``randn * exp(4 randn)``), the stack also complex (both
parts U[-1, 1)):

- a stack of small matrices: ``rt.matmul(A, B)`` with ``A`` (batch, 50, 60) and
  ``B`` (batch, 60, 40), against ``rt.einsum('bij,bjk->bik', A, B)`` (the same
  products; their bits differ: matmul promises each matrix ``rt.dgemm``'s
  result, einsum the expression's);
- a stack times one matrix: ``rt.matmul(A, W)`` with ``W`` (60, 40) shared by
  every matrix, against ``rt.einsum('bij,jk->bik', A, W)`` (by default the same bits:
  both give each matrix dgemm's result alone);
- the same as a GEMM-shaped einsum: ``rt.einsum('bij,jk->bik', A, W)`` against
  ``rt.dgemm`` of its (batch * 50 x 60) @ (60 x 40) GEMM (many rows, a short k);
- a GEMM-shaped einsum: ``rt.einsum('ijab,abcd->ijcd', a, b)`` with ``a`` (8, 8,
  n, n), ``b`` (n, n, n, n), against ``rt.dgemm`` of its (64 x n^2) @ (n^2 x n^2)
  GEMM (the reshapes counted on the dgemm side).

Each pair with the default policy (``moduli=None``), ``'fast'`` and ``'auto'``;
a warm-up round for all, then alternate rounds, best of each. The targets:
both ratios at most 1.3. numpy's own time is printed for scale.
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

POLICIES = {"default": {}, "fast": {"moduli": "fast"}, "auto": {"moduli": "auto"}}
TARGET = 1.3


def _data(rng, shape, kind: str):
    if kind == "uniform":
        return rng.uniform(-1, 1, shape)
    if kind == "complex":
        return rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)
    return rng.standard_normal(shape) * np.exp(4 * rng.standard_normal(shape))


def cases(batch: int = 64, n: int = 30, kinds=("uniform", "phi=4", "complex")) -> list[dict]:
    """``{'name', 'ours', 'against', 'numpy'}`` per case and policy: two callables to compare, and numpy's."""
    rng = np.random.default_rng(11)
    out = []
    for kind in kinds:
        A, B = _data(rng, (batch, 50, 60), kind), _data(rng, (batch, 60, 40), kind)
        if kind != "complex":
            a, b = _data(rng, (8, 8, n, n), kind), _data(rng, (n, n, n, n), kind)
            W = _data(np.random.default_rng(12), (60, 40), kind)  # (its own stream: the other cases' data unchanged)
        for policy, kw in POLICIES.items():
            if kind == "complex":  # (a complex stack only: zgemm against the stack's batched complex products)
                out.append({"name": f"matmul stack {batch} x (50x60)(60x40), complex U[-1, 1), {policy}",
                            "ratio": "matmul / einsum",
                            "ours": lambda kw=kw, A=A, B=B: rt.matmul(A, B, **kw),
                            "against": lambda kw=kw, A=A, B=B: rt.einsum("bij,bjk->bik", A, B, **kw),
                            "numpy": lambda A=A, B=B: np.matmul(A, B)})
                continue
            out.append({"name": f"matmul stack {batch} x (50x60)(60x40), {kind}, {policy}",
                        "ratio": "matmul / einsum",
                        "ours": lambda kw=kw, A=A, B=B: rt.matmul(A, B, **kw),
                        "against": lambda kw=kw, A=A, B=B: rt.einsum("bij,bjk->bik", A, B, **kw),
                        "numpy": lambda A=A, B=B: np.matmul(A, B)})
            out.append({"name": f"matmul stack {batch} x (50x60) @ one (60x40), {kind}, {policy}",
                        "ratio": "matmul / einsum",
                        "ours": lambda kw=kw, A=A, W=W: rt.matmul(A, W, **kw),
                        "against": lambda kw=kw, A=A, W=W: rt.einsum("bij,jk->bik", A, W, **kw),
                        "numpy": lambda A=A, W=W: np.matmul(A, W)})
            out.append({"name": f"einsum bij,jk->bik ({batch}*50 x 60 x 40), {kind}, {policy}",
                        "ratio": "einsum / dgemm",
                        "ours": lambda kw=kw, A=A, W=W: rt.einsum("bij,jk->bik", A, W, **kw),
                        "against": lambda kw=kw, A=A, W=W: rt.dgemm(A.reshape(-1, 60), W, **kw).reshape(
                            A.shape[0], 50, 40),
                        "numpy": lambda A=A, W=W: np.einsum("bij,jk->bik", A, W, optimize=True)})
            out.append({"name": f"einsum ijab,abcd->ijcd (64 x {n * n} x {n * n}), {kind}, {policy}",
                        "ratio": "einsum / dgemm",
                        "ours": lambda kw=kw, a=a, b=b: rt.einsum("ijab,abcd->ijcd", a, b, **kw),
                        "against": lambda kw=kw, a=a, b=b: rt.dgemm(
                            a.reshape(64, n * n), b.reshape(n * n, n * n), **kw).reshape(8, 8, n, n),
                        "numpy": lambda a=a, b=b: np.einsum("ijab,abcd->ijcd", a, b, optimize=True)})
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--n", type=int, default=30, help="the einsum's a, b, c, d extent")
    ap.add_argument("--quick", action="store_true", help="uniform data only, 2 rounds")
    add_output_options(ap)
    args = parse_args(ap, argv)
    kinds = ("uniform",) if args.quick else ("uniform", "phi=4", "complex")
    rows = []
    print(f"{'case':62s} {'ours ms':>9s} {'against ms':>10s} {'numpy ms':>9s} {'ratio':>16s}")
    for case in cases(args.batch, args.n, kinds):
        best = interleaved({"ours": case["ours"], "against": case["against"], "numpy": case["numpy"]},
                           2 if args.quick else args.rounds)
        ratio = best["ours"] / best["against"]
        flag = "" if ratio <= TARGET else f"  (target {TARGET})"
        print(f"{case['name']:62s} {best['ours'] * 1e3:9.1f} {best['against'] * 1e3:10.1f} "
              f"{best['numpy'] * 1e3:9.2f} {case['ratio']:>9s} {ratio:5.2f}{flag}")
        rows.append({"case": case["name"], "ratio_of": case["ratio"], "ours_s": best["ours"],
                     "against_s": best["against"], "numpy_s": best["numpy"], "ratio": ratio})
    return save_result(args, "engine", {"rows": rows, "target": TARGET})


if __name__ == "__main__":
    main()
