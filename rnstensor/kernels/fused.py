"""Programs for the fused chain kernel (``chain.cu``): a plan's layouts, tables and operators, built on the host.

The kernel keeps ``nb`` tensors of the batch in shared memory from the
float64 load to the float64 store. Everything it needs is decided here, once
per plan: the physical layout of every intermediate (the contracted axis
innermost, padded to 4 bytes; each product writes its new axis outermost, so
the next contracted axis moves inside), the operator residues on the planes
each product sees, the drop/extension and decode tables of the CPU backend,
and the exponent of every output entry. The exponent and the active moduli
of every step come from running the plan's own primitives on one all-zero
tensor (numpy backend), so the kernel's scale bookkeeping is the library's.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import arith
from ..primitives import _planes_on, drop, mode_product, strip_pending
from . import tables

__all__ = ["ChainProgram", "chain_program", "fusable", "spec_header", "SPEC_HEADER", "SPEC_OPTIONS", "SHARED_BUDGET", "SHARED_MAX", "THREADS"]

#: threads per block (RNS_CHAIN_THREADS in chain.cu)
THREADS = 256
#: shared memory a block aims for (two blocks per SM on Hopper)
SHARED_BUDGET = 100 * 1024
#: the most dynamic shared memory one block may take (Hopper: 227 KiB)
SHARED_MAX = 227 * 1024
#: row widths (4-byte words, the padded n_in / 4) the kernel is instantiated for
WIDTHS = tuple(range(1, 17))
#: entries per block the batch size aims for (enough rows for every thread)
_TARGET_ENTRIES = 4096

# program header and step record (the RC_* / RS_* slots of chain.cu)
_HEADER = 18
_STEP = 17


def _pad4(n: int) -> int:
    return -(-n // 4) * 4


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


def _width(n_in: int) -> Optional[int]:
    w = _pad4(n_in) // 4
    return w if w in WIDTHS else None


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a device cache key
class ChainProgram:
    """Everything one launch of ``rns_chain_fused`` needs for a plan.

    ``ints``/``floats``/``qd``/``ops`` are the program's four arrays;
    ``dexp_fp64``/``dexp_exact`` the exponent of every output entry for a
    tensor encoded with ``e = 0`` (the factor's power of two included for
    each decode); ``f`` the float factor; ``F``/``fneg`` the exact decode's
    factor limbs (``F`` is ``None`` when they do not fit its limbs).
    """

    ints: np.ndarray
    floats: np.ndarray
    qd: np.ndarray
    ops: np.ndarray
    dexp_fp64: np.ndarray
    dexp_exact: np.ndarray
    f: float
    F: Optional[np.ndarray]
    fneg: bool
    nb: int
    shared_bytes: int
    in_shape: tuple
    out_shape: tuple

    @property
    def threads(self) -> int:
        return THREADS


@dataclass(frozen=True)
class _Step:
    axis: int
    active: tuple  # planes of the product
    op: np.ndarray  # (L, n_out, n_in) residues on them
    dropped: tuple
    drop_active: tuple  # planes entering the drop
    after: tuple  # planes after the drop (and extension)


def _trace(plan, in_shape):
    """Run the plan's primitives on one zero tensor: every step's planes and operator, and the output scale."""
    x = np.zeros((1,) + tuple(in_shape))
    T = plan.encode_input(x, backend="numpy")
    first = T.active
    extend = plan.method == "rescale_be"
    steps = []
    for op, ax, dropped in plan.executed_steps():
        T, _ = strip_pending(T, 1 + ax)
        act = T.active
        planes = np.asarray(_planes_on(op, act, "op"))
        T = mode_product(T, op, 1 + ax, backend="numpy")
        before = T.active
        if dropped:
            T = drop(T, moduli=dropped, extend=extend, backend="numpy")
        steps.append(_Step(ax, act, planes, tuple(dropped), before, T.active))
    e = np.broadcast_to(T.scale.exponent(), T.shape).reshape(T.shape[1:]).astype(np.int64)
    return first, steps, T.active, e, int(T.scale.factor)


def _in_shape(plan) -> list[int]:
    shape = [None] * plan.ndim
    for a, n in plan._lengths.items():
        shape[a] = n
    if any(n is None for n in shape):
        missing = [a for a, n in enumerate(shape) if n is None]
        raise ValueError(f"axes {missing} are never contracted: their length comes from the input")
    return shape


def _layouts(plan, in_shape):
    """The physical layout of one tensor (outer -> inner) entering every product, and the final one.

    Each product writes its new axis outermost, so the axis the layout held
    second from the inside is the next innermost: the first layout lists the
    contracted axes in reverse order of first use, untouched axes outside.
    The batch is outside every layout. ``None`` if the plan's order breaks
    this cycle.
    """
    first_use = []
    for a in plan.axes:
        if a not in first_use:
            first_use.append(a)
    P = [a for a in range(plan.ndim) if a not in first_use] + first_use[::-1]
    ext = dict(enumerate(in_shape))
    seq = []
    for a, op in zip(plan.axes, plan.operators):
        if P[-1] != a:
            return None, None
        seq.append((list(P), dict(ext)))
        ext[a] = op.shape[0]
        P = [a] + P[:-1]
    return seq, (P, ext)


def _strides(P, ext):
    """Physical strides of every axis of one tensor in layout ``P`` (innermost padded to 4), and its size."""
    strides = {}
    s = 1
    for i, a in enumerate(reversed(P)):
        strides[a] = s
        s *= _pad4(ext[a]) if i == 0 else ext[a]
    return strides, s


def fusable(plan, shape=None) -> Optional[str]:
    """Why ``plan`` cannot run as one fused kernel (a sentence), or ``None`` if it can.

    ``shape``: the tensor shape, where an axis is never contracted.
    """
    if plan.method == "composed":
        return "the composed method decodes after every product"
    if any(np.iscomplexobj(op) for op in plan.operators):
        return "complex operators are not fused"
    try:
        in_shape = list(shape) if shape is not None else _in_shape(plan)
    except ValueError as exc:
        return str(exc)
    for op in plan.operators:
        if _width(op.shape[1]) is None:
            return f"an operator has {op.shape[1]} columns; the fused kernel takes at most {4 * WIDTHS[-1]}"
    seq, _ = _layouts(plan, in_shape)
    if seq is None:
        return f"the contraction order {plan.axes} needs a transpose between products"
    return None


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def chain_program(plan, shape=None, budget: int = SHARED_BUDGET) -> ChainProgram:
    """The fused kernel's program for ``plan`` (cached per plan and tensor shape).

    Raises
    ------
    ValueError
        If the plan cannot be fused (:func:`fusable` says why) or one tensor
        does not fit a block's shared memory.
    """
    key = (tuple(shape) if shape is not None else None, budget)
    per_plan = _CACHE.setdefault(plan, {})
    if key not in per_plan:
        per_plan[key] = _build(plan, shape, budget)
    return per_plan[key]


def _build(plan, shape, budget) -> ChainProgram:
    why = fusable(plan, shape)
    if why is not None:
        raise ValueError(f"this plan cannot run as one fused kernel: {why}")
    in_shape = list(shape) if shape is not None else _in_shape(plan)
    first, steps, final, dexp, factor = _trace(plan, in_shape)
    seq, (Pf, extf) = _layouts(plan, in_shape)
    out_shape = tuple(extf[a] for a in range(plan.ndim))

    ints: list[int] = [0] * (_HEADER + _STEP * len(steps))
    floats: list[np.ndarray] = []
    nfloat = [0]
    ops: list[np.ndarray] = []
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
        ops.append(flat)
        nops[0] += flat.size
        return off

    # operators padded to whole words (zero columns: the padding of a row never counts)
    scratch = max(len(final), 1)
    lmax = len(first)
    step_rec = []
    for st, (P, ext) in zip(steps, seq):
        L, n_out, n_in = st.op.shape
        W = _width(n_in)
        A = np.zeros((L, n_out, 4 * W), np.int8)
        A[:, :, :n_in] = st.op
        rec = {"L": L, "W": W, "n_out": n_out, "P": P, "ext": ext, "op": add_op(A),
               "red": add_floats(*tables.mod_consts(tuple(st.active)))}
        if st.dropped:
            ib, fb, out_active, nd, nr = tables.drop_tables(st.drop_active, plan.basis.moduli, st.dropped,
                                                            plan.method == "rescale_be")
            if tuple(out_active) != tuple(st.after):
                raise AssertionError(f"drop tables give planes {out_active}, the primitives {st.after}")
            rec["drop"] = (add_ints(ib), add_floats(fb))
            scratch = max(scratch, nd + nr)
        lmax = max(lmax, L, len(st.after))
        step_rec.append(rec)
    opbytes = nops[0]

    per_tensor = max(_strides(P, ext)[1] for P, ext in seq + [(Pf, extf)])

    def sizes(nb):
        cap = _pad16(nb * per_tensor)
        shared = 8 * (nb + (nb & 1)) + opbytes + 2 * lmax * cap + 4 * scratch * THREADS
        return cap, shared

    n_in_entries = math.prod(in_shape)
    nb = 1
    while nb < 64 and (2 * nb) * n_in_entries <= _TARGET_ENTRIES and sizes(2 * nb)[1] <= budget:
        nb *= 2
    cap, shared = sizes(nb)
    if shared > SHARED_MAX:
        raise ValueError(
            f"one tensor of shape {tuple(in_shape)} needs {shared} bytes of shared memory on {lmax} planes; "
            f"the fused kernel has {SHARED_MAX}: run the plan unfused (fused=False)"
        )

    # header
    enc = tables.encode_tables(tuple(first))
    Pm, IPm, Hm, C18, C36, pw, pa, per = enc
    hdr = {
        0: plan.ndim, 1: len(steps), 2: n_in_entries, 3: math.prod(out_shape), 4: nb, 5: len(first),
        6: plan.input_bits, 7: cap, 8: lmax, 9: opbytes,
        10: add_floats(Pm, IPm, Hm, C18, C36, pw), 11: pw.shape[1], 12: add_ints(np.concatenate([pa, per])),
    }

    def place_map(P, ext):
        strides, size = _strides(P, ext)
        vals = []
        for a in range(plan.ndim):
            vals += [ext[a], strides[a]]
        return add_ints(vals + [size])

    hdr[13] = place_map(seq[0][0], seq[0][1])
    hdr[14] = place_map(Pf, extf)
    dib, dfb, qd = tables.decode_tables(tuple(final))
    hdr[16] = add_ints(dib)
    hdr[17] = add_floats(dfb)

    buf = 0
    for s, rec in enumerate(step_rec):
        P, ext = rec["P"], rec["ext"]
        rows = [ext[a] for a in P[:-1]]
        MT = math.prod(rows)
        nlast = rows[-1] if rows else 1
        nlastpad = _pad4(nlast) if rows else 1
        Pn = [P[-1]] + P[:-1]
        out_ext = dict(ext)
        out_ext[P[-1]] = rec["n_out"]
        osb = _strides(Pn, out_ext)[1]
        base = _HEADER + _STEP * s
        dst = 1 - buf
        vals = [buf, dst, rec["L"], nb * MT, rec["W"], rec["n_out"], nlast, nlastpad, rec["op"], rec["red"], 0, 0,
                0, 0, nb * osb, MT, osb]
        buf = dst
        if "drop" in rec:
            vals[10], vals[11] = 1, 1 - buf
            vals[12], vals[13] = rec["drop"]
            buf = 1 - buf
        ints[base: base + _STEP] = vals
    hdr[15] = buf
    for k, v in hdr.items():
        ints[k] = int(v)

    f, k = arith.float_factor(factor)
    if tables.exact_decode_fits(tuple(final), factor):
        F, t2, fneg = tables.factor_limbs(factor)
    else:
        F, t2, fneg = None, 0, factor < 0
    dexp = dexp.reshape(-1)
    if np.abs(dexp).max(initial=0) + max(abs(k), abs(t2)) >= 1 << 30:
        raise ValueError("the plan's output exponents do not fit the fused kernel's int32 table")
    fl = np.concatenate(floats) if floats else np.zeros(1, np.float32)
    prog = ChainProgram(
        ints=np.array(ints, np.int32), floats=fl.astype(np.float32), qd=np.asarray(qd, np.float64),
        ops=np.concatenate(ops) if ops else np.zeros(16, np.int8),
        dexp_fp64=(dexp + k).astype(np.int32), dexp_exact=(dexp + t2).astype(np.int32), f=float(f),
        F=None if F is None else np.asarray(F, np.uint32), fneg=bool(fneg), nb=nb, shared_bytes=int(shared),
        in_shape=tuple(in_shape), out_shape=out_shape,
    )
    for a in (prog.ints, prog.floats, prog.qd, prog.ops, prog.dexp_fp64, prog.dexp_exact):
        a.setflags(write=False)
    return prog


def _c_array(kind: str, name: str, values) -> str:
    if kind == "int":
        body = ",".join(str(int(v)) for v in values)
    elif kind == "float":  # hex literals: every float32 exactly
        body = ",".join(float(v).hex() + "f" for v in np.asarray(values, np.float32))
    else:
        body = ",".join(float(v).hex() for v in np.asarray(values, np.float64))
    return f"constexpr {kind} {name}[]={{{body or '0'}}};"


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
    text = "// generated by rnstensor.kernels.fused.spec_header: one plan's fused chain program\n"
    text += "#pragma once\nnamespace rns_spec {\n" + "\n".join((
        _c_array("int", "PI", program.ints),
        _c_array("float", "PF", program.floats),
        _c_array("double", "QD", program.qd),
        _c_array("int", "OPW", words),
    )) + "\n}  // namespace rns_spec\n"
    return {SPEC_HEADER: text}
