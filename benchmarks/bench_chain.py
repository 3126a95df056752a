"""Chain throughput on the CPU: RescaleBE vs Composed vs numpy float64 einsum, with a phase breakdown.

d = 3 mode products (axes 0, 1, 2), s = 15 moduli, n in {4, 8, 12, 16, 32, 64},
batch = floor(2^22 / n^3) tensors. Every method runs in the same process on
the same data; throughput is DoFs (input entries) per second. The phase
breakdown times encode, products, drop + extension and decode separately by
running the plan's steps one by one (the same calls the plan makes). Peak
memory is the tracemalloc peak of one run (numpy-managed buffers).

Usage: ``python benchmarks/bench_chain.py [--sizes 4 8 16] [--repeat 3] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import rnstensor as rt
from _timing import add_output_options, best_time, peak_mib, progress, parse_args, save_result
from rnstensor.accuracy import einsum_chain
from rnstensor.backends import get_backend
from rnstensor.primitives import decode, drop, mode_product, strip_pending


def phases(plan, X: np.ndarray) -> dict:
    """Seconds per phase of one RescaleBE run, step by step as ChainPlan.apply does it."""
    t = dict(encode=0.0, products=0.0, drop_extend=0.0, decode=0.0)
    t0 = time.perf_counter()
    T = plan.encode_input(X)
    t["encode"] += time.perf_counter() - t0
    for op, ax, st in zip(plan.encoded_operators, plan.axes, plan.schedule.steps):
        t0 = time.perf_counter()
        T, _ = strip_pending(T, 1 + ax)
        T = mode_product(T, op, 1 + ax)
        t["products"] += time.perf_counter() - t0
        if st.dropped:
            t0 = time.perf_counter()
            T = drop(T, moduli=st.dropped, extend=True)
            t["drop_extend"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    decode(T, "fp64")
    t["decode"] += time.perf_counter() - t0
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 12, 16, 32, 64])
    ap.add_argument("--log2dofs", type=int, default=22)
    ap.add_argument("--s", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=3)
    add_output_options(ap)
    args = parse_args(ap)

    rows = []
    for n in progress(args.sizes, desc="bench_chain", unit="size"):
        batch = max(1, (1 << args.log2dofs) // n**3)
        dofs = batch * n**3
        rng = np.random.default_rng(n)
        X = rng.uniform(-1, 1, size=(batch, n, n, n))
        ops = [rng.uniform(-1, 1, size=(n, n)) for _ in range(3)]
        plans = {m: rt.plan_chain(ops, [0, 1, 2], moduli=args.s, method=m) for m in ("rescale_be", "composed")}
        t_ein = best_time(lambda: einsum_chain(X, ops, [0, 1, 2]), args.repeat)
        t_be = best_time(lambda: plans["rescale_be"](X), args.repeat)
        t_co = best_time(lambda: plans["composed"](X), args.repeat)
        ph = phases(plans["rescale_be"], X)
        row = dict(
            n=n,
            batch=batch,
            dofs=dofs,
            drops=list(plans["rescale_be"].drops),
            seconds=dict(einsum=t_ein, rescale_be=t_be, composed=t_co),
            gdofs=dict(einsum=dofs / t_ein / 1e9, rescale_be=dofs / t_be / 1e9, composed=dofs / t_co / 1e9),
            phases=ph,
            peak_mib=dict(
                einsum=peak_mib(lambda: einsum_chain(X, ops, [0, 1, 2])),
                rescale_be=peak_mib(lambda: plans["rescale_be"](X)),
                composed=peak_mib(lambda: plans["composed"](X)),
            ),
        )
        rows.append(row)

    print(
        f"\nd = 3, s = {args.s}, ~2^{args.log2dofs} DoFs, best of {args.repeat}, backend '{get_backend().name}'; "
        f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    )
    print(
        f"{'n':>3} {'batch':>6} | {'GDoF/s einsum':>13} {'rescale_be':>10} {'composed':>9} | "
        f"{'be/composed':>11} {'be/einsum time':>14} | {'encode':>6} {'prod':>6} {'drop+ext':>8} {'decode':>6} (ms) | "
        f"{'peak MiB be/co/ein':>18}"
    )
    for r in rows:
        g, s_, p, m = r["gdofs"], r["seconds"], r["phases"], r["peak_mib"]
        print(
            f"{r['n']:>3} {r['batch']:>6} | {g['einsum']:>13.3f} {g['rescale_be']:>10.3f} {g['composed']:>9.3f} | "
            f"{s_['composed'] / s_['rescale_be']:>10.2f}x {s_['rescale_be'] / s_['einsum']:>13.2f}x | "
            f"{p['encode'] * 1e3:>6.0f} {p['products'] * 1e3:>6.0f} {p['drop_extend'] * 1e3:>8.0f} {p['decode'] * 1e3:>6.0f}      | "
            f"{m['rescale_be']:>6.0f}/{m['composed']:.0f}/{m['einsum']:.0f}"
        )
    save_result(args, "chain_throughput", {"rows": rows})


if __name__ == "__main__":
    main()
