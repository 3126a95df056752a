"""The default's accuracy against numpy's own float64 result on wide-range data, with its cost (issue 33, item 1).

A user judges by the error they see, so every figure here compares the
default (``moduli=None``) with numpy's float64 result on the same data. The
reference is the correctly rounded result (``moduli='auto'``, itself checked
against exact Fractions in the tests), within ``u |y|`` of the exact value.
Per case, same run:

* normwise error ``||y - y_cr|| / ||y_cr||`` of numpy and of the default, and
  their ratio (target: the default at most numpy's);
* the largest componentwise error relative to the exact magnitude
  contraction ``|A||B|...`` of each, and their ratio (target: at most 2);
* the share of entries where the default is less accurate than numpy
  (target: at most 0.1 %);
* the same for ``rtol=DEFAULT_RTOL`` (``(1 + 2**-5) u``, the tightest target,
  the GEMMs' default), row ``tight``;
* the time of each (best of interleaved rounds), and their ratio.

Data classes: chemistry-like integrals spanning e^-10..1 in a 4-index
transform (n = 8 ... 32), phi = 4 GEMMs, a wide chain of mode products and
the FEM mass and Poisson operators on nodal values spanning e^-30..1 within
each element (no ``rtol`` there: their default is the planned 72-bit basis).
Writes ``DIR/default_accuracy.json``
and prints a table. ``--quick`` runs the small sizes only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import rnstensor as rt  # noqa: E402
from rnstensor.run.policy import DEFAULT_RTOL  # noqa: E402
from _timing import interleaved  # noqa: E402

__all__ = ["cases", "compare", "main"]

U = 2.0**-53


def cases(quick: bool) -> list[dict]:
    """The data classes: ``{'name', 'numpy', 'default', 'tight' (rtol=DEFAULT_RTOL), 'exact' (y_cr), 'magnitude'}``,
    each a function of nothing."""
    rng = np.random.default_rng(33)
    out = []
    for n in ((8, 12) if quick else (8, 16, 24, 32)):
        g = rng.standard_normal((n,) * 4) * np.exp(rng.uniform(-10, 0, (n,) * 4))
        C = rng.standard_normal((n, n))
        sub = "pqrs,pi,qj,rk,sl->ijkl"
        out.append({
            "name": f"4-index transform n={n}",
            "numpy": lambda sub=sub, g=g, C=C: np.einsum(sub, g, C, C, C, C, optimize=True),
            "default": lambda sub=sub, g=g, C=C: rt.einsum(sub, g, C, C, C, C),
            "tight": lambda sub=sub, g=g, C=C: rt.einsum(sub, g, C, C, C, C, rtol=DEFAULT_RTOL),
            "exact": lambda sub=sub, g=g, C=C: rt.einsum(sub, g, C, C, C, C, moduli="auto"),
            "magnitude": lambda sub=sub, g=g, C=C: np.einsum(sub, np.abs(g), *[np.abs(C)] * 4, optimize=True),
        })
    from rnstensor.gemm_accuracy import gemm_dataset

    for k in ((256,) if quick else (256, 4096)):
        A, B = gemm_dataset("phi4", 128, k, 96, seed=k)
        out.append({
            "name": f"phi=4 GEMM 128x{k}x96",
            "numpy": lambda A=A, B=B: A @ B,
            "default": lambda A=A, B=B: rt.dgemm(A, B),
            "tight": lambda A=A, B=B: rt.dgemm(A, B, rtol=DEFAULT_RTOL),
            "exact": lambda A=A, B=B: rt.dgemm(A, B, moduli="auto"),
            "magnitude": lambda A=A, B=B: np.abs(A) @ np.abs(B),
        })
    n = 8
    ops = [rng.standard_normal((n, n)) * np.exp2(rng.integers(-12, 12, (n, n))) for _ in range(3)]
    X = rng.standard_normal((64, n, n, n)) * np.exp(rng.uniform(-10, 0, (64, n, n, n)))
    plan = rt.plan_chain(ops, [0, 1, 2])
    tight = rt.plan_chain(ops, [0, 1, 2], rtol=DEFAULT_RTOL)
    exact = rt.plan_chain(ops, [0, 1, 2], moduli="auto")
    sub = exact.einsum_subscripts(1)
    out.append({
        "name": "wide chain n=8, 64 tensors",
        "numpy": lambda: np.einsum(sub, X, *ops, optimize=True),
        "default": lambda: plan(X),
        "tight": lambda: tight(X),
        "exact": lambda: exact(X),
        "magnitude": lambda: np.einsum(sub, np.abs(X), *[np.abs(A) for A in ops], optimize=True),
    })
    out += _fem_cases(rng, quick)
    return out


def _fem_magnitude(kind: str, basis, field, u) -> np.ndarray:
    """The operator applied to ``|u|`` with ``|B|``, ``|D|`` and ``|field|``: the exact magnitude contraction."""
    from rnstensor.fem.program import voigt_index

    B, D, x = np.abs(basis.B), np.abs(basis.D), np.abs(u)
    prod = lambda x, A, a: np.moveaxis(np.tensordot(x, A, axes=([a + 1], [1])), -1, a + 1)  # noqa: E731
    if kind == "mass":
        for a in range(3):
            x = prod(x, B, a)
        x = x * np.abs(field)
        for a in range(3):
            x = prod(x, B.T, a)
        return x
    grads = []
    for i in range(3):
        g = x
        for a in range(3):
            g = prod(g, D if a == i else B, a)
        grads.append(g)
    y = 0
    for i in range(3):
        f = sum(np.abs(field[:, voigt_index(i, j, 3)]) * grads[j] for j in range(3))
        for a in range(3):
            f = prod(f, (D if a == i else B).T, a)
        y = y + f
    return y


def _fem_cases(rng, quick: bool) -> list[dict]:
    """Mass and Poisson on a curved mesh with nodal values spanning e^-30..1 within every element: numpy's float64
    evaluation (``method='float64'``) against the default; the reference is the operator on 40 moduli at 120 bits,
    decoded exactly (its only rounding of consequence is the last one: checked against 150 bits on 48 moduli)."""
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    out = []
    for P in ((3,) if quick else (3, 5)):
        basis, wide, wider = TensorBasis(P), TensorBasis(P, moduli=40), TensorBasis(P, moduli=48)
        mesh = box_mesh(basis, shape=(4, 4, 2), curved=0.2)
        u = rng.standard_normal((mesh.nelem,) + (P,) * 3) * np.exp(rng.uniform(-30, 0, (mesh.nelem,) + (P,) * 3))
        for kind, cls, field in (("mass", MassOperator, mesh.qdata), ("poisson", PoissonOperator, mesh.G)):
            y_ref = cls(wide, field, bits=120).apply(u, "exact")
            # the exact value rounded once, if two encodings 30 bits apart round to the same float64 everywhere
            assert np.array_equal(y_ref, cls(wider, field, bits=150).apply(u, "exact")), "the reference moved"
            default, numpy_op = cls(basis, field), cls(basis, field, method="float64")
            out.append({
                "name": f"FEM {kind} P={P}, u e^-30..1",
                "numpy": lambda op=numpy_op, u=u: op.apply(u),
                "default": lambda op=default, u=u: op.apply(u),
                "exact": lambda y=y_ref: y,
                "magnitude": lambda kind=kind, f=field, u=u, b=basis: _fem_magnitude(kind, b, f, u),
            })
    return out


def compare(case: dict, policy: str = "default") -> dict:
    """One case's errors and times, numpy against ``policy`` (``'default'`` or ``'tight'``)."""
    y_np, y_rt, y_cr, mag = case["numpy"](), case[policy](), case["exact"](), case["magnitude"]()
    err_np = np.abs(y_np - y_cr) + U * np.abs(y_cr)  # upper bounds of the errors against the exact value
    err_rt = np.abs(y_rt - y_cr) + U * np.abs(y_cr)
    norm = float(np.linalg.norm(y_cr))
    with np.errstate(divide="ignore", invalid="ignore"):
        comp_np = float(np.max(np.where(mag > 0, err_np / mag, 0.0)))
        comp_rt = float(np.max(np.where(mag > 0, err_rt / mag, 0.0)))
    t = interleaved({"numpy": case["numpy"], policy: case[policy]})
    res = {
        "case": case["name"],
        "policy": policy,
        "normwise_numpy": float(np.linalg.norm(y_np - y_cr)) / norm,
        "normwise_default": float(np.linalg.norm(y_rt - y_cr)) / norm,
        "componentwise_numpy": comp_np,
        "componentwise_default": comp_rt,
        # strictly less accurate than numpy's own result on that entry (ties are not worse)
        "worse_than_numpy": float(np.mean(np.abs(y_rt - y_cr) > np.abs(y_np - y_cr))),
        "time_numpy_s": t["numpy"],
        "time_default_s": t[policy],
    }
    res["normwise_ratio"] = res["normwise_default"] / res["normwise_numpy"] if res["normwise_numpy"] else 0.0
    res["componentwise_ratio"] = comp_rt / comp_np if comp_np else 0.0
    res["time_ratio"] = t[policy] / t["numpy"]
    return res


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rows = [compare(c, p) for c in cases(args.quick) for p in ("default", "tight") if p in c]
    print(f"{'case':<30} {'policy':<8} {'norm rt/np':>10} {'comp rt/np':>10} {'worse':>8} {'time rt/np':>10}")
    for r in rows:
        print(f"{r['case']:<30} {r['policy']:<8} {r['normwise_ratio']:>10.2f} {r['componentwise_ratio']:>10.2f} "
              f"{100 * r['worse_than_numpy']:>7.3f}% {r['time_ratio']:>10.1f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "default_accuracy.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
