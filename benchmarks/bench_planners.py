"""The greedy (Alg. 2) and error-optimal drop planners side by side, in one run: plan time, apply time, accuracy.

For a chain of ``d = 3`` mode products ``n x n`` (``n`` = 4, 8, 16 by
``--sizes``, U[-1, 1) operators, RescaleBE on 15 moduli) it times building each
plan and applying it to ``2**18`` DoFs (``--log2dofs``; alternating the
planners, best of ``--repeat``), then runs
the [2610.05059] accuracy experiment for both planners at ``--depths`` and
reports the largest elementwise relative error of RescaleBE against the exact
chain on the Uniform, Smooth and Wide160 data. Decides nothing: it measures
whether the optimal planner may become the default (issue 18, item 5).

Usage: ``python benchmarks/bench_planners.py [--repeat 5] [--depths 4 8] [--count 8] [--sizes 4 8 16]
[--wide-moduli 30 39 48] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
from _timing import add_output_options, best_time, progress, parse_args, save_result

import rnstensor as rt
from rnstensor.accuracy import DATASETS, run_accuracy
from rnstensor.planner import bounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--depths", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16], help="mode sizes of the timed chains")
    ap.add_argument("--log2dofs", type=int, default=18, help="DoFs of the timed applications (2**log2dofs)")
    ap.add_argument("--wide-moduli", type=int, nargs="+", default=list(range(30, 50, 3)),
                    help="moduli counts of the optimal planner's timing (default 30 33 ... 48)")
    add_output_options(ap)
    args = parse_args(ap)
    print(f"{platform.machine()}, {time.strftime('%Y-%m-%d %H:%M')}; best of {args.repeat}")
    warm = [np.eye(4)] * 3  # numba's compilation and the planners' caches out of the timings
    for planner in ("greedy", "optimal"):
        rt.plan_chain(warm, [0, 1, 2], planner=planner)(np.ones((2, 4, 4, 4)))
    print(f"{'n':>3} {'planner':>8} {'plan s':>8} {'apply ms':>9} {'drops':>14} {'apply / greedy':>15}")
    timings = []
    for n in progress(args.sizes, desc="plan and apply", unit="size"):
        rng = np.random.default_rng(n)
        ops = [rng.uniform(-1, 1, (n, n)) for _ in range(3)]
        X = rng.uniform(-1, 1, (max(1, (1 << args.log2dofs) // n**3), n, n, n))
        plans, plan_s = {}, {}
        for planner in ("greedy", "optimal"):
            t0 = time.perf_counter()
            plans[planner] = rt.plan_chain(ops, [0, 1, 2], planner=planner)
            plan_s[planner] = time.perf_counter() - t0
        times = {p: float("inf") for p in plans}
        for _ in range(3):  # alternate, so drift in the machine's load falls on both
            for p, plan in plans.items():
                times[p] = min(times[p], best_time(lambda: plan(X), args.repeat))
        for p in plans:
            timings.append({"n": n, "planner": p, "plan_s": plan_s[p], "apply_s": times[p], "drops": list(plans[p].drops)})
            print(f"{n:>3} {p:>8} {plan_s[p]:>8.3f} {times[p] * 1e3:>9.2f} {str(plans[p].drops):>14} "
                  f"{times[p] / times['greedy']:>15.2f}")
    print()
    print(f"optimal planner's time on {min(args.wide_moduli)}-{max(args.wide_moduli)} moduli (d products n x n), "
          "bounded subset search vs unbounded:")
    worst = {"bounded": 0.0, "unbounded": 0.0}
    cases = [(d, s, n) for d in (3, 5) for s in args.wide_moduli for n in (2, 3, 4)]
    for d, s, n in progress(cases, desc="optimal planner, many moduli", unit="plan"):
        ops = [np.random.default_rng(100 * d + 10 * s + n).uniform(-1, 1, (n, n)) for _ in range(d)]
        for label, nodes in (("bounded", bounds.SUBSET_NODES), ("unbounded", 1 << 62)):
            saved, bounds.SUBSET_NODES = bounds.SUBSET_NODES, nodes
            try:
                t0 = time.perf_counter()
                rt.plan_chain(ops, list(range(1, d + 1)), moduli=s, planner="optimal")
                worst[label] = max(worst[label], time.perf_counter() - t0)
            finally:
                bounds.SUBSET_NODES = saved
    print(f"  worst plan time: bounded {worst['bounded']:.2f} s, unbounded {worst['unbounded']:.2f} s")
    print()
    print(f"RescaleBE, max elementwise relative error over {args.count} tensors per dataset")
    res = {}
    with progress(total=2 * len(args.depths) * len(DATASETS), desc="accuracy", unit="step") as bar:
        for p in ("greedy", "optimal"):
            res[p] = run_accuracy(depths=args.depths, count=args.count, methods=("rescale_be",), planner=p,
                                  progress=lambda line: bar.update())
    accuracy = []
    for d in args.depths:
        for name in DATASETS:
            g = res["greedy"].error("rescale_be", name, d, "max")
            o = res["optimal"].error("rescale_be", name, d, "max")
            accuracy.append({"depth": d, "dataset": name, "greedy": g, "optimal": o})
            print(f"  depth {d} {name:>8}: greedy {g:.2e}  optimal {o:.2e}  (greedy / optimal {g / o:.1f})")
    save_result(args, "planners", {"timings": timings, "worst_plan_s": worst, "accuracy": accuracy})


if __name__ == "__main__":
    main()
