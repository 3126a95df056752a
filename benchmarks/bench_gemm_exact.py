"""Correctly rounded DGEMM (``moduli='auto'``) against FLINT's exact product and numpy, both engines, same run.

For square N x N x N U[-1, 1) data (53-bit multiples: ``'auto'`` keeps the
53-bit width, the integers are ``x * 2**53``), in one process and
interleaved round by round (this machine's speed drifts by up to 2x within
minutes, so only ratios inside a round mean anything):

- ``numpy``: ``a @ b`` in float64 (OpenBLAS);
- ``flint``: ``fmpz_mat`` product of the same 53-bit integers (python-flint,
  the product alone, its conversion from Python lists not timed; skipped
  when python-flint is not installed: ``pip install python-flint``);
- ``int8``: ``rt.dgemm(moduli='auto')`` with the INT8 residue product
  (``cpu_gemm.ENGINE = 'int8'``);
- ``wide``: the same call on the float64-BLAS engine of wide moduli
  (``'wide'``); ``default`` is what the backend picks by shape (``None``).

Both engines' results are compared bit for bit in every round, and the phase
split of one default call (``rnstensor.gemm.PHASES``, and the wide engine's
own ``cpu_gemm.PHASES``) is printed.

``--complex``: ``zgemm(moduli='auto')`` (the 3M form on either engine) on
complex U[-1, 1) data against numpy's complex128 product, no FLINT row.

Usage: ``python benchmarks/bench_gemm_exact.py [--sizes 256 512 1024] [--repeat 3] [--rounds 2] [--complex] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import rnstensor as rt
from _timing import add_output_options, best_time, progress, parse_args, save_result
from rnstensor import gemm as G
from rnstensor.backends import cpu_gemm

try:
    import flint
except ImportError:  # optional: the FLINT baseline
    flint = None


def _engine(name):
    def run(a, b):
        old = cpu_gemm.ENGINE
        cpu_gemm.ENGINE = name
        try:
            return (rt.zgemm if a.dtype.kind == "c" else rt.dgemm)(a, b, moduli="auto")
        finally:
            cpu_gemm.ENGINE = old
    return run


ENGINES = {"int8": _engine("int8"), "wide": _engine("wide"), "default": _engine(None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--complex", action="store_true", help="zgemm on complex U[-1, 1) parts (no FLINT baseline)")
    add_output_options(ap)
    args = parse_args(ap)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, numpy {np.__version__}, "
          f"flint {getattr(flint, '__version__', 'not installed')}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows = []
    rng = np.random.default_rng(0)
    bar = progress(total=len(args.sizes) * args.rounds, desc="bench_gemm_exact", unit="round")
    for N in args.sizes:
        a, b = rng.uniform(-1, 1, (N, N)), rng.uniform(-1, 1, (N, N))
        if args.complex:
            a, b = a + 1j * rng.uniform(-1, 1, (N, N)), b + 1j * rng.uniform(-1, 1, (N, N))
        fa = fb = None
        if flint is not None and not args.complex:
            fa = flint.fmpz_mat((a * 2.0**53).astype(np.int64).tolist())
            fb = flint.fmpz_mat((b * 2.0**53).astype(np.int64).tolist())
        s = G.gemm_moduli(a, b, "auto")
        kind = "complex" if args.complex else "real"
        mods, chunk = cpu_gemm.wide_plan(N, (6 if args.complex else 1) * N * 4**G.gemm_width(s, N, kind))
        for rnd in range(args.rounds):
            t = {"numpy": best_time(lambda: a @ b, args.repeat)}
            if fa is not None:
                t["flint"] = best_time(lambda: fa * fb, max(1, args.repeat - 1))
            res = {}
            for name, run in ENGINES.items():
                t[name] = best_time(lambda: res.__setitem__(name, run(a, b)), args.repeat)
            same = all(np.array_equal(res["int8"].view(np.int64), r.view(np.int64)) for r in res.values())
            G.PHASES, cpu_gemm.PHASES = {}, {}
            ENGINES["default"](a, b)
            phases = {k: round(v * 1e3, 1) for k, v in G.PHASES.items()}
            phases.update({"engine " + k: round(v * 1e3, 1) for k, v in cpu_gemm.PHASES.items()})
            G.PHASES = cpu_gemm.PHASES = None
            row = {"N": N, "round": rnd, "s": s, "wide_moduli": len(mods), "chunk": chunk, "same_bits": same,
                   "ms": {k: round(v * 1e3, 2) for k, v in t.items()}, "phases_ms": phases}
            rows.append(row)
            ratios = " ".join(f"{k}/numpy {v / t['numpy']:.2f}" for k, v in t.items() if k != "numpy")
            if "flint" in t:
                ratios += " " + " ".join(f"{k}/flint {t[k] / t['flint']:.2f}" for k in ENGINES)
            bar.update()
            bar.write(f"N={N} round {rnd}: s={s}, wide {len(mods)} moduli (chunk {chunk}), same bits {same}; "
                  + " ".join(f"{k} {v * 1e3:.1f} ms" for k, v in t.items()) + f"; {ratios}; phases {phases}")
    bar.close()
    save_result(args, "gemm_exact", {"rows": rows})


if __name__ == "__main__":
    main()
