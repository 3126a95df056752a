"""Time the residue primitives: numpy reference vs the fused CPU backend, float64 einsum as the yardstick.

For a 2^22-entry tensor (8192 × 8 × 8 × 8) on s = 15 moduli: encode, one
n = 8 mode product, 7 drops + base extension, decode fp64 and exact. Prints a
table and writes JSON (``--json PATH``). The numpy reference of the exact
decode loops over Python ints per entry, so it is timed on a 2^16-entry slice
and reported per entry (marked ``*``).

Usage: ``python benchmarks/bench_primitives.py [--log2n 22] [--repeat 3] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse
import os
import platform

import numpy as np

import rnstensor as rt
from _timing import add_output_options, best_time, progress, parse_args, save_result
from rnstensor.backends import get_backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--log2n", type=int, default=22)
    ap.add_argument("--s", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=3)
    add_output_options(ap)
    args = parse_args(ap)

    n = 8
    N = 1 << args.log2n
    batch = N // n**3
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(batch, n, n, n))
    A = rng.uniform(-1, 1, size=(n, n))
    basis = rt.Basis.int8(args.s)
    L = len(basis)
    e = rt.encode(x, basis).scale.exponent()
    op = rt.encode(A, basis, shared_axes=(1,))
    op_planes = op.residues

    results = []

    def record(name, backend, seconds, bytes_moved, entries=N, note=""):
        per_entry = seconds / entries
        t_full = per_entry * N
        results.append(
            dict(op=name, backend=backend, seconds=t_full, gbs=bytes_moved / t_full / 1e9, note=note)
        )

    # the yardstick: numpy float64 einsum of one mode product (8 B in + 8 B out per entry)
    t = best_time(lambda: np.einsum("jk,bkmn->bjmn", A, x, optimize=True), args.repeat)
    record("float64 einsum, n=8 mode product", "numpy", t, 16 * N)

    for name in progress(("numpy", "cpu"), desc="bench_primitives", unit="backend"):
        be = get_backend(name)
        planes = be.encode(x, e, basis.moduli, 53)
        t = best_time(lambda: be.encode(x, e, basis.moduli, 53), args.repeat)
        record("encode (b=53)", name, t, (8 + L) * N)
        for axis in (1, 3):
            t = best_time(lambda: be.product(op_planes, planes, basis.moduli, axis), args.repeat)
            record(f"mode product n=8, axis {axis}", name, t, 2 * L * N)
        t = best_time(lambda: be.drop_extend(planes, basis.moduli, basis, 7, True), args.repeat)
        record("7 drops + base extension", name, t, 2 * L * N)
        t = best_time(lambda: be.decode(planes, basis.moduli, e, 1, "fp64"), args.repeat)
        record("decode fp64", name, t, (L + 8) * N)
        if name == "numpy":
            sl = planes[:, : max(1, (1 << 16) // n**3)]
            m = sl[0].size
            t = best_time(lambda: be.decode(sl, basis.moduli, e, 1, "exact"), 1)
            record("decode exact", name, t * N / m, (L + 8) * N, note="*")
        else:
            t = best_time(lambda: be.decode(planes, basis.moduli, e, 1, "exact"), args.repeat)
            record("decode exact", name, t, (L + 8) * N)

    yard = results[0]["seconds"]
    ref = {r["op"]: r["seconds"] for r in results if r["backend"] == "numpy"}
    print(f"\n{N} entries ({batch} x {n}^3), s = {L}, best of {args.repeat}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"{'operation':<34} {'backend':<7} {'ms':>9} {'GB/s':>7} {'vs numpy ref':>13} {'vs f64 einsum':>14}")
    for r in results:
        speed = ref.get(r["op"], r["seconds"]) / r["seconds"]
        print(
            f"{r['op']:<34} {r['backend']:<7} {r['seconds'] * 1e3:9.1f} {r['gbs']:7.2f} "
            f"{speed:12.1f}x {r['seconds'] / yard:13.2f}x {r['note']}"
        )
    print("* numpy reference exact decode timed on a 2^16-entry slice, scaled per entry")
    save_result(args, "primitives", {"entries": N, "rows": results})


if __name__ == "__main__":
    main()
