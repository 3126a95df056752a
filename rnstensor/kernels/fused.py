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
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from .. import arith
from ..encode import encode
from ..primitives import _planes_on, drop, hadamard, mode_product, strip_pending
from . import tables

__all__ = ["ChainProgram", "chain_program", "fusable", "operator_program", "operator_fusable", "spec_header",
           "SPEC_HEADER", "SPEC_OPTIONS", "SHARED_BUDGET", "SHARED_MAX", "THREADS"]

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
_HEADER = 20
_STEP = 21


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
    nfield: int = 0  # Hadamard field components per element (0: none)
    nq: int = 0  # entries per field component

    @property
    def threads(self) -> int:
        return THREADS


@dataclass(frozen=True)
class _Step:
    """One step of a linear program: a mode product (``op`` on the planes ``active``) or a Hadamard
    product with a per-element field (component ``field``), then the drops (and extension) after it."""

    kind: str  # 'product' or 'hadamard'
    axis: Optional[int]
    active: tuple  # planes the step works on
    op: Optional[np.ndarray]  # product: (L, n_out, n_in) residues on those planes
    field: int  # hadamard: the field component
    dropped: tuple
    drop_active: tuple  # planes entering the drop
    after: tuple  # planes after the drop (and extension)


@dataclass(frozen=True)
class _Linear:
    """A program of one tensor between one encode and one decode, as the fused kernel runs it.

    ``dexp``: the exponent of every output entry when the input (and every
    field) is encoded with exponent 0; ``factor``: the output's integer factor.
    """

    ndim: int
    in_shape: tuple
    bits: int
    basis: tuple
    extend: bool
    first: tuple
    steps: tuple
    final: tuple
    dexp: np.ndarray
    factor: int

    @property
    def axes(self) -> tuple:
        return tuple(st.axis for st in self.steps if st.kind == "product")


def _output_scale(T) -> tuple[np.ndarray, int]:
    e = np.broadcast_to(T.scale.exponent(), T.shape).reshape(T.shape[1:]).astype(np.int64)
    return e, int(T.scale.factor)


def _trace(plan, in_shape) -> _Linear:
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
        steps.append(_Step("product", ax, act, planes, -1, tuple(dropped), before, T.active))
    dexp, factor = _output_scale(T)
    return _Linear(plan.ndim, tuple(in_shape), plan.input_bits, plan.basis.moduli, extend, first, tuple(steps),
                   T.active, dexp, factor)


def _in_shape(plan) -> list[int]:
    shape = [None] * plan.ndim
    for a, n in plan._lengths.items():
        shape[a] = n
    if any(n is None for n in shape):
        missing = [a for a, n in enumerate(shape) if n is None]
        raise ValueError(f"axes {missing} are never contracted: their length comes from the input")
    return shape


def _layouts(lin: _Linear):
    """The physical layout of one tensor (outer -> inner) entering every step, and the final one.

    Each product writes its new axis outermost, so the axis the layout held
    second from the inside is the next innermost: the first layout lists the
    contracted axes in reverse order of first use, untouched axes outside; a
    Hadamard product keeps the layout. The batch is outside every layout.
    ``None`` if the program's order breaks this cycle.
    """
    first_use = []
    for a in lin.axes:
        if a not in first_use:
            first_use.append(a)
    P = [a for a in range(lin.ndim) if a not in first_use] + first_use[::-1]
    ext = dict(enumerate(lin.in_shape))
    seq = []
    for st in lin.steps:
        if st.kind == "product" and P[-1] != st.axis:
            return None, None
        seq.append((list(P), dict(ext)))
        if st.kind == "product":
            ext[st.axis] = st.op.shape[1]
            P = [st.axis] + P[:-1]
    return seq, (P, ext)


def _axes_cycle(axes, ndim: int, in_shape) -> Optional[str]:
    """Why a product order breaks the layout cycle (a sentence), or ``None``."""
    first_use = []
    for a in axes:
        if a not in first_use:
            first_use.append(a)
    P = [a for a in range(ndim) if a not in first_use] + first_use[::-1]
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
    return _axes_cycle(plan.axes, plan.ndim, in_shape)


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
    return _compile(_trace(plan, in_shape), budget)


def _compile(lin: _Linear, budget: int, nfield: int = 0, nq: int = 0) -> ChainProgram:
    """The kernel program of a linear program (``nfield`` field components of ``nq`` entries each)."""
    in_shape, first, steps, final, dexp, factor = list(lin.in_shape), lin.first, lin.steps, lin.final, lin.dexp, lin.factor
    seq, (Pf, extf) = _layouts(lin)
    if seq is None:
        raise ValueError(_axes_cycle(lin.axes, lin.ndim, lin.in_shape))
    out_shape = tuple(extf[a] for a in range(lin.ndim))

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
        L = len(st.active)
        rec = {"kind": st.kind, "L": L, "P": P, "ext": ext, "red": add_floats(*tables.mod_consts(tuple(st.active)))}
        if st.kind == "product":
            _, n_out, n_in = st.op.shape
            W = _width(n_in)
            A = np.zeros((L, n_out, 4 * W), np.int8)
            A[:, :, :n_in] = st.op
            rec.update(W=W, n_out=n_out, op=add_op(A))
        else:  # the field's plane of every step plane (fields are held on the basis moduli, in order)
            rec.update(field=st.field, fplane=add_ints([lin.basis.index(q) for q in st.active]))
        if st.dropped:
            ib, fb, out_active, nd, nr = tables.drop_tables(st.drop_active, lin.basis, st.dropped, lin.extend)
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
            f"the fused kernel has {SHARED_MAX}: run it unfused (fused=False)"
        )

    # header
    enc = tables.encode_tables(tuple(first))
    Pm, IPm, Hm, C18, C36, pw, pa, per = enc
    hdr = {
        0: lin.ndim, 1: len(steps), 2: n_in_entries, 3: math.prod(out_shape), 4: nb, 5: len(first),
        6: lin.bits, 7: cap, 8: lmax, 9: opbytes,
        10: add_floats(Pm, IPm, Hm, C18, C36, pw), 11: pw.shape[1], 12: add_ints(np.concatenate([pa, per])),
    }

    def place_map(P, ext):
        strides, size = _strides(P, ext)
        vals = []
        for a in range(lin.ndim):
            vals += [ext[a], strides[a]]
        return add_ints(vals + [size])

    hdr[13] = place_map(seq[0][0], seq[0][1])
    hdr[14] = place_map(Pf, extf)
    dib, dfb, qd = tables.decode_tables(tuple(final))
    hdr[16] = add_ints(dib)
    hdr[17] = add_floats(dfb)
    hdr[18], hdr[19] = nfield, nq

    buf = 0
    for s, rec in enumerate(step_rec):
        P, ext = rec["P"], rec["ext"]
        base = _HEADER + _STEP * s
        dst = 1 - buf
        vals = [0] * _STEP
        vals[0], vals[1], vals[2], vals[9] = buf, dst, rec["L"], rec["red"]
        if rec["kind"] == "product":
            rows = [ext[a] for a in P[:-1]]
            MT = math.prod(rows)
            nlast = rows[-1] if rows else 1
            nlastpad = _pad4(nlast) if rows else 1
            Pn = [P[-1]] + P[:-1]
            out_ext = dict(ext)
            out_ext[P[-1]] = rec["n_out"]
            osb = _strides(Pn, out_ext)[1]
            vals[3:9] = [nb * MT, rec["W"], rec["n_out"], nlast, nlastpad, rec["op"]]
            vals[14:17] = [nb * osb, MT, osb]
        else:
            size = _strides(P, ext)[1]
            vals[14], vals[16] = nb * size, size
            vals[17:21] = [1, rec["field"], rec["fplane"], place_map(P, ext)]
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
        raise ValueError("the output exponents do not fit the fused kernel's int32 table")
    fl = np.concatenate(floats) if floats else np.zeros(1, np.float32)
    prog = ChainProgram(
        ints=np.array(ints, np.int32), floats=fl.astype(np.float32), qd=np.asarray(qd, np.float64),
        ops=np.concatenate(ops) if ops else np.zeros(16, np.int8),
        dexp_fp64=(dexp + k).astype(np.int32), dexp_exact=(dexp + t2).astype(np.int32), f=float(f),
        F=None if F is None else np.asarray(F, np.uint32), fneg=bool(fneg), nb=nb, shared_bytes=int(shared),
        in_shape=tuple(in_shape), out_shape=out_shape, nfield=nfield, nq=nq,
    )
    for a in (prog.ints, prog.floats, prog.qd, prog.ops, prog.dexp_fp64, prog.dexp_exact):
        a.setflags(write=False)
    return prog


# ----- finite-element operators ------------------------------------------------------------


def operator_fusable(op) -> Optional[str]:
    """Why the FEM operator ``op`` cannot run as one fused kernel (a sentence), or ``None`` if it can.

    The kernel runs programs of one live tensor: the mass operator (products,
    one Hadamard product with ``w detJ``, transposed products). The Poisson
    operator keeps several partial gradients alive and sums them; it runs one
    kernel per step.
    """
    if getattr(op, "method", None) != "rescale_be":
        return f"only method='rescale_be' runs in residues from encode to decode (this operator: {op.method!r})"
    if op.kind != "mass":
        return f"the {op.kind} operator keeps several tensors alive between its stages (only the mass operator is fused)"
    if op.plan.drops and op.plan.drops[0]:
        return "its plan drops moduli before the first stage"
    if _width(op.basis.Q) is None or _width(op.basis.P) is None:
        return f"{max(op.basis.P, op.basis.Q)} points per axis; the fused kernel takes at most {4 * WIDTHS[-1]}"
    return None


def _trace_operator(op) -> _Linear:
    """Run the operator's residue program on one zero element (numpy backend), recording every stage."""
    basis, d = op.basis, op.basis.dim
    axes = tuple(range(1, d + 1))
    T = encode(np.zeros((1,) + (basis.P,) * d), basis.moduli, op.bits, shared_axes=axes, backend="numpy")
    W0 = encode(np.zeros((1,) + (basis.Q,) * d), basis.moduli, op.bits, shared_axes=axes, backend="numpy")
    operands = {**op._ops, "W": W0}
    steps: list[_Step] = []

    class Recorder:
        k = 0

        def stage(self, inputs, outs):
            subset = op.plan.drops[self.k]
            self.k += 1
            if len(inputs) != 1 or len(outs) != 1 or len(outs[0]) != 1:
                raise ValueError("the fused kernel runs programs of one tensor and one term per stage")
            (X,) = inputs
            if subset:
                before = X.active
                X = drop(X, moduli=subset, extend=True, backend="numpy")
                steps[-1] = replace(steps[-1], dropped=tuple(subset), drop_active=before, after=X.active)
            ((_, key, axis),) = outs[0]
            act = X.active
            if axis is None:
                X = hadamard(X, operands[key], backend="numpy")
                steps.append(_Step("hadamard", None, act, None, 0, (), act, act))
            else:
                planes = np.asarray(_planes_on(operands[key], act, "op"))
                X = mode_product(X, operands[key], axis + 1, backend="numpy")
                steps.append(_Step("product", axis, act, planes, -1, (), act, act))
            return [X]

    first = T.active
    out = op._program(Recorder(), T, d)
    dexp, factor = _output_scale(out)
    return _Linear(d, (basis.P,) * d, op.bits, tuple(basis.moduli.moduli), True, first, tuple(steps), out.active,
                   dexp, factor)


def operator_program(op, budget: int = SHARED_BUDGET) -> ChainProgram:
    """The fused kernel's program for a FEM operator (cached per operator and budget; see :func:`operator_fusable`).

    Its one field component is the encoded ``w detJ`` (``Q**dim`` entries per element).

    Raises
    ------
    ValueError
        If the operator cannot be fused (the reason) or one element does not fit a block's shared memory.
    """
    why = operator_fusable(op)
    if why is not None:
        raise ValueError(f"this operator cannot run as one fused kernel: {why}")
    per_op = _CACHE.setdefault(op, {})
    key = ("operator", budget)
    if key not in per_op:
        per_op[key] = _compile(_trace_operator(op), budget, nfield=1, nq=op.basis.Q**op.basis.dim)
    return per_op[key]


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
