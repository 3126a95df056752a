"""The CPU's arithmetic and memory floors, and how close the fused chain comes to them (issue #19, items 3-5).

In one run on one machine:

* the float32 FMA peak: a numba kernel of 8 independent FMA chains per lane
  over an L1-resident array (what the residue kernels' float32 lanes can do
  at best), on every backend thread;
* the memory bandwidth: a numba triad ``a = b + s c`` over float64 arrays far
  larger than the caches, on every backend thread;
* per chain size n (d = 3, s = 15, batch = 2**log2dofs / n**3): numpy's einsum
  of the whole expression (``'ai,bj,ck,eijk->eabc'``, ``optimize=True``), the
  chain plan step by step (``fused=False``), fused (:mod:`rnstensor.backends.cpu_fused`),
  and the default plan (``moduli=None``: the classical certification first);
* the fused chain's arithmetic floor: its lane operations per tensor counted
  from the packed program (:func:`lane_ops`: every multiply-add, and the four
  operations of every modular reduction, of the encode, products, drops,
  extensions and decode; float64 operations count twice, having half the
  lanes) over the measured peak; its memory floor: the float64 input and
  output bytes over the measured bandwidth;
* peak memory (tracemalloc) of the fused chain and of numpy's einsum, and the fused chain's per-thread block
  scratch (numba's allocator, which tracemalloc does not see: :func:`~rnstensor.backends.cpu_fused.scratch_bytes`).

* ``einsum`` of the same chain through ``contract_expression`` (the default,
  certified, fused on the CPU since it is a mode-product chain by constants);
* the FEM mass and Poisson operators (``--degrees``, curved 3-D box meshes of
  about 2**16 element nodes, s = 15): numpy's sum-factorized float64 einsum
  (``bench_fem.einsum_operator``), the operator step by step and fused, and
  the fused program's lane operations and floor, as for the chain.

Usage: ``python benchmarks/bench_floor.py [--sizes 4 8 16] [--degrees 2 4] [--repeat 7] [--json out.json]
[--plot out.png]``
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit

import rnstensor as rt
from _timing import add_output_options, best_time, peak_mib, progress, parse_args, save_result
from rnstensor.backends import cpu_fused



@njit(nogil=True, fastmath={"contract"})
def _fma_peak(a, reps):
    # 8 rows of W lanes, each lane 8 independent chains of 8 multiply-adds per pass: 64 FMAs per lane and pass
    W = a.shape[1]
    f, g = np.float32(0.999), np.float32(1e-3)
    for _ in range(reps):
        for i in range(W):
            x0, x1, x2, x3 = a[0, i], a[1, i], a[2, i], a[3, i]
            x4, x5, x6, x7 = a[4, i], a[5, i], a[6, i], a[7, i]
            for _k in range(8):
                x0 = x0 * f + g
                x1 = x1 * f + g
                x2 = x2 * f + g
                x3 = x3 * f + g
                x4 = x4 * f + g
                x5 = x5 * f + g
                x6 = x6 * f + g
                x7 = x7 * f + g
            a[0, i], a[1, i], a[2, i], a[3, i] = x0, x1, x2, x3
            a[4, i], a[5, i], a[6, i], a[7, i] = x4, x5, x6, x7


@njit(nogil=True)
def _triad(a, b, c, s, i0, i1):
    for i in range(i0, i1):
        a[i] = b[i] + s * c[i]


def _threads() -> int:
    return max(1, int(numba.config.NUMBA_NUM_THREADS))


def fma_peak(repeat: int) -> float:
    """float32 multiply-adds per second (lane operations) on all backend threads."""
    nth = _threads()
    W, reps = 1024, 400
    arrays = [np.random.default_rng(i).uniform(0, 1, (8, W)).astype(np.float32) for i in range(nth)]
    for a in arrays:
        _fma_peak(a, 1)
    with ThreadPoolExecutor(nth) as pool:
        t = best_time(lambda: list(pool.map(lambda a: _fma_peak(a, reps), arrays)), repeat)
    return nth * 64 * W * reps / t


def bandwidth(repeat: int) -> float:
    """Bytes per second of a float64 triad over 3 x 128 MiB on all backend threads."""
    nth = _threads()
    n = 16 * 2**20
    a, b, c = np.zeros(n), np.ones(n), np.ones(n)
    cuts = [n * i // nth for i in range(nth + 1)]
    _triad(a, b, c, 2.0, 0, 8)
    with ThreadPoolExecutor(nth) as pool:
        t = best_time(lambda: list(pool.map(lambda k: _triad(a, b, c, 2.0, cuts[k], cuts[k + 1]), range(nth))), repeat)
    return 3 * 8 * n / t


def lane_ops(program: cpu_fused.CpuChainProgram) -> dict:
    """Arithmetic lane operations per tensor of the fused program, by phase (float32 lanes; float64 ops twice)."""
    red = 4  # add, multiply, floor, negated multiply-add (_cr32 / _cr64)
    nin, nout = math.prod(program.in_shape), math.prod(program.out_shape)
    L0, Lf = len(program.first), len(program.final_active)
    ops = {"encode": nin * L0 * (1 + red) * 2, "products": 0, "drops": 0}
    ops["hadamard"] = 0
    for r in program.rec:
        kind, L = int(r[0]), int(r[3])
        if kind == cpu_fused._PRODUCT:
            pre, n_in, post, n_out = (int(v) for v in r[4:8])
            ops["products"] += pre * n_out * post * L * (n_in + red)
        elif kind == cpu_fused._STACK:  # the terms of a sum side by side: copies, no arithmetic
            continue
        elif kind == cpu_fused._HADAMARD:  # per entry and plane: a multiply-add per term, one reduction
            nq, nterms = int(r[4]), int(r[7])
            ops["hadamard"] += nq * L * (nterms + red)
        else:
            ne, t0 = int(r[4]), int(r[5])
            g = int(program.tdir[t0, 2])  # the dropped moduli (dperm's length)
            nr = int(program.tdir[t0 + 5, 2])  # the remaining planes
            m = int(program.tdir[t0 + 11, 2])  # the extension's digits
            T = int(program.tdir[t0 + 16, 2])  # the output planes
            restored = T - nr
            per = g * (g - 1) // 2 + g * red + nr * (g + 1 + red) + m * (m - 1) // 2 + m * red + restored * (m + red)
            ops["drops"] += ne * per
    # MRC digits (one multiply-add per earlier digit, one reduction each), the double-double Horner (about six
    # float64 operations per digit), the scale
    ops["decode"] = nout * (Lf * (Lf - 1) // 2 + Lf * red + 2 * (6 * Lf + 6))
    ops["total"] = sum(ops.values())
    return ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--log2dofs", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--degrees", type=int, nargs="*", default=[2, 4], help="FEM degrees p (none: no FEM rows)")
    add_output_options(ap)
    args = parse_args(ap)

    peak = fma_peak(args.repeat)
    bw = bandwidth(args.repeat)
    print(f"float32 FMA peak {peak / 1e9:.1f} G lane-ops/s, triad bandwidth {bw / 1e9:.1f} GB/s "
          f"({_threads()} threads)", flush=True)
    rows = []
    for n in progress(args.sizes, desc="bench_floor", unit="size"):
        B = max(1, (1 << args.log2dofs) // n**3)
        rng = np.random.default_rng(n)
        X = rng.uniform(-1, 1, (B, n, n, n))
        ops = [rng.uniform(-1, 1, (n, n)) for _ in range(3)]
        plan = rt.plan_chain(ops, [0, 1, 2], moduli=15)
        default = rt.plan_chain(ops, [0, 1, 2])
        expr = rt.contract_expression("ai,bj,ck,eijk->eabc", *ops, X.shape, constants=[0, 1, 2])
        prog = cpu_fused.cpu_compile(plan.fusion_request((n, n, n)))
        t = dict(
            numpy=best_time(lambda: np.einsum("ai,bj,ck,eijk->eabc", *ops, X, optimize=True), args.repeat),
            steps=best_time(lambda: plan.run(X, fused=False), args.repeat),
            fused=best_time(lambda: plan.run(X, fused=True), args.repeat),
            default=best_time(lambda: default(X), args.repeat),
            einsum=best_time(lambda: expr(X), args.repeat),
        )
        assert np.array_equal(plan.run(X, fused=True).view(np.int64), plan.run(X, fused=False).view(np.int64))
        cnt = lane_ops(prog)
        arith_floor = B * cnt["total"] / peak
        mem_floor = X.nbytes * 2 / bw
        mem = dict(fused=peak_mib(lambda: plan.run(X, fused=True)),
                   numpy=peak_mib(lambda: np.einsum("ai,bj,ck,eijk->eabc", *ops, X, optimize=True)),
                   input=X.nbytes / 2**20, scratch_per_thread=cpu_fused.scratch_bytes(prog) / 2**20)
        rows.append(dict(n=n, batch=B, seconds=t, lane_ops_per_tensor=cnt, arith_floor=arith_floor,
                         memory_floor=mem_floor, peak_mib=mem, default_ran=default.last_evaluation))

    fem_rows = [fem_row(kind, p, peak, args.repeat) for p in progress(args.degrees, desc="bench_floor fem", unit="p")
                for kind in ("mass", "poisson")]

    print(f"\nd = 3, s = 15, ~2^{args.log2dofs} DoFs, best of {args.repeat}; {platform.machine()}, "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print(f"{'n':>3} {'batch':>6} | {'numpy ms':>8} {'steps/np':>8} {'fused/np':>8} {'default/np':>10} {'einsum/np':>9} | "
          f"{'ops/DoF':>7} {'arith floor ms':>14} {'of floor':>8} {'mem floor ms':>12} | "
          f"{'MiB fused/numpy/input (+ per thread)':>36}")
    for r in rows:
        s, n3 = r["seconds"], r["n"] ** 3
        print(f"{r['n']:>3} {r['batch']:>6} | {s['numpy'] * 1e3:>8.1f} {s['steps'] / s['numpy']:>8.2f} "
              f"{s['fused'] / s['numpy']:>8.2f} {s['default'] / s['numpy']:>10.2f} {s['einsum'] / s['numpy']:>9.2f} | "
              f"{r['lane_ops_per_tensor']['total'] / n3:>7.0f} {r['arith_floor'] * 1e3:>14.2f} "
              f"{r['arith_floor'] / s['fused']:>7.0%} {r['memory_floor'] * 1e3:>12.2f} | "
              f"{r['peak_mib']['fused']:>6.1f}/{r['peak_mib']['numpy']:.1f}/{r['peak_mib']['input']:.1f} "
              f"(+{r['peak_mib']['scratch_per_thread']:.2f})")
    if fem_rows:
        print(f"\nFEM operators, curved 3-D box meshes, ~2^16 element nodes, s = 15 (einsum: numpy's sum-factorized "
              "float64 operator)")
        print(f"{'op':>8} {'p':>2} {'nelem':>5} | {'einsum ms':>9} {'steps/ein':>9} {'fused/ein':>9} | "
              f"{'ops/elem':>8} {'arith floor ms':>14} {'floor/ein':>9} {'of floor':>8}")
        for r in fem_rows:
            s = r["seconds"]
            print(f"{r['kind']:>8} {r['p']:>2} {r['nelem']:>5} | {s['einsum'] * 1e3:>9.1f} "
                  f"{s['steps'] / s['einsum']:>9.2f} {s['fused'] / s['einsum']:>9.2f} | "
                  f"{r['lane_ops_per_element']['total']:>8.0f} {r['arith_floor'] * 1e3:>14.2f} "
                  f"{r['arith_floor'] / s['einsum']:>9.2f} {r['arith_floor'] / s['fused']:>7.0%}")
    save_result(args, "floor", {"fma_peak": peak, "bandwidth": bw, "rows": rows, "fem_rows": fem_rows})


def fem_row(kind: str, p: int, peak: float, repeat: int) -> dict:
    """One FEM operator at degree ``p``: numpy's einsum, steps, fused, and the fused program's floor."""
    from bench_fem import einsum_operator
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    b = TensorBasis(p + 1, dim=3, moduli=15)
    n = max(1, round(((1 << 16) / b.P**3) ** (1 / 3)))
    mesh = box_mesh(b, shape=n, curved=0.1)
    u = mesh.gather(np.random.default_rng(p).uniform(-1, 1, mesh.ndof))
    field = mesh.qdata if kind == "mass" else mesh.G
    op = (MassOperator if kind == "mass" else PoissonOperator)(b, field)
    base = einsum_operator(kind, b, field)
    assert np.array_equal(op.apply(u, fused=True).view(np.int64), op.apply(u, fused=False).view(np.int64))
    t = dict(einsum=best_time(lambda: base(u), repeat), steps=best_time(lambda: op.apply(u, fused=False), repeat),
             fused=best_time(lambda: op.apply(u, fused=True), repeat))
    cnt = lane_ops(cpu_fused.cpu_compile(op.fusion_request()))
    return dict(kind=kind, p=p, nelem=mesh.nelem, ndof=mesh.ndof, seconds=t, lane_ops_per_element=cnt,
                arith_floor=mesh.nelem * cnt["total"] / peak)


if __name__ == "__main__":
    main()
