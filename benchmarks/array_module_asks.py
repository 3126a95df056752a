"""How often one call asks which array module (NumPy or CuPy) its data lives in (issue 32: ask once, carry it).

Counts the calls of :func:`rnstensor.arrays.array_module` (every module's binding of it) during one warm call of
each entry point, by calling function. The front end's own question (``dispatch``, the mixed-devices check), the
leaf utilities that read it from their one argument (``exact_float``, ``RNSTensor.exponent``, the public
``encode`` / ``decode`` the runtime calls) remain; the executor, the certificate and the tile driver take it from
their callers (``tests/test_run_array_module.py``).

Usage: ``python benchmarks/array_module_asks.py [--json out.json]``
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rnstensor as rt  # noqa: E402
import rnstensor.arrays as arrays  # noqa: E402
from _timing import add_output_options, parse_args, save_result  # noqa: E402

__all__ = ["count", "main"]


def count(call) -> collections.Counter:
    """``{'module:function': asks}`` of one call of ``call()`` (after one warm-up call)."""
    asks: collections.Counter = collections.Counter()
    real = arrays.array_module

    def counted(*a, **k):
        f = sys._getframe(1)
        asks[f"{f.f_code.co_filename.split('rnstensor' + os.sep)[-1]}:{f.f_code.co_name}"] += 1
        return real(*a, **k)

    bound = [m for name, m in list(sys.modules.items())
             if name.startswith("rnstensor") and getattr(m, "array_module", None) is real]
    call()
    for m in bound:
        m.array_module = counted
    try:
        call()
    finally:
        for m in bound:
            m.array_module = real
    return asks


def cases() -> dict:
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((40, 50)), rng.standard_normal((50, 30))
    X, M = rng.standard_normal((6, 7, 8)), rng.standard_normal((8, 5))
    S, T = rng.standard_normal((4, 5, 6)), rng.standard_normal((4, 6, 3))
    U, V, W = (rng.standard_normal((3, n)) for n in (6, 7, 8))
    ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
    plan, Y = rt.plan_chain(ops, [0, 1, 2]), rng.uniform(-1, 1, (16, 8, 8, 8))
    return {
        "dgemm": lambda: rt.dgemm(A, B),
        "dgemm moduli='auto'": lambda: rt.dgemm(A, B, moduli="auto"),
        "matmul, a stack of 4": lambda: rt.matmul(S, T),
        "einsum ijk,kl->ijl": lambda: rt.einsum("ijk,kl->ijl", X, M),
        "einsum ijk,ai,bj,ck->abc": lambda: rt.einsum("ijk,ai,bj,ck->abc", X, U, V, W),
        "einsum ijk,kl->ijl moduli='auto'": lambda: rt.einsum("ijk,kl->ijl", X, M, moduli="auto"),
        "ChainPlan.run (default)": lambda: plan(Y),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_options(ap)
    args = parse_args(ap, argv)
    rows = []
    for name, call in cases().items():
        asks = count(call)
        top = ", ".join(f"{where} {n}" for where, n in asks.most_common(4))
        print(f"{name:36s} {sum(asks.values()):4d}   ({top})")
        rows.append({"call": name, "asks": sum(asks.values()), "by": dict(asks)})
    return save_result(args, "array_module_asks", {"rows": rows})


if __name__ == "__main__":
    main()
