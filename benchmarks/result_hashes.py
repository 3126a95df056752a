"""Hashes of the results of a fixed case set: the bit-for-bit guard of a refactor (issue 32, "nothing lost").

``python benchmarks/result_hashes.py --out before.json`` before a change and
``python benchmarks/result_hashes.py --compare before.json`` after it: every
case's result (and bound) must have the same bytes. The cases cover einsum
and contract_expression (every accuracy policy, complex, constants,
RNSTensor operands), chain plans (every method and planner, both decodes,
the default's escalation), dgemm / zgemm / matmul (every policy, alpha and
beta, transposes, split rows), the FEM operators (fused and not) and every
error bound. Run on one machine: the CPU backend's bits do not depend on
it, but the composed method's float64 GEMMs follow the BLAS.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Callable

import numpy as np

import rnstensor as rt


def _digest(x) -> str:
    if isinstance(x, rt.RNSTensor):
        x = np.asarray(x.residues)
    a = np.ascontiguousarray(np.asarray(x))
    return hashlib.sha256(a.dtype.str.encode() + str(a.shape).encode() + a.tobytes()).hexdigest()[:20]


def cases() -> dict[str, Callable]:
    """``{name: () -> result}`` of the fixed case set (deterministic data)."""
    rng = np.random.default_rng(2026)
    out: dict[str, Callable] = {}

    def wide(shape, spread=20):
        return rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread, shape))

    X = rng.uniform(-1, 1, (6, 8, 8, 8))
    Xw = wide((4, 6, 6, 6), 30)
    A = rng.uniform(-1, 1, (8, 8))
    a, b = rng.standard_normal((9, 30)), rng.standard_normal((30, 7))
    za, zb = a + 1j * wide((9, 30), 5), b - 1j * wide((30, 7), 5)
    c = rng.standard_normal((9, 7))
    g = wide((5, 5, 5, 5), 6)
    C = rng.standard_normal((5, 5))
    for pol in (None, "fast", "auto", 15, 24):
        out[f"einsum chain {pol}"] = lambda pol=pol: rt.einsum("eijk,ai,bj,ck->eabc", X, A, A, A, moduli=pol)
        out[f"einsum gemm {pol}"] = lambda pol=pol: rt.einsum("ij,jk->ik", a, b, moduli=pol)
        out[f"einsum 4-index {pol}"] = lambda pol=pol: rt.einsum("pqrs,pi,qj,rk,sl->ijkl", g, C, C, C, C, moduli=pol)
        out[f"einsum complex {pol}"] = lambda pol=pol: rt.einsum("ij,jk->ik", za, zb, moduli=pol)
    out["einsum exact 30"] = lambda: rt.einsum("ij,jk->ik", a, b, moduli=30, decode="exact")
    out["einsum hadamard"] = lambda: rt.einsum("ij,ij->ij", a, a)
    out["einsum trace"] = lambda: rt.einsum("ii", A)
    out["einsum rtol"] = lambda: rt.einsum("pqrs,pi,qj,rk,sl->ijkl", g, C, C, C, C, rtol=1e-10)
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", Xw.shape, A[:6, :6], A[:6, :6], A[:6, :6],
                                  constants=[1, 2, 3])
    out["expression wide"] = lambda: expr(Xw)
    out["expression bound"] = lambda: expr.error_bound(Xw)
    T = rt.encode(a, rt.Basis.int8(15), bits=30, shared_axes=(1,))
    out["einsum rnstensor"] = lambda: rt.einsum("ij,jk->ik", T, rt.encode(b, rt.Basis.int8(15), bits=30,
                                                                        shared_axes=(0,)))
    ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
    for method in ("rescale_be", "rescale", "norescale", "composed"):
        for planner in ("optimal", "greedy"):
            plan = rt.plan_chain(ops, [0, 1, 2], moduli=15, method=method, planner=planner, min_bits=0)
            for decode in ("fp64", "exact"):
                out[f"chain {method} {planner} {decode}"] = lambda p=plan, d=decode: p(X, d)
            out[f"chain {method} {planner} bound"] = lambda p=plan: p.error_bound(X)
    default = rt.plan_chain(ops, [0, 1, 2])
    out["chain default"] = lambda: default(X)
    out["chain default wide"] = lambda: rt.plan_chain([A[:6, :6]] * 3, [0, 1, 2])(Xw)
    out["chain default bound"] = lambda: default.error_bound(X)
    out["chain auto"] = lambda: rt.plan_chain(ops, [0, 1, 2], moduli="auto")(X[:2])
    out["chain rtol"] = lambda: rt.plan_chain(ops, [0, 1, 2], rtol=1e-9)(X)
    for pol in (None, "fast", "auto", 14, 20):
        out[f"dgemm {pol}"] = lambda pol=pol: rt.dgemm(a, b, moduli=pol)
        out[f"dgemm ab {pol}"] = lambda pol=pol: rt.dgemm(a.T.copy(), b, c, alpha=1.5, beta=-0.25, trans_a="T",
                                                            moduli=pol)
        out[f"zgemm {pol}"] = lambda pol=pol: rt.zgemm(za, zb, c + 1j, alpha=0.5 - 1j, beta=2j, moduli=pol)
    aw = wide((5, 12), 600)
    out["dgemm split"] = lambda: rt.dgemm(aw, aw.T)
    out["dgemm auto split"] = lambda: rt.dgemm(aw, aw.T, moduli="auto")
    out["dgemm rtol"] = lambda: rt.dgemm(a, b, rtol=1e-9)
    out["matmul stack"] = lambda: rt.matmul(rng.standard_normal((4, 5, 6)), rng.standard_normal((4, 6, 3)))
    out["matmul int"] = lambda: rt.matmul(np.arange(12).reshape(3, 4), np.arange(8).reshape(4, 2))
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    basis = TensorBasis(3)
    mesh = box_mesh(basis, shape=(2, 2, 1), curved=0.1)
    u = rng.standard_normal((mesh.nelem, 3, 3, 3))
    for fused in (None, False):
        out[f"fem mass {fused}"] = lambda f=fused: MassOperator(basis, mesh.qdata).apply(u, fused=f)
        out[f"fem poisson {fused}"] = lambda f=fused: PoissonOperator(basis, mesh.G).apply(u, fused=f)
    # a GEMM-shaped einsum's default (dgemm's moduli element by element), on data wider than 53 bits
    gen = np.random.default_rng(7)  # (its own generator: the cases above draw theirs as they run)
    pa, pb = (gen.standard_normal(s) * np.exp(4 * gen.standard_normal(s)) for s in ((4, 6, 20), (20, 5)))
    out["einsum gemm-shaped phi=4"] = lambda: rt.einsum("ijk,kl->ijl", pa, pb)
    out["einsum gemm-shaped bound"] = lambda: rt.contract_expression("ijk,kl->ijl", pa.shape, pb.shape).error_bound(
        pa, pb)
    return out


def run() -> dict[str, str]:
    res = {}
    for name, fn in cases().items():
        try:
            res[name] = _digest(fn())
        except Exception as exc:  # a refusal is a result too: its type and message must not change
            res[name] = f"raises {type(exc).__name__}: {exc}"[:200]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the hashes here (JSON)")
    ap.add_argument("--compare", help="compare with hashes written before; exit 1 on any difference")
    args = ap.parse_args(argv)
    res = run()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        diff = sorted(k for k in set(before) | set(res) if before.get(k) != res.get(k))
        for k in diff:
            print(f"DIFFERS {k}: {before.get(k)} -> {res.get(k)}")
        print(f"{len(res) - len(diff)} of {len(set(before) | set(res))} cases bit for bit the same")
        return 1 if diff else 0
    print(f"{len(res)} cases hashed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
