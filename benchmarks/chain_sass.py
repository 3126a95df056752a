"""Instructions per DoF of the fused chain kernel, read from its SASS (no GPU needed).

For RescaleBE plans (d = 3, s = 15, n in {4, 8, 16}) this builds the fused
chain kernel twice with NVRTC for sm_90a — the generic build that reads the
plan from memory, and the plan's specialized build (its program compiled in
as constants) — and reads each stage's loop body in the SASS:

* encode: one input entry per iteration;
* each mode product: one row per iteration, ``n_out`` outputs on every plane (on the tensor
  cores, rows of 2 words and 8 outputs or of 4 words and 16 outputs: one group of 8 rows per
  warp iteration, which counts as 32 thread iterations);
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
scheduler per clock, the most any kernel gets. The pipe bound replaces the
instruction count by the busiest pipe's cycles per warp instruction of one SM
sub-partition (:func:`pipe_cycles`: the FMA pipe's two 16-lane halves, IMAD and
dp4a on the heavy half only, the 16-lane ALU, FP64 at half rate, conversions
at 16 lanes per SM, one shared-memory wavefront per SM clock); its rates are
Hopper leads, not measurements. The GPU run measures what the kernel reaches
against both.

    python benchmarks/chain_sass.py            # table; --json FILE writes the numbers, --plot FILE.png their figure
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rnstensor as rt  # noqa: E402
from _timing import add_output_options, parse_args, progress, save_result  # noqa: E402
from rnstensor.kernels import build, fused  # noqa: E402
from sass_count import find_loops, parse_sass  # noqa: E402

H200_SMS = 132
H200_CLOCK = 1.98e9


_KINDS = {0: "product", 1: "hadamard", 2: "drop"}


# opcode -> pipe for the pipe bound; anything else only takes its issue slot
_FMA_HEAVY = ("IMAD", "IDP", "IMUL")
_ALU = ("IADD3", "LOP3", "SHF", "LEA", "ISETP", "SEL", "PRMT", "IMNMX", "VIADD", "FLO", "POPC", "BFE", "BFI",
        "SGXT", "IABS", "FSEL", "FSETP", "FMNMX")
_FMA = ("FFMA", "FADD", "FMUL", "HFMA2", "HADD2", "HMUL2")
_FP64 = ("DFMA", "DADD", "DMUL", "DSETP", "DMNMX")
_XU = ("I2F", "F2I", "F2F", "I2I", "I2FP", "F2FP", "FRND", "MUFU")
_MIO = ("LDS", "STS", "ATOMS", "LDSM", "STSM")


def pipe_cycles(opcodes: dict) -> dict:
    """Cycles of one SM sub-partition per warp for these warp instructions, pipe by pipe (Hopper leads).

    ``issue``: one instruction per clock; ``fma``: the two 16-lane halves
    (FFMA, FADD, ... on either, IMAD and dp4a on the heavy one only: also
    ``fma_heavy``); ``alu``: 16 lanes; ``fp64``: 16 lanes (64 per SM);
    ``xu``: conversions at 16 lanes per SM; ``mio``: one shared-memory
    wavefront per SM clock, shared by four sub-partitions.
    """
    n = {"heavy": 0, "alu": 0, "fma": 0, "fp64": 0, "xu": 0, "mio": 0}
    for op, c in opcodes.items():
        base = op.split(".", 1)[0]
        for key, names in (("heavy", _FMA_HEAVY), ("alu", _ALU), ("fma", _FMA), ("fp64", _FP64), ("xu", _XU),
                           ("mio", _MIO)):
            if base in names:
                n[key] += c
    return {"issue": sum(opcodes.values()), "fma": n["fma"] + n["heavy"], "fma_heavy": 2 * n["heavy"],
            "alu": 2 * n["alu"], "fp64": 2 * n["fp64"], "xu": 8 * n["xu"], "mio": 4 * n["mio"]}


def program_cost(prog, cubin, kernel: str = "rns_chain_fused") -> dict:
    """Instructions per DoF of a specialized build, from the loop bodies of its SASS.

    The outermost loops come in program order: three for the per-tensor
    exponent, the encode (one entry per iteration), one per op (a product:
    one row of one tensor; a Hadamard product or a drop: one entry), the
    decode. Each body runs once per iteration in this build (every inner
    loop is unrolled), so a tensor costs ``sum(body * iterations)``.
    """
    instrs = parse_sass(build.sass(cubin, [kernel])[kernel])
    # the kernel's own loops: out-of-line subroutines (the encode's rare paths) follow its last EXIT
    last_exit = max(i.addr for i in instrs if i.base == "EXIT")
    tops = [lp for lp in find_loops(instrs) if lp.depth == 1 and lp.end < last_exit]
    pi = prog.ints
    K, nb, base, nin, nout = int(pi[1]), int(pi[4]), int(pi[21]), int(pi[2]), int(pi[3])
    if len(tops) < K + 2:
        raise ValueError(f"{len(tops)} outermost loops for {K} ops: not a specialized build?")
    loops = tops[-(K + 2):]
    body = [sum(lp.opcodes.values()) for lp in loops]
    stages = [("encode", body[0], nin)]
    for k in range(K):
        r = pi[base + 20 * k: base + 20 * (k + 1)]
        kind = _KINDS[int(r[0])]
        if kind == "product" and (int(r[7]), int(r[8])) in ((2, 8), (4, 16)) and int(r[13]) == 1:
            iters = 32 * -(-int(r[6]) // 8) / nb  # tensor cores: each group of 8 rows is one warp's iteration
        else:
            iters = int(r[11]) if kind == "product" else (int(pi[19]) if kind == "hadamard" else int(r[19]) // nb)
        stages.append((kind, body[1 + k], iters))
    stages.append(("decode", body[-1], nout))
    total = sum(n * it for _, n, it in stages)
    opcodes: dict = {}
    for lp, (_, _, it) in zip(loops, stages):
        for op, c in lp.opcodes.items():
            opcodes[op] = opcodes.get(op, 0) + c * it / nout
    return {"stages": stages, "per_dof": total / nout, "opcodes_per_dof": opcodes, "pipes": pipe_cycles(opcodes)}


def _measure(name: str, prog, dofs_per_tensor: int) -> dict:
    generic = build.compile_module("chain", "sm_90a")
    t = time.perf_counter()
    built = build.compile_module("chain", "sm_90a", fused.SPEC_OPTIONS, headers=fused.spec_header(prog))
    compile_s = time.perf_counter() - t
    cost = program_cost(prog, built.path)
    usage = build.resource_usage(built.path)["rns_chain_fused"]
    per_dof = cost["per_dof"]
    pipes = cost["pipes"]
    busiest = max(pipes, key=pipes.get)
    return {
        "pipe_cycles_per_dof": {k: round(v, 1) for k, v in pipes.items()}, "busiest_pipe": busiest,
        "pipe_bound_gdofs": round(H200_SMS * 4 * H200_CLOCK * 32 / pipes[busiest] / 1e9, 1),
        "program": name, "ops": int(prog.ints[1]), "tensors_per_block": prog.nb, "shared_bytes": prog.shared_bytes,
        "generic_registers": build.resource_usage(generic.path)["rns_chain_fused"].registers,
        "registers": usage.registers, "local_bytes": usage.local + usage.stack, "compile_s": round(compile_s, 1),
        "stages": cost["stages"], "instructions_per_dof": round(per_dof, 1),
        "issue_bound_gdofs": round(H200_SMS * 4 * H200_CLOCK * 32 / per_dof / 1e9, 1),
    }


def measure(n: int, d: int = 3, s: int = 15, seed: int = 0) -> dict:
    """A RescaleBE chain of ``d`` random ``n x n`` products on ``s`` moduli."""
    rng = np.random.default_rng(seed)
    plan = rt.plan_chain([rng.uniform(-1, 1, (n, n)) for _ in range(d)], tuple(range(d)), moduli=s)
    row = _measure(f"chain n={n}", fused.compile_request(plan.fusion_request((n,) * d)), n**d)
    row.update(n=n, d=d, s=s, drops=list(plan.drops))
    row["specialized"] = {"instructions_per_dof": row["instructions_per_dof"]}  # perf_model reads this
    return row


def measure_fem(kind: str, P: int) -> dict:
    """The 3-D mass or Poisson operator with ``P`` nodes per axis (``Q = P + 1`` Gauss points), 15 moduli."""
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    basis = TensorBasis(P)
    mesh = box_mesh(basis, shape=(1, 1, 1), curved=0.1)
    op = MassOperator(basis, mesh.qdata) if kind == "mass" else PoissonOperator(basis, mesh.G)
    return _measure(f"{kind} P={P}", fused.compile_request(op.fusion_request()), P**3)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="*", default=[4, 8, 16])
    ap.add_argument("--fem", nargs="*", default=["mass:4", "mass:8", "poisson:4"],
                    help="FEM operators as kind:P (the Poisson build takes about two minutes)")
    add_output_options(ap)
    args = parse_args(ap, argv)
    builds = [(measure, (n,)) for n in args.n]
    builds += [(measure_fem, (k, int(p))) for k, p in (f.split(":") for f in args.fem)]
    rows = []
    with progress(total=len(builds), desc="chain_sass (NVRTC builds)", unit="program") as bar:
        for fn, fargs in builds:
            bar.set_postfix_str(" ".join(str(a) for a in fargs))
            rows.append(fn(*fargs))
            bar.update()
    print(f"{'program':<14} {'ops':>4} {'instr/DoF':>10} {'regs':>5} {'generic regs':>12} {'compile s':>9} "
          f"{'issue bound':>11} {'pipe bound':>10} {'busiest':>9}   stages (body x iterations per tensor)")
    for r in rows:
        st = " ".join(f"{k[0]}{n}x{it}" for k, n, it in r["stages"])
        print(f"{r['program']:<14} {r['ops']:>4} {r['instructions_per_dof']:>10} {r['registers']:>5} "
              f"{r['generic_registers']:>12} {r['compile_s']:>9} {r['issue_bound_gdofs']:>11} "
              f"{r['pipe_bound_gdofs']:>10} {r['busiest_pipe']:>9}   {st}")
    print("pipe cycles per DoF:", "; ".join(f"{r['program']}: " + ", ".join(
        f"{k} {v}" for k, v in r["pipe_cycles_per_dof"].items()) for r in rows))
    print("GDoF/s on an H200 (132 SMs, 1.98 GHz); the pipe rates are Hopper leads, not measurements")
    save_result(args, "chain_sass", {"rows": rows})
    return rows


if __name__ == "__main__":
    main()
