"""Instructions per DoF of the fused chain kernel, read from its SASS (no GPU needed).

For RescaleBE plans (d = 3, s = 15, n in {4, 8, 16}) this builds the fused
chain kernel twice with NVRTC for sm_90a — the generic build that reads the
plan from memory, and the plan's specialized build (its program compiled in
as constants) — and reads each stage's loop body in the SASS:

* encode: one input entry per iteration;
* each mode product: one row per iteration, ``n_out`` outputs on every plane;
* each drop + extension: one entry per iteration;
* decode: one output entry per iteration.

Per DoF the cost is ``encode + sum(product / n_out) + sum(drop) + decode``
instructions of the specialized build (a static count of each loop body: in
that build every inner loop is unrolled, so one iteration runs the body once;
rare paths such as the 2^k factor of subnormal inputs sit outside). The
generic build's loops nest with data-dependent trip counts, so only its
registers are reported. The issue
bound is ``SMs * 4 schedulers * clock * 32 lanes / (instructions per DoF)``
with the H200 datasheet's 132 SMs at 1.98 GHz — one instruction issued per
scheduler per clock, the most any kernel gets; the GPU run measures what the
kernel reaches against it.

    python benchmarks/chain_sass.py            # table; --json FILE writes the numbers
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rnstensor as rt  # noqa: E402
from rnstensor.kernels import build, fused  # noqa: E402
from sass_count import find_loops, parse_sass  # noqa: E402

H200_SMS = 132
H200_CLOCK = 1.98e9


def stages(cubin, kernel: str = "rns_chain_fused") -> list[tuple[str, int]]:
    """``[(stage, instructions in its loop body)]`` in program order, from the outermost loops of the SASS."""
    instrs = parse_sass(build.sass(cubin, [kernel])[kernel])
    out = []
    seen_product = False
    for lp in find_loops(instrs):
        if lp.depth != 1:
            continue
        ops = lp.opcodes
        n = sum(ops.values())
        if ops.get("IDP"):
            out.append(("product", n))
            seen_product = True
        elif ops.get("DMUL") and seen_product:
            out.append(("decode", n))
        elif ops.get("FFMA", 0) >= 20 and not seen_product:
            out.append(("encode", n))
        elif ops.get("FFMA", 0) >= 20:
            out.append(("drop", n))
    return out


def per_dof(st: list[tuple[str, int]], n_out: int) -> float:
    return sum(n / n_out if kind == "product" else n for kind, n in st)


def measure(n: int, d: int = 3, s: int = 15, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    plan = rt.plan_chain([rng.uniform(-1, 1, (n, n)) for _ in range(d)], tuple(range(d)), moduli=s)
    prog = fused.chain_program(plan, (n,) * d)
    row = {"n": n, "d": d, "s": s, "drops": list(plan.drops), "bits": plan.bits, "tensors_per_block": prog.nb,
           "shared_bytes": prog.shared_bytes}
    generic = build.compile_module("chain", "sm_90a")
    row["generic_registers"] = build.resource_usage(generic.path)["rns_chain_fused"].registers
    t = time.perf_counter()
    built = build.compile_module("chain", "sm_90a", fused.SPEC_OPTIONS, headers=fused.spec_header(prog))
    st = stages(built.path)
    usage = build.resource_usage(built.path)["rns_chain_fused"]
    total = per_dof(st, n)
    row["specialized"] = {
        "stages": st, "instructions_per_dof": round(total, 1), "registers": usage.registers,
        "local_bytes": usage.local + usage.stack, "compile_s": round(time.perf_counter() - t, 1),
        "issue_bound_gdofs": round(H200_SMS * 4 * H200_CLOCK * 32 / total / 1e9, 1),
    }
    return row


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="*", default=[4, 8, 16])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = [measure(n) for n in args.n]
    print(f"{'n':>3} {'drops':>8} {'instr/DoF':>10} {'encode':>7} {'products (per row)':>22} {'drops (per entry)':>18} "
          f"{'decode':>7} {'regs':>5} {'generic regs':>12} {'issue bound GDoF/s':>19}")
    for r in rows:
        m = r["specialized"]
        get = lambda k: [v for kind, v in m["stages"] if kind == k]  # noqa: E731
        print(f"{r['n']:>3} {str(tuple(r['drops'])):>8} {m['instructions_per_dof']:>10} {sum(get('encode')):>7} "
              f"{str(get('product')):>22} {str(get('drop')):>18} {sum(get('decode')):>7} {m['registers']:>5} "
              f"{r['generic_registers']:>12} {m['issue_bound_gdofs']:>19}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
