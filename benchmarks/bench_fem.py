"""Finite-element operator throughput on the CPU: mass and Poisson, RescaleBE vs Composed vs numpy float64 einsum.

3-D hexahedral box meshes (curved, so the Poisson metric has all six
components), degree p = 1..10 (P = p + 1 nodes, Q = P + 1 Gauss points per
direction), about 2^log2dofs element-local nodes per run, s = 15 moduli. Every
method runs in the same process on the same data; throughput is global DoFs
(mesh nodes) per second of the element operator (gather/scatter excluded).
Baseline: numpy float64 ``einsum`` with the path ``optimize=True`` chooses
(``'greedy'``), computed once with ``np.einsum_path`` and reused. The phase breakdown splits one RescaleBE
application into encode, mode products, Hadamard products + sums, drops +
base extension, decode.

Usage: ``python benchmarks/bench_fem.py [--degrees 1 2 4] [--repeat 3] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
from _timing import add_output_options, best_time, progress, parse_args, save_result

from rnstensor.backends import get_backend
from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh
from rnstensor.fem.program import voigt_index
from rnstensor.primitives import decode
from rnstensor import ir
from rnstensor.program.execute import tensor_of


class StepTimer:
    """An observer of the executor: the seconds since the previous step, charged to this step's kind."""

    def __init__(self):
        self.t = dict(encode=0.0, products=0.0, hadamard_add=0.0, drop_extend=0.0)
        self.last = time.perf_counter()

    def __call__(self, st, before, v, vals):
        now = time.perf_counter()
        if isinstance(st, ir.Encode):
            kind = "encode" if not st.constant else "hadamard_add"
        elif isinstance(st, ir.Contract):
            kind = "products" if st.kind != "outer" else "hadamard_add"
        elif isinstance(st, ir.Drop):
            kind = "drop_extend"
        else:
            kind = "hadamard_add"
        self.t[kind] += now - self.last
        self.last = now


def phases(op, u) -> dict:
    """Seconds per kind of step of one RescaleBE application: the operator's program, observed step by step."""
    timer = StepTimer()
    vals = op.run_program(u, observer=timer)
    t = dict(timer.t)
    t0 = time.perf_counter()
    decode(tensor_of(vals[op.program.out], op.basis.moduli), "fp64")
    t["decode"] = time.perf_counter() - t0
    return t


def einsum_operator(kind: str, b: TensorBasis, field: np.ndarray):
    """The float64 baseline: sum-factorized einsum with paths computed once."""
    B, D = b.B, b.D
    P, Q = b.P, b.Q
    fwd = "ai,bj,ck,eijk->eabc"
    bwd = "ai,bj,ck,eabc->eijk"
    u0 = np.zeros((field.shape[0], P, P, P))
    v0 = np.zeros((field.shape[0], Q, Q, Q))
    pf = np.einsum_path(fwd, B, B, B, u0, optimize="greedy")[0]
    pb = np.einsum_path(bwd, B, B, B, v0, optimize="greedy")[0]
    if kind == "mass":
        def apply(u):
            return np.einsum(bwd, B, B, B, field * np.einsum(fwd, B, B, B, u, optimize=pf), optimize=pb)
        return apply
    mats = [[D if a == i else B for a in range(3)] for i in range(3)]

    def apply(u):
        g = [np.einsum(fwd, *mats[i], u, optimize=pf) for i in range(3)]
        y = 0
        for i in range(3):
            f = sum(field[:, voigt_index(i, j, 3)] * g[j] for j in range(3))
            y = y + np.einsum(bwd, *mats[i], f, optimize=pb)
        return y
    return apply


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--degrees", type=int, nargs="+", default=list(range(1, 11)))
    ap.add_argument("--log2dofs", type=int, default=16)
    ap.add_argument("--s", type=int, default=15)
    ap.add_argument("--curved", type=float, default=0.1)
    ap.add_argument("--repeat", type=int, default=3)
    add_output_options(ap)
    args = parse_args(ap)

    rows = []
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    bar = progress(total=2 * len(args.degrees), desc="bench_fem", unit="op")
    for p in args.degrees:
        b = TensorBasis(p + 1, dim=3, moduli=args.s)
        n = max(1, round(((1 << args.log2dofs) / b.P**3) ** (1 / 3)))
        mesh = box_mesh(b, shape=n, curved=args.curved)
        u = mesh.gather(np.random.default_rng(p).uniform(-1, 1, mesh.ndof))
        for kind, cls, field in (("mass", MassOperator, mesh.qdata), ("poisson", PoissonOperator, mesh.G)):
            ops = {m: cls(b, field, method=m) for m in ("rescale_be", "composed")}
            base = einsum_operator(kind, b, field)
            y64 = base(u)
            scale = np.abs(y64).max()
            err = {m: float(np.abs(op.apply(u) - y64).max() / scale) for m, op in ops.items()}
            sec = dict(einsum=best_time(lambda base=base, u=u: base(u), args.repeat))
            for m, op in ops.items():
                sec[m] = best_time(lambda op=op, u=u: op.apply(u), args.repeat)
            be = ops["rescale_be"]  # its default runs fused on the 'cpu' and 'cuda' backends; the same bits step by step
            sec["rescale_be_steps"] = best_time(lambda op=be, u=u: op.apply(u, fused=False), args.repeat)
            rows.append(dict(
                kind=kind, p=p, P=b.P, Q=b.Q, nelem=mesh.nelem, ndof=mesh.ndof, local=int(u.size),
                bits=ops["rescale_be"].bits, drops=[len(d) for d in ops["rescale_be"].plan.drops],
                seconds=sec, gdofs={k: mesh.ndof / v / 1e9 for k, v in sec.items()},
                rel_diff_vs_einsum=err, phases=phases(ops["rescale_be"], u),
            ))
            bar.update()
            bar.set_postfix_str(f"p={p} {kind}")
    bar.close()
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    print(
        f"\n3-D curved box meshes, s = {args.s}, ~2^{args.log2dofs} element nodes, best of {args.repeat}, backend "
        f"'{get_backend().name}'; {platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, "
        f"load average {load0:.2f} -> {load1:.2f}"
    )
    hdr = (f"{'op':>7} {'p':>2} {'nelem':>5} {'ndof':>6} | {'MDoF/s einsum':>13} {'rescale_be':>10} {'be steps':>8} "
           f"{'composed':>9} | {'steps/be':>8} {'co/be':>6} {'be/ein':>7} | {'rel diff be':>11} {'co':>8} | "
           f"{'enc':>5} {'prod':>5} {'had+add':>7} {'drop+ext':>8} {'dec':>5} (% of be)")
    print(hdr)
    for r in rows:
        g, s_, e, ph = r["gdofs"], r["seconds"], r["rel_diff_vs_einsum"], r["phases"]
        tot = sum(ph.values())
        share = " ".join(f"{100 * ph[k] / tot:>{w}.0f}" for k, w in
                         (("encode", 5), ("products", 5), ("hadamard_add", 7), ("drop_extend", 8), ("decode", 5)))
        print(
            f"{r['kind']:>7} {r['p']:>2} {r['nelem']:>5} {r['ndof']:>6} | {g['einsum'] * 1e3:>13.2f} "
            f"{g['rescale_be'] * 1e3:>10.2f} {g['rescale_be_steps'] * 1e3:>8.2f} {g['composed'] * 1e3:>9.2f} | "
            f"{s_['rescale_be_steps'] / s_['rescale_be']:>7.2f}x "
            f"{s_['composed'] / s_['rescale_be']:>5.2f}x {s_['rescale_be'] / s_['einsum']:>6.1f}x | "
            f"{e['rescale_be']:>11.1e} {e['composed']:>8.1e} | {share}"
        )
    save_result(args, "fem_throughput", {"rows": rows, "loadavg": [load0, load1]})


if __name__ == "__main__":
    main()
