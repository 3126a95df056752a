"""What the classical default of einsum costs: ``contract_expression(moduli=None)`` against an explicit basis and numpy.

``moduli=None`` runs the 15-moduli plan with its certification beside it
(:mod:`rnstensor.program.classical`: one float64 magnitude contraction per
step and a few passes over each operand and result), widens the encodings on
more moduli where the certificate fails, and evaluates each pairwise step as
a classical :func:`rnstensor.matmul` where operands span hundreds of binades
in one slice. ``moduli=15`` is that plan alone (the fast opt-out). For each
expression and data set: the best wall time of ``--repeat`` calls after a
warm-up of numpy's einsum (``optimize=True``), the explicit basis and the
default, measured one after the other, and how the default evaluated
(``ContractExpression.last_evaluation``); then the same for a chain plan
(``plan_chain(moduli=None)`` against ``moduli=15``).

Data: ``uniform`` U[-1, 1), ``phi4`` ([2610.26945]'s ``(U - 1/2) exp(4 N)``),
``wide``: uniform with one entry per operand 2**-600 times the rest (its
slice spans 600 binades: the composed path).

Usage: ``python benchmarks/bench_einsum_default.py [--repeat 5] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse

import numpy as np

import rnstensor as rt
from _timing import add_output_options, best_time, progress, parse_args, save_result

DATA = ("uniform", "phi4", "wide")
CASES = {
    "chain n=8 (ai,bj,ck,eijk->eabc, e=2000)": ("ai,bj,ck,eijk->eabc", [(8, 8), (8, 8), (8, 8), (2000, 8, 8, 8)]),
    "gemm 256 (ij,jk->ik)": ("ij,jk->ik", [(256, 256), (256, 256)]),
    "batched 64 x 32^3 (bij,bjk->bik)": ("bij,bjk->bik", [(64, 32, 32), (64, 32, 32)]),
    "hadamard 2^20 (i,i->i)": ("i,i->i", [(1 << 20,), (1 << 20,)]),
    "row sums 1000^2 (ij->i)": ("ij->i", [(1000, 1000)]),
}


def operand(name: str, shape: tuple, rng) -> np.ndarray:
    x = rng.uniform(-1, 1, shape)
    if name == "phi4":
        x = (rng.random(shape) - 0.5) * np.exp(4 * rng.standard_normal(shape))
    elif name == "wide":
        x.reshape(-1)[0] *= 2.0**-600
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    add_output_options(ap)
    args = parse_args(ap)
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'expression':40s} {'data':8s} {'numpy':>9s} {'s=15':>7s} {'default':>8s} {'cost':>6s}  default ran as")
    bar = progress(total=(len(CASES) + 1) * len(DATA), desc="bench_einsum_default", unit="case")
    for label, (sub, shapes) in CASES.items():
        for data in DATA:
            ops = [operand(data, s, rng) for s in shapes]
            fast = rt.contract_expression(sub, *shapes, moduli=15)
            default = rt.contract_expression(sub, *shapes)
            t_np = best_time(lambda: np.einsum(sub, *ops, optimize=True), args.repeat)
            t_fast = best_time(lambda: fast(*ops), args.repeat)
            t_def = best_time(lambda: default(*ops), args.repeat)
            row = dict(expression=label, data=data, numpy_s=t_np, fast_s=t_fast, default_s=t_def,
                       default_over_fast=t_def / t_fast, default_over_numpy=t_def / t_np, ran_as=default.last_evaluation)
            rows.append(row)
            bar.update()
            bar.write(f"{label:40s} {data:8s} {t_np * 1e3:7.2f}ms {t_fast / t_np:6.2f}x {t_def / t_np:7.2f}x "
                  f"{t_def / t_fast:5.2f}x  {default.last_evaluation}")
    # chain plans: plan_chain(moduli=None) against moduli=15, the same certification beside the plan's run
    ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
    for data in DATA:
        X = operand(data, (2000, 8, 8, 8), rng)
        default, fast = rt.plan_chain(ops, [0, 1, 2]), rt.plan_chain(ops, [0, 1, 2], moduli=15)
        sub = "ai,bj,ck,eijk->eabc"
        t_np = best_time(lambda: np.einsum(sub, *ops, X, optimize=True), args.repeat)
        t_fast = best_time(lambda: fast(X), args.repeat)
        t_def = best_time(lambda: default(X), args.repeat)
        label = "plan_chain n=8 (e=2000)"
        rows.append(dict(expression=label, data=data, numpy_s=t_np, fast_s=t_fast, default_s=t_def,
                         default_over_fast=t_def / t_fast, default_over_numpy=t_def / t_np,
                         ran_as=default.last_evaluation))
        bar.update()
        bar.write(f"{label:40s} {data:8s} {t_np * 1e3:7.2f}ms {t_fast / t_np:6.2f}x {t_def / t_np:7.2f}x "
              f"{t_def / t_fast:5.2f}x  {default.last_evaluation}")
    bar.close()
    save_result(args, "einsum_default", {"rows": rows})


if __name__ == "__main__":
    main()
