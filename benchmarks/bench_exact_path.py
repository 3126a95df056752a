"""The exact value beyond one plan of 49 moduli (``rnstensor.run.exact_path``): its integer GEMM's two routes, and
``moduli='auto'`` there against numpy, every ratio from one interleaved run.

Part 1, the route threshold (:data:`rnstensor.run.exact_path.RESIDUE_GEMM_TERMS`): ``exact_int_matmul`` of
(1, 64, K) @ (1, K, 64) Python ints of 60 and 300 bits, by the residue GEMM of limbs and by the objects' own
product (both exact: the same integers, checked), for K from 8 to 256; printed with ``K`` per limb pair.

Part 2, the cost a user sees: ``rt.einsum(..., moduli='auto')`` on operands no plan of 49 moduli holds (entries
``randn * 2**U{-s..s}``) against numpy's ``einsum(optimize=True)`` of the same (float64, not correctly rounded):

- ``ij,jk,kl->il`` on 64 x 64 matrices, s = 150;
- the 4-index transform ``pqrs,pi,qj,rk,sl->ijkl``, n = 8, every operand s = 80 (wide160's span);
- a chain ``nabc,ia,jb,kc->nijk`` of three U[-1, 1) 8 x 8 operators on 64 tensors 8^3, X s = 200;
- ``rt.dgemm(a, b, moduli='auto')`` at 256^3 with ``a``'s rows spanning 2^+-400 (dgemm's exact split, the same
  integer GEMM);
- and, within one plan, ``rt.dgemm(a, b, c, beta=-0.3, moduli='auto')`` at 512^3 (the exact epilogue), with ``c``
  normal and with two of its entries 2^+-900 away from the rest.

Usage: ``python benchmarks/bench_exact_path.py [--rounds 3] [--json out.json]``
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rnstensor as rt  # noqa: E402
from _timing import add_output_options, interleaved, parse_args, save_result  # noqa: E402
from rnstensor.backends import get_backend  # noqa: E402
from rnstensor.run import exact_path  # noqa: E402

__all__ = ["main"]


def _ints(rng: random.Random, shape, bits: int) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        v = rng.getrandbits(bits)
        out[idx] = -v if rng.random() < 0.5 else v
    return out


def _routes(rounds: int) -> list:
    be = get_backend("cpu")
    rng = random.Random(0)
    rows = []
    saved = exact_path.RESIDUE_GEMM_TERMS
    try:
        for bits in (60, 300):
            for K in (8, 16, 32, 64, 128, 256):
                a, b = _ints(rng, (1, 64, K), bits), _ints(rng, (1, K, 64), bits)
                out = {}

                def by(threshold, key):
                    def run():
                        exact_path.RESIDUE_GEMM_TERMS = threshold
                        z, e = exact_path.exact_int_matmul(a, b, be)
                        out[key] = (z * 2**e) if e >= 0 else z  # (e is 0 on the objects' route)
                    return run

                best = interleaved({"residues": by(0, "residues"), "objects": by(1 << 40, "objects")}, rounds)
                pairs = (-(-bits // exact_path.LIMB_BITS)) ** 2
                same = bool((out["residues"] == out["objects"]).all())
                rows.append({"bits": bits, "K": K, "K_per_pair": K / pairs, "residues_s": best["residues"],
                             "objects_s": best["objects"], "same": same})
                print(f"{bits:4d}-bit K={K:4d} ({K / pairs:6.2f} per limb pair)  residues {best['residues'] * 1e3:7.1f} ms"
                      f"  objects {best['objects'] * 1e3:7.1f} ms  objects/residues {best['objects'] / best['residues']:5.2f}"
                      + ("" if same else "  DIFFERENT INTEGERS"))
    finally:
        exact_path.RESIDUE_GEMM_TERMS = saved
    return rows


def _cases() -> list:
    rng = np.random.default_rng(0)

    def w(shape, s):
        return rng.standard_normal(shape) * np.exp2(rng.integers(-s, s, shape))

    a, b, c = w((64, 64), 150), w((64, 64), 150), w((64, 64), 150)
    X4, C4 = w((8, 8, 8, 8), 80), [w((8, 8), 80) for _ in range(4)]
    ops, Xc = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)], w((64, 8, 8, 8), 200)
    plan = rt.plan_chain(ops, [0, 1, 2], moduli="auto")
    A, B = w((256, 256), 400), rng.standard_normal((256, 256))
    G, H, C = (rng.standard_normal((512, 512)) for _ in range(3))
    Cfar = C.copy()
    Cfar[3, 4], Cfar[100, 7] = 2.0**900, -(2.0**-900)
    return [
        ("dgemm 512^3 'auto', beta, C", lambda: rt.dgemm(G, H, C, beta=-0.3, moduli="auto"), lambda: G @ H - 0.3 * C),
        ("dgemm 512^3 'auto', beta, C: two entries 2^+-900", lambda: rt.dgemm(G, H, Cfar, beta=-0.3, moduli="auto"),
         lambda: G @ H - 0.3 * Cfar),
        ("einsum ij,jk,kl->il 64^2, 2^+-150", lambda: rt.einsum("ij,jk,kl->il", a, b, c, moduli="auto"),
         lambda: np.einsum("ij,jk,kl->il", a, b, c, optimize=True)),
        ("einsum pqrs,pi,qj,rk,sl->ijkl n=8, 2^+-80", lambda: rt.einsum("pqrs,pi,qj,rk,sl->ijkl", X4, *C4, moduli="auto"),
         lambda: np.einsum("pqrs,pi,qj,rk,sl->ijkl", X4, *C4, optimize=True)),
        ("chain d=3, 64 x 8^3, X 2^+-200", lambda: plan(Xc),
         lambda: np.einsum("nabc,ia,jb,kc->nijk", Xc, *ops, optimize=True)),
        ("dgemm 256^3, rows 2^+-400", lambda: rt.dgemm(A, B, moduli="auto"), lambda: A @ B),
    ]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    add_output_options(ap)
    args = parse_args(ap, argv)
    print("exact_int_matmul: (1, 64, K) @ (1, K, 64), its two routes")
    routes = _routes(args.rounds)
    print(f"\nmoduli='auto' beyond one plan of 49 moduli, against numpy (float64)\n{'case':44s} {'ours ms':>9s} "
          f"{'numpy ms':>9s} {'ratio':>8s}")
    rows = []
    for name, ours, numpy_call in _cases():
        best = interleaved({"ours": ours, "numpy": numpy_call}, args.rounds)
        ratio = best["ours"] / best["numpy"]
        print(f"{name:44s} {best['ours'] * 1e3:9.1f} {best['numpy'] * 1e3:9.3f} {ratio:8.0f}")
        rows.append({"case": name, "ours_s": best["ours"], "numpy_s": best["numpy"], "ratio": ratio})
    return save_result(args, "exact_path", {"routes": routes, "rows": rows})


if __name__ == "__main__":
    main()
