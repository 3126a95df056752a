"""The fused-kernel packer: a residue program (:mod:`rnstensor.program`) as the parameters of ``chain.cu``.

The kernel keeps ``nb`` tensors of the batch in shared memory from the
float64 load to the float64 store. Everything it needs is decided here, once
per program, by reading the program's steps (an interpreter of the program
beside execution, the error analysis and planning): its *stages* (the drops
of every input, then sums of mode products along one axis or of Hadamard
products), the active moduli and shape of every tensor, and the exponent of
every output entry (for an input and fields encoded with exponent 0). From
those: the physical layout of every intermediate (the contracted axis
innermost, padded to 4 bytes; each product writes its new axis outermost, so
the next contracted axis moves inside), the shared-memory slot of every live
tensor and the barriers between ops, the operator residues on the planes
each product sees, and the drop/extension and decode tables of the CPU
backend. The records are written through the layout that
``rns_chain_layout.cuh`` defines (:mod:`rnstensor.kernels.layout`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import arith
from ..ir.lower import FusionRequest, Program as _Program, SlotPool, last_uses
from . import tables
from .layout import KERNEL, RC, RS

__all__ = ["ChainProgram", "compile_request", "reason", "program_or_reason", "spec_header", "specialize_by_default", "SPEC_MAX_OPS",
           "SPEC_HEADER", "SPEC_OPTIONS", "SHARED_BUDGET", "SHARED_MAX", "THREADS"]

#: threads per block (RNS_CHAIN_THREADS of rns_chain_layout.cuh)
THREADS = KERNEL["THREADS"]
#: shared memory a block of several tensors aims for: the most a block may opt in to on every arch the kernels
#: are built for (sm_86 / sm_89: 99 KiB; two such blocks per SM on Hopper)
SHARED_BUDGET = 99 * 1024
#: the most dynamic shared memory one block may take on any arch (Hopper: 227 KiB); a device with less declines
#: the larger programs (CudaBackend.compile_program: rnstensor.kernels.limits)
SHARED_MAX = 227 * 1024
#: row widths (4-byte words, the padded n_in / 4) the kernel is instantiated for
WIDTHS = tuple(range(1, 17))
#: entries per block the batch size aims for (enough rows for every thread)
_TARGET_ENTRIES = 4096

# program header and op record sizes (the RC_* / RS_* slots of rns_chain_layout.cuh)
_HEADER = max(RC.values()) + 1
_STEP = RS["SIZE"]
_TMAX = KERNEL["TMAX"]  # terms of one sum
_PRODUCT_TMAX = KERNEL["PRODUCT_TMAX"]  # terms of one sum of mode products, rows of <= 4 words


def _pad4(n: int) -> int:
    return -(-n // 4) * 4


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


def _width(n_in: int) -> Optional[int]:
    w = _pad4(n_in) // 4
    return w if w in WIDTHS else None


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a device cache key
class ChainProgram:
    """Everything one launch of ``rns_chain_fused`` needs for a program (a chain plan, a FEM operator).

    ``ints``/``floats``/``qd``/``ops`` are the program's four arrays;
    ``dexp_fp64``/``dexp_exact`` the exponent of every output entry for a
    tensor encoded with ``e = 0`` (the factor's power of two included for
    each decode); ``f + g`` the factor as two floats (``arith.float_factor``); ``F``/``fneg`` the exact decode's
    factor limbs (``F`` is ``None`` when they do not fit its limbs).
    """

    ints: np.ndarray
    floats: np.ndarray
    qd: np.ndarray
    ops: np.ndarray
    dexp_fp64: np.ndarray
    dexp_exact: np.ndarray
    f: float
    g: float
    F: Optional[np.ndarray]
    fneg: bool
    nb: int
    shared_bytes: int
    in_shape: tuple
    out_shape: tuple
    nfield: int = 0  # Hadamard field components per element (0: none)
    nq: int = 0  # entries per field component

    @property
    def threads(self) -> int:
        return THREADS


def _first_layout(axes, ndim: int) -> list:
    """The first physical layout (outer -> inner): untouched axes outside, then the contracted axes in
    reverse order of first use, so that each product's rotation brings the next one inside."""
    first_use = list(dict.fromkeys(axes))
    return [a for a in range(ndim) if a not in first_use] + first_use[::-1]


def _layouts(prog: _Program):
    """The physical layout of one tensor (outer -> inner) entering every stage, and the final one.

    Each product writes its new axis outermost, so the axis the layout held
    second from the inside is the next innermost (:func:`_first_layout`); a
    Hadamard stage keeps the layout. All live tensors share it. The batch is
    outside every layout. ``None`` if the program's order breaks this cycle.
    """
    P = _first_layout(prog.axes, prog.ndim)
    ext = dict(enumerate(prog.in_shape))
    seq = []
    for st in prog.stages:
        if st.kind == "product" and P[-1] != st.axis:
            return None, None
        seq.append((list(P), dict(ext)))
        if st.kind == "product":
            ext[st.axis] = st.outputs[0][0].op.shape[1]
            P = [st.axis] + P[:-1]
    return seq, (P, ext)


def _axes_cycle(axes, ndim: int) -> Optional[str]:
    """Why a product order breaks the layout cycle (a sentence), or ``None``."""
    P = _first_layout(axes, ndim)
    for a in axes:
        if P[-1] != a:
            return f"the contraction order {tuple(axes)} needs a transpose between products"
        P = [a] + P[:-1]
    return None


def _strides(P, ext):
    """Physical strides of every axis of one tensor in layout ``P`` (innermost padded to 4), and its size."""
    strides = {}
    s = 1
    for i, a in enumerate(reversed(P)):
        strides[a] = s
        s *= _pad4(ext[a]) if i == 0 else ext[a]
    return strides, s


def reason(request: FusionRequest, budget: int = SHARED_BUDGET) -> Optional[str]:
    """Why the fused kernel cannot run ``request`` (a sentence), or ``None`` if it can."""
    try:
        compile_request(request, budget)
    except ValueError as exc:
        return str(exc)
    return None


def compile_request(request: FusionRequest, budget: int = SHARED_BUDGET) -> ChainProgram:
    """The fused kernel's program for ``request`` (a chain plan's, an einsum's mode chains', a FEM operator's:
    :class:`~rnstensor.ir.lower.FusionRequest` holds only the residue program). Not cached: the front end keeps it.

    Raises
    ------
    ValueError
        If the program cannot run as one fused kernel (the reason) or one tensor does not fit a block's shared
        memory.
    """
    return _compile(request.stages(max_terms=_TMAX), budget, nfield=request.ncomp, nq=request.nq)


def _compile(prog: _Program, budget: int, nfield: int = 0, nq: int = 0) -> ChainProgram:
    """The kernel program of a residue program (``nfield`` field components of ``nq`` entries each).

    Ops: a drop op per input of a stage with drops, then a product or
    Hadamard op per output, a block barrier after each group. Every tensor
    lives in a shared-memory slot from the op that writes it to the last op
    that reads it; a freed slot is reused only after the next barrier.
    """
    in_shape, first, stages, dexp, factor = list(prog.in_shape), prog.first, prog.stages, prog.dexp, prog.factor
    for st in stages:
        for terms in st.outputs if st.kind == "product" else ():
            n_in = terms[0].op.shape[2]
            if _width(n_in) is None:
                raise ValueError(f"an operator has {n_in} columns; the fused kernel takes at most {4 * WIDTHS[-1]}")
    seq, last = _layouts(prog)
    if seq is None:
        raise ValueError(_axes_cycle(prog.axes, prog.ndim))
    Pf, extf = last
    out_shape = tuple(extf[a] for a in range(prog.ndim))

    ints: list[int] = [0] * _HEADER
    floats: list[np.ndarray] = []
    nfloat = [0]
    opsb: list[np.ndarray] = []
    nops = [0]

    def add_ints(values) -> int:
        off = len(ints)
        ints.extend(int(v) for v in np.asarray(values).reshape(-1))
        return off

    def add_floats(*arrays) -> int:
        off = nfloat[0]
        for a in arrays:
            a = np.asarray(a, np.float32).reshape(-1)
            floats.append(a)
            nfloat[0] += a.size
        return off

    def add_op(a: np.ndarray) -> int:
        off = nops[0]
        flat = np.zeros(_pad16(a.size), np.int8)
        flat[: a.size] = a.reshape(-1)
        opsb.append(flat)
        nops[0] += flat.size
        return off

    def place_map(P, ext):
        strides, size = _strides(P, ext)
        vals = []
        for a in range(prog.ndim):
            vals += [ext[a], strides[a]]
        return add_ints(vals + [size])

    last_use = last_uses(prog)
    records: list[dict] = []  # ops, with deferred geometry filled in once nb is known
    slot_of = {0: 0}
    pool = SlotPool()
    alloc = pool.alloc
    pending: list[int] = []

    def barrier():
        records[-1]["sync"] = 1
        pool.release(pending)
        pending.clear()

    scratch = max(len(prog.final_active), 1)
    lmax = len(first)
    for k, (st, (P, ext)) in enumerate(zip(stages, seq)):
        L = len(st.active)
        lmax = max(lmax, L, len(st.drop_active))
        red = add_floats(*tables.mod_consts(tuple(st.active)))
        in_slots = [slot_of[i] for i in st.inputs]
        if st.dropped:
            ib, fb, out_active, nd, nr = tables.drop_tables(st.drop_active, prog.basis, st.dropped, prog.extend)
            if tuple(out_active) != tuple(st.active):
                raise AssertionError(f"drop tables give planes {out_active}, the primitives {st.active}")
            scratch = max(scratch, nd + nr)
            tab = (add_ints(ib), add_floats(fb))
            dropped = []
            for i, s_in in zip(st.inputs, in_slots):
                s_out = alloc()
                records.append({"kind": 2, "out": s_out, "in": s_in, "L": len(out_active), "red": red,
                                "drop": tab, "layout": (P, ext)})
                dropped.append(s_out)
                if last_use[i] == k:
                    pending.append(s_in)
            barrier()
            pending.extend(dropped)  # the dropped copies die with this stage
            in_slots = dropped
        else:
            pending.extend(s for i, s in zip(st.inputs, in_slots) if last_use[i] == k)
        for terms, oid in zip(st.outputs, st.out_ids):
            s_out = alloc()
            slot_of[oid] = s_out
            if st.kind == "product":
                _, n_out, n_in = terms[0].op.shape
                W = _width(n_in)
                if len(terms) > 1 and (W > 4 or len(terms) > _PRODUCT_TMAX):  # rows in registers (chain.cu)
                    raise ValueError(f"a sum of {len(terms)} mode products over {n_in} points; the fused kernel "
                                     f"adds at most {_PRODUCT_TMAX} over at most 16")
                tl = []
                for t in terms:
                    A = np.zeros((L, n_out, 4 * W), np.int8)
                    A[:, :, :n_in] = t.op
                    tl += [in_slots[t.input], add_op(A)]
                records.append({"kind": 0, "out": s_out, "L": L, "red": red, "W": W, "n_out": n_out,
                                "terms": add_ints(tl), "nt": len(terms), "layout": (P, ext)})
            else:
                tl = []
                for t in terms:
                    tl += [in_slots[t.input], t.field]
                records.append({"kind": 1, "out": s_out, "L": L, "red": red, "terms": add_ints(tl), "nt": len(terms),
                                "fplane": add_ints([prog.basis.index(q) for q in st.active]),
                                "map": None, "layout": (P, ext)})
        barrier()
    opbytes = nops[0]
    if not records:
        raise ValueError("a program without a stage")

    per_tensor = max(_strides(P, ext)[1] for P, ext in seq + [(Pf, extf)])

    def sizes(nb):
        cap = _pad16(nb * per_tensor)
        # per tensor: its largest magnitude / exponent (8 bytes, an even count) and 2^e as two float64s
        shared = 8 * (nb + (nb & 1)) + 16 * nb + opbytes + pool.count * lmax * cap + 4 * scratch * THREADS
        return cap, shared

    n_in_entries = math.prod(in_shape)
    nb = 1
    while nb < 64 and (2 * nb) * n_in_entries <= _TARGET_ENTRIES and sizes(2 * nb)[1] <= budget:
        nb *= 2
    cap, shared = sizes(nb)
    if shared > SHARED_MAX:
        raise ValueError(
            f"one tensor of shape {tuple(in_shape)} needs {shared} bytes of shared memory ({pool.count} tensors on "
            f"{lmax} planes); the fused kernel has {SHARED_MAX}: run it unfused (fused=False)"
        )

    base0 = len(ints)
    ints.extend([0] * (_STEP * len(records)))
    for n, rec in enumerate(records):
        P, ext = rec["layout"]
        vals = [0] * _STEP
        put = {"KIND": rec["kind"], "SYNC": rec.get("sync", 0), "OUT": rec["out"], "L": rec["L"], "RED": rec["red"]}
        if rec["kind"] == 0:
            rows = [ext[a] for a in P[:-1]]
            MT = math.prod(rows)
            nlast = rows[-1] if rows else 1
            nlastpad = _pad4(nlast) if rows else 1
            out_ext = dict(ext)
            out_ext[P[-1]] = rec["n_out"]
            osb = _strides([P[-1]] + P[:-1], out_ext)[1]
            put.update(M=nb * MT, W=rec["W"], NOUT=rec["n_out"], NLAST=nlast, NLASTPAD=nlastpad, MT=MT, OSB=osb,
                       NT=rec["nt"], TERMS=rec["terms"])
        elif rec["kind"] == 1:
            put.update(NT=rec["nt"], TERMS=rec["terms"], FPLANE=rec["fplane"], MAP=place_map(P, ext))
        else:
            inner = ext[P[-1]]
            put.update(IN=rec["in"], NLAST=inner, NLASTPAD=_pad4(inner), DROP_I=rec["drop"][0], DROP_F=rec["drop"][1],
                       SLOTS=nb * math.prod(ext[a] for a in P))
        for name, v in put.items():
            vals[RS[name]] = v
        ints[base0 + _STEP * n: base0 + _STEP * (n + 1)] = vals

    enc = tables.encode_tables(tuple(first))
    Pm, IPm, Hm, CP, pw, pa, per = enc
    dib, dfb, qd = tables.decode_tables(tuple(prog.final_active))
    hdr = {
        "NDIM": prog.ndim, "STEPS": len(records), "NIN": n_in_entries, "NOUT": math.prod(out_shape), "NB": nb,
        "L0": len(first), "BITS": prog.bits, "CAP": cap, "LMAX": lmax, "OPBYTES": opbytes,
        "ENC_F": add_floats(Pm, IPm, Hm, CP, pw), "ENC_LDPW": pw.shape[1], "ENC_I": add_ints(np.concatenate([pa, per])),
        "ENC_MAP": place_map(seq[0][0], seq[0][1]), "DEC_MAP": place_map(Pf, extf), "DEC_BUF": slot_of[prog.final],
        "DEC_I": add_ints(dib), "DEC_F": add_floats(dfb), "NFIELD": nfield, "NQ": nq, "NSLOTS": pool.count, "OPS": base0,
    }
    for k, v in hdr.items():
        ints[RC[k]] = int(v)
    final = prog.final_active

    f, g, k = arith.float_factor(factor)
    if tables.exact_decode_fits(tuple(final), factor):
        F, t2, fneg = tables.factor_limbs(factor)
    else:
        F, t2, fneg = None, 0, factor < 0
    dexp = dexp.reshape(-1)
    if np.abs(dexp).max(initial=0) + max(abs(k), abs(t2)) >= 1 << 30:
        raise ValueError("the output exponents do not fit the fused kernel's int32 table")
    fl = np.concatenate(floats) if floats else np.zeros(1, np.float32)
    prog = ChainProgram(
        ints=np.array(ints, np.int32), floats=fl.astype(np.float32), qd=np.asarray(qd, np.float64),
        ops=np.concatenate(opsb) if opsb else np.zeros(16, np.int8),
        dexp_fp64=(dexp + k).astype(np.int32), dexp_exact=(dexp + t2).astype(np.int32), f=float(f), g=float(g),
        F=None if F is None else np.asarray(F, np.uint32), fneg=bool(fneg), nb=nb, shared_bytes=int(shared),
        in_shape=tuple(in_shape), out_shape=out_shape, nfield=nfield, nq=nq,
    )
    for a in (prog.ints, prog.floats, prog.qd, prog.ops, prog.dexp_fp64, prog.dexp_exact):
        a.setflags(write=False)
    return prog


def program_or_reason(make, decode: str) -> tuple[Optional[ChainProgram], Optional[str]]:
    """``(program, None)`` when the fused kernel can run ``make()`` for ``decode``, else ``(None, reason)``
    (a ``ValueError`` from ``make``, which builds the program, is the reason)."""
    try:
        prog = make()
    except ValueError as exc:
        return None, str(exc)
    if decode == "exact" and prog.F is None:
        return None, "the exact decode's factor is wider than the kernel's limbs"
    return prog, None


def _c_array(kind: str, name: str, values, qualifier: str = "constexpr") -> str:
    if kind == "int":
        body = ",".join(str(int(v)) for v in values)
    elif kind == "float":  # hex literals: every float32 exactly
        body = ",".join(float(v).hex() + "f" for v in np.asarray(values, np.float32))
    else:
        body = ",".join(float(v).hex() for v in np.asarray(values, np.float64))
    return f"{qualifier} {kind} {name}[]={{{body or '0'}}};"


#: programs with at most this many ops are specialized by default (the compile time grows with the
#: unrolled ops: ~5-20 s for a chain or the mass operator, ~2 min for the 3-D Poisson operator on 2 cores)
SPEC_MAX_OPS = 16

#: product rows of at most this many int32 words read their operator words from constant memory in a
#: specialized build (see spec_header)
SPEC_CONST_ROW_WORDS = 2


def specialize_by_default(program: ChainProgram) -> bool:
    """Whether :class:`~rnstensor.backends.cuda.CudaBackend` compiles ``program`` into its own kernel by default."""
    return int(program.ints[RC["STEPS"]]) <= SPEC_MAX_OPS


#: the generated header a specialized build includes, and the option that makes it do so
SPEC_HEADER = "rns_chain_spec.h"
SPEC_OPTIONS = ("-DRNS_SPEC_INCLUDE",)


def spec_header(program: ChainProgram) -> dict[str, str]:
    """``{SPEC_HEADER: text}``: the program as ``constexpr`` arrays, for a build of ``chain.cu`` for it alone.

    With the header included (option :data:`SPEC_OPTIONS`), the kernel reads
    the program's int, float and float64 arrays and the operators (as
    little-endian int32 words) from ``rns_spec::PI/PF/QD/OPW`` instead of
    its pointer arguments: every size, offset and table entry is a
    compile-time constant, its loops unroll and the tables turn into
    immediates. The header is part of the kernel cache key, so each plan is
    compiled once per machine.
    """
    words = np.frombuffer(program.ops.tobytes(), dtype="<i4")
    pi = program.ints
    K, base = int(pi[RC["STEPS"]]), int(pi[RC["OPS"]])
    records = [pi[base + _STEP * k: base + _STEP * (k + 1)] for k in range(K)]
    row_words = max([int(r[RS["W"]]) for r in records if int(r[RS["KIND"]]) == 0] or [0])
    # dp4a takes no immediate operand: constexpr words cost a move each (UMOV), words in constant memory
    # one uniform load per two (ULDC.64). But ptxas takes far longer on long rows of constant-memory
    # words (n = 16: 71 s against 11 s here), so they go there only for rows of at most
    # SPEC_CONST_ROW_WORDS words (n_in <= 8). The drops' and the decode's words (PIW) are few per entry.
    opw = "RNS_SPEC_WORDS" if row_words <= SPEC_CONST_ROW_WORDS else "constexpr"
    text = "// generated by rnstensor.kernels.fused.spec_header: one plan's fused chain program\n"
    text += "#pragma once\nnamespace rns_spec {\n" + "\n".join((
        _c_array("int", "PI", program.ints),
        _c_array("float", "PF", program.floats),
        _c_array("double", "QD", program.qd),
        _c_array("int", "OPW", words, opw),
        _c_array("int", "PIW", program.ints, "RNS_SPEC_WORDS"),
    )) + "\n}  // namespace rns_spec\n"
    return {SPEC_HEADER: text}
