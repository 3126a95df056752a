"""Count the instructions of a kernel's SASS by class, and find its loops: a helper of the performance model.

Reads the text that ``cuobjdump --dump-sass`` prints (or ``nvdisasm``'s), so
it needs no GPU and nothing of rnstensor: the parsing functions take plain
text. ``python benchmarks/sass_count.py [--module entry] [--kernel K] [--arch sm_90a]``
compiles rnstensor's kernel modules with ``rnstensor.kernels.build`` (NVRTC and
cuobjdump from the pip wheels) and prints a table; ``--cubin FILE`` reads any cubin.

What a static count is and is not. It counts the instructions *in the binary*,
each once. The dynamic count per entry (what the issue-rate floor needs)
depends on the trip counts of the loops, which for rnstensor's per-entry
kernels are set by run-time tables (the number of moduli dropped, kept and
restored). :func:`find_loops` gives each loop (a backward branch) with the class
counts of its body, so a model can weigh a body by its trip count; the exact
dynamic count comes from ``ncu`` (``smsp__inst_executed.sum``) on the GPU.

Classes (the unit that executes them on sm_80 .. sm_90; rates per SM per clock
from the CUDA C++ Programming Guide's throughput table, cc 9.0, as leads):

=========  =====================================================  ============
class      opcodes                                                 lanes/SM/clk
=========  =====================================================  ============
tensor     IMMA HMMA IGMMA HGMMA QGMMA DMMA BMMA WARPGROUP*       tensor cores
fp32       FFMA FADD FMUL FMNMX FSETP FSEL FSET FCHK FSWZADD      128
fp16       HFMA2 HADD2 HMUL2 HSETP2 HMNMX2 (HFMA2.MMA is a move)  -
fp64       DFMA DADD DMUL DSETP DMNMX                             64 (H100/H200)
int        IMAD IADD3 LOP3 SHF LEA ISETP SEL PRMT VIADD ...       64
conv       F2I I2F F2F I2I F2FP I2FP FRND                         16
mufu       MUFU                                                   16
ld_global  LDG LD                                                 -
st_global  STG ST RED ATOM ATOMG                                  -
shared     LDS STS LDSM STSM ATOMS                                -
const      LDC (register-indexed constant loads)                  -
local      LDL STL (spills, stack arrays)                         -
uniform    U* (ULDC UMOV UIADD3 ...), S2UR R2UR VOTEU             uniform pipe
move       MOV MOV32I S2R CS2R SHFL                               -
control    BRA EXIT BAR BSSY BSYNC CALL RET NOP WARPSYNC ...      -
other      everything else
=========  =====================================================  ============
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from typing import Iterable, Sequence

__all__ = [
    "CLASSES",
    "Instr",
    "Loop",
    "classify",
    "parse_sass",
    "split_functions",
    "class_counts",
    "find_loops",
    "kernel_report",
    "format_report",
]

CLASSES: tuple[str, ...] = (
    "tensor", "fp32", "fp16", "fp64", "int", "conv", "mufu", "ld_global", "st_global", "shared", "const", "local",
    "uniform", "move", "control", "other",
)

_EXACT: dict[str, str] = {}
for _cls, _ops in {
    "tensor": "IMMA HMMA IGMMA HGMMA QGMMA DMMA BMMA WARPGROUP WGMMA",
    "fp32": "FFMA FADD FMUL FMNMX FSETP FSEL FSET FCHK FSWZADD FFMA32I FADD32I FMUL32I",
    "fp16": "HFMA2 HADD2 HMUL2 HSETP2 HMNMX2 HSET2 HFMA2_32I HADD2_32I HMUL2_32I",
    "fp64": "DFMA DADD DMUL DSETP DMNMX DSET",
    "int": ("IMAD IMADSP IMUL IADD3 IADD IADD32I LOP3 LOP LOP32I SHF SHL SHR LEA ISETP ISCADD SEL IMNMX IABS POPC FLO "
            "BREV PRMT BMSK BFE BFI IDP IDP4A IDP2A ICMP PLOP3 P2R R2P VABSDIFF VABSDIFF4 VIADD VIMNMX VIMNMX3 "
            "VIADDMNMX IMAD32I ISCADD32I SGXT"),
    "conv": "F2I I2F F2F I2I F2FP I2FP FRND I2IP F2IP",
    "mufu": "MUFU",
    "ld_global": "LDG LD LDGSTS",
    "st_global": "STG ST RED ATOM ATOMG REDG",
    "shared": "LDS STS LDSM STSM ATOMS",
    "const": "LDC",
    "local": "LDL STL",
    "move": "MOV MOV32I S2R CS2R SHFL",
    "control": ("BRA BRX JMP JMX EXIT RET CALL BSSY BSYNC BAR BPT WARPSYNC NOP YIELD DEPBAR MEMBAR ERRBAR CCTL "
                "VOTE ELECT NANOSLEEP KILL BMOV RPCMOV PRET SYNCS FENCE ACQBULK UTMALDG UTMASTG UBLKCP"),
}.items():
    for _op in _ops.split():
        _EXACT[_op] = _cls

# "/*0090*/   @!P0 BRA 0xf70 ;" (cuobjdump) or "/*0090*/ @!P0 BRA `(.L_x_1) ;" (nvdisasm)
_LINE = re.compile(r"/\*([0-9a-fA-F]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\b([^;]*);")
_FUNC = re.compile(r"^\s*(?:Function\s*:\s*|\.text\.)(\S+?):?\s*$")
_TARGET = re.compile(r"0x([0-9a-fA-F]+)")


def classify(opcode: str) -> str:
    """The class (one of :data:`CLASSES`) of a SASS opcode, with or without modifiers (``IMMA.16832.S8.S8``)."""
    base = opcode.split(".", 1)[0].upper()
    if base in _EXACT:
        cls = _EXACT[base]
        if cls == "tensor" or base != "HFMA2" or ".MMA" not in opcode:
            return cls
        return "move"  # HFMA2.MMA Rd, -RZ, RZ, a, b: the compiler's constant move
    if base in ("S2UR", "R2UR", "VOTEU") or (base.startswith("U") and len(base) > 2):
        return "uniform"
    return "other"


@dataclass(frozen=True)
class Instr:
    """One SASS instruction: byte address, guard predicate (``''`` if none), opcode with modifiers, operands."""

    addr: int
    pred: str
    opcode: str
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".", 1)[0]

    @property
    def cls(self) -> str:
        return classify(self.opcode)

    def branch_target(self) -> int | None:
        """The absolute target address of a ``BRA`` with a numeric target, else None."""
        if self.base not in ("BRA", "JMP"):
            return None
        m = _TARGET.search(self.operands)
        return int(m.group(1), 16) if m else None


def parse_sass(text: str) -> list[Instr]:
    """The instructions of one function's SASS text, in address order (encodings and comments dropped)."""
    out = []
    for line in text.splitlines():
        m = _LINE.search(line)
        if m:
            out.append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return out


def split_functions(text: str) -> dict[str, str]:
    """``{function name: its SASS text}`` from a whole ``cuobjdump --dump-sass`` listing."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


def class_counts(instrs: Iterable[Instr]) -> dict[str, int]:
    """Instructions per class (every class of :data:`CLASSES` present, zeros included) and ``'total'``."""
    counts = dict.fromkeys(CLASSES, 0)
    n = 0
    for ins in instrs:
        counts[ins.cls] += 1
        n += 1
    counts["total"] = n
    return counts


def is_reduction(ins: Instr) -> bool:
    """Whether ``ins`` marks one centered reduction: its rounding step, ``FRND`` (a floor) or the
    subtraction of the magic number 1.5 * 2**23 after the rounding FMA (rns_arith.cuh)."""
    return ins.base == "FRND" or (ins.base == "FADD" and "-12582912" in ins.operands)


@dataclass
class Loop:
    """A loop found from a backward branch: body ``[start, end]`` (byte addresses, inclusive), nesting depth."""

    start: int
    end: int
    depth: int = 1
    counts: dict = field(default_factory=dict)
    opcodes: dict = field(default_factory=dict)
    innermost: bool = True
    reductions: int = 0

    def contains(self, other: "Loop") -> bool:
        return self.start <= other.start and other.end <= self.end and (self.start, self.end) != (other.start, other.end)


def find_loops(instrs: Sequence[Instr]) -> list[Loop]:
    """Every loop of the function: one per backward branch (``BRA`` to a lower or equal address, not a self-jump).

    The body is the address range from the branch target to the branch. Two
    back edges to one header (a ``continue``) make one loop, the widest. A
    loop's depth counts the loops that contain it (1 = outermost); a loop is
    innermost when it contains no other. ``counts`` are :func:`class_counts` of
    the body, ``opcodes`` the base-opcode histogram.
    """
    edges: dict[int, int] = {}
    for ins in instrs:
        t = ins.branch_target()
        if t is not None and t < ins.addr:  # t == addr: the trailing 'BRA self' after EXIT
            edges[t] = max(edges.get(t, ins.addr), ins.addr)
    loops = [Loop(s, e) for s, e in sorted(edges.items())]
    for lp in loops:
        body = [i for i in instrs if lp.start <= i.addr <= lp.end]
        lp.counts = class_counts(body)
        hist: dict[str, int] = {}
        for i in body:
            hist[i.base] = hist.get(i.base, 0) + 1
        lp.opcodes = hist
        lp.reductions = sum(1 for i in body if is_reduction(i))
        lp.depth = 1 + sum(1 for o in loops if o.contains(lp))
        lp.innermost = not any(lp.contains(o) for o in loops)
    return loops


def kernel_report(text: str) -> dict:
    """``{'counts', 'opcodes', 'loops'}`` of one function's SASS text (see :func:`class_counts`, :func:`find_loops`)."""
    instrs = parse_sass(text)
    hist: dict[str, int] = {}
    for i in instrs:
        hist[i.base] = hist.get(i.base, 0) + 1
    loops = find_loops(instrs)
    return {
        "counts": class_counts(instrs),
        "opcodes": dict(sorted(hist.items(), key=lambda kv: -kv[1])),
        "loops": [
            {"start": lp.start, "end": lp.end, "depth": lp.depth, "innermost": lp.innermost, "counts": lp.counts,
             "opcodes": lp.opcodes, "reductions": lp.reductions}
            for lp in loops
        ],
    }


def format_report(name: str, rep: dict, loops: bool = True) -> str:
    """A few lines: the class counts of the function, then (optionally) each innermost loop's body."""
    c = rep["counts"]
    shown = [k for k in CLASSES if c.get(k)]
    lines = [f"{name}: {c['total']} instructions: " + ", ".join(f"{k} {c[k]}" for k in shown)]
    if loops:
        for lp in rep["loops"]:
            if lp["innermost"]:
                lc = lp["counts"]
                lines.append(
                    f"  loop 0x{lp['start']:04x}-0x{lp['end']:04x} depth {lp['depth']}: {lc['total']} instr: "
                    + ", ".join(f"{k} {lc[k]}" for k in CLASSES if lc.get(k))
                )
    return "\n".join(lines)


def _cli(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", action="append", help="rnstensor kernel module(s) (default: all)")
    ap.add_argument("--kernel", action="append", help="only these functions")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--cubin", help="a cubin file instead of rnstensor's modules")
    ap.add_argument("--no-loops", action="store_true")
    args = ap.parse_args(argv)
    texts: dict[str, str] = {}
    if args.cubin:
        sys.path.insert(0, ".")
        from rnstensor.kernels import build  # cuobjdump lookup only

        texts.update(build.sass(args.cubin, args.kernel or ()))
    else:
        from rnstensor.kernels import build

        for mod in args.module or list(build.MODULES):
            path = build.compile_module(mod, args.arch).path
            texts.update(build.sass(path, args.kernel or ()))
    for name in sorted(texts):
        if args.kernel and name not in args.kernel:
            continue
        print(format_report(name, kernel_report(texts[name]), loops=not args.no_loops))
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli())
