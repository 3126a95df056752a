"""A GEMM-shaped expression's default (``moduli=None``): each element on the moduli :func:`rnstensor.dgemm` (complex:
:func:`rnstensor.zgemm`) chooses for it alone, the elements on equal moduli one product of its engine (the one engine
choice of a GEMM-shaped step)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..encode import _NONE
from ..gemm.checks import _check_workspace
from ..gemm.stack import shared_moduli, shared_products
from ..program.errors import inflate
from ..run.exact import half_spacing

__all__ = ["gemm_labels", "gemm_elements", "gemm_auto"]


def gemm_labels(expr) -> Optional[tuple]:
    """``(rows, contracted, cols)``: the labels of an expression that is one GEMM of its two operands (each label of
    one operand either kept by the output or contracted with the other, none repeated, none both kept and
    contracted), in the first operand's order; None for any other expression."""
    if len(expr.terms) != 2 or expr.constants or len(expr._info.contraction_list) != 1:
        return None
    x, y = expr.terms
    if len(set(x)) != len(x) or len(set(y)) != len(y):
        return None
    rows = "".join(c for c in x if c not in y)
    contracted = "".join(c for c in x if c in y)
    cols = "".join(c for c in y if c not in x)
    out = expr.output
    if not contracted or any(c in out for c in contracted) or sorted(rows + cols) != sorted(out):
        return None
    return rows, contracted, cols


def gemm_elements(expr, labels: tuple, parsed: tuple, backend, batch: Optional[str], bound: bool) -> Optional[tuple]:
    """``(parts, said, left, xp)`` of a default call of a GEMM-shaped ``expr`` (its :func:`gemm_labels`: ``labels``)
    on finite operands, else None (the call takes the residue certificate). Complex operands (or a real one with a
    complex one) take :func:`~rnstensor.gemm.api.zgemm`'s choice and program, as dgemm's below.

    Its elements along ``batch`` (None: the call is one) are the GEMMs ``A[e] @ B`` of the first operand's slices
    by the second operand; each takes the moduli ``s`` dgemm takes for it alone (the classical bound
    ``(1 + 2**-5) u |A||B|`` on its spreads and measured magnitudes,
    :func:`~rnstensor.gemm.stack.shared_moduli`), and the elements on equal ``s`` run as one product of
    dgemm's program and engine at its width: dgemm's bits, element by element. ``parts``: ``[(indices,
    result)]`` (their error bounds where ``bound``: the encoding errors of width ``t`` through the product, and
    half an ulp for the exact decode); ``said``: evaluation -> elements; ``left``: the elements dgemm would
    split (rows wider than 49 moduli hold), for the certificate's path, or None.
    """
    got = None if expr.rtol is not None else _gemm_operands(expr, labels, parsed, backend)
    if got is None:
        return None
    A, Bm, be, xp, backend_name = got
    rows, contracted, cols = labels
    sizes = expr.sizes
    nb = sizes[batch] if batch is not None else 1
    k, n = Bm.shape
    A3 = A.reshape(nb, -1, k)
    counts, (_, Ea, _, _), (_, Eb, _, _) = shared_moduli(k, A.dtype.kind == "c", A3, Bm, xp)
    products = shared_products(A3, Bm, counts, Ea, Eb, _check_workspace(None, "einsum", xp), be, xp, backend_name)
    # the result's labels as the product leaves them (the elements first), and their order in the output
    made = rows + cols
    order = [made.index(c) for c in expr.output]
    # (the bound's column sums, every width's; a complex entry's two parts are two terms)
    cb = inflate(_parts_abs(Bm, xp).sum(axis=0), 2 * k if A.dtype.kind == "c" else k) if bound else None
    parts, said = [], {}
    for s, t, members, sel, rows_a, term in products:
        if bound:
            term = _encoding_bound(term, rows_a, cb, Ea[sel].reshape(-1), Eb, t, k, xp)
        lead = (len(members),) if batch is not None else ()
        rest = rows[1:] if batch is not None else rows  # (the elements' label is the first operand's first)
        part = term.reshape(lead + tuple(sizes[c] for c in rest) + tuple(sizes[c] for c in cols))
        part = xp.transpose(part, order)
        parts.append((None if len(members) == nb else sel, xp.ascontiguousarray(part) if part.ndim else part[()]))
        said[f"{s} moduli, {t} bits"] = said.get(f"{s} moduli, {t} bits", 0) + len(members)
    left = [i for i, c in enumerate(counts) if c is None]
    return parts, said, (xp.asarray(np.asarray(left, np.int64)) if left else None), xp


def _parts_abs(x, xp):
    """``|x|`` of a real array, ``|Re x| + |Im x|`` of a complex one (what each part of a complex product sums)."""
    return xp.abs(x.real) + xp.abs(x.imag) if x.dtype.kind == "c" else xp.abs(x)


def _encoding_bound(y, A, cb, Ea, Eb, t: int, k: int, xp):
    """A bound of ``|y - A @ Bm|`` for ``y`` the exact decode of the product of ``A`` and ``Bm`` encoded at width ``t``
    (row ``i`` moved by at most ``2**(Ea_i - t - 1)`` per entry (part), column ``j`` by ``2**(Eb_j - t - 1)``;
    ``cb`` the column sums of ``|Bm|`` (``|Re| + |Im|``), rounded up): ``du_i cb_j + dv_j sum|a_i.| + k du_i dv_j``
    inflated, plus half an ulp of ``y``. Complex: each part's products are two real ones per term (``2k`` error
    products), each part rounded once; the bound is of ``|Re err| + |Im err|``, as ``error_bound``'s."""
    cplx = y.dtype.kind == "c"
    with np.errstate(over="ignore", under="ignore"):
        du = xp.where(Ea != _NONE, xp.ldexp(1.0, (xp.maximum(Ea, -1100) - t - 1).astype(np.int32)), 0.0)
        dv = xp.where(Eb != _NONE, xp.ldexp(1.0, (xp.maximum(Eb, -1100) - t - 1).astype(np.int32)), 0.0)
        kk = 2 * k if cplx else k
        ra = inflate(_parts_abs(A, xp).sum(axis=1), kk)
        enc = du[:, None] * cb[None, :] + ra[:, None] * dv[None, :] + kk * (du[:, None] * dv[None, :])
        if cplx:  # (both parts: twice one part's encoding error, each part's own rounding)
            return inflate(2 * enc + half_spacing(y.real) + half_spacing(y.imag), 6) + 2.0**-1069 * (2 * kk + 1)
        # (the terms' roundings, and underflows below the least subnormal: an absolute slack)
        return inflate(enc + half_spacing(y), 5) + 2.0**-1070 * (2 * k + 1)


def _gemm_operands(expr, labels: tuple, parsed: tuple, backend) -> Optional[tuple]:
    """``(A, Bm, be, xp, backend_name)``: the one GEMM of ``expr`` on finite non-constant operands, ``A`` its rows
    ``(M, k)`` (the first operand's, in its label order) and ``Bm`` ``(k, n)``, both float64, or complex128 where
    either operand is complex (a real one's imaginary part 0); None for other operands (an RNSTensor, a constant,
    an inf or NaN, an operand broadcast along a label)."""
    ops, kinds, cplx, tensors, nonfinite = parsed
    if tensors or nonfinite or any(k != "input" for k in kinds):
        return None
    rows, contracted, cols = labels
    x, y = expr.terms
    sizes = expr.sizes
    if any(tuple(np.shape(op)) != tuple(sizes[c] for c in t) for op, t in zip(ops, expr.terms)):
        return None
    be, xp, backend_name = expr._backend(ops, kinds, backend)
    work = np.complex128 if any(cplx) else np.float64
    k = math.prod(sizes[c] for c in contracted)
    A = xp.ascontiguousarray(xp.transpose(ops[0], [x.index(c) for c in rows + contracted]), dtype=work)
    Bm = xp.ascontiguousarray(xp.transpose(ops[1], [y.index(c) for c in contracted + cols]), dtype=work)
    return A.reshape(-1, k), Bm.reshape(k, -1), be, xp, backend_name


def gemm_auto(expr, labels: tuple, parsed: tuple, backend):
    """``moduli='auto'`` of a GEMM-shaped ``expr`` on finite host operands: :func:`~rnstensor.gemm.api.dgemm`'s
    (complex: :func:`~rnstensor.gemm.api.zgemm`'s) ``'auto'`` on its one GEMM, else None. Both are correctly
    rounded (each part), so the value is unique: the bits of einsum's own exact plan, from one exponent per row
    and column (einsum's exact plan encodes with one per slice along the output indices, often wider)."""
    from ..gemm.api import dgemm, zgemm  # noqa: PLC0415 - (gemm.api is a front end beside this one)

    got = _gemm_operands(expr, labels, parsed, backend)
    if got is None or got[3] is not np:  # (a device's 'auto' beyond 49 moduli is einsum's own split, on the host)
        return None
    A, Bm, _, _, backend_name = got
    rows, _, cols = labels
    z = (zgemm if A.dtype.kind == "c" else dgemm)(A, Bm, moduli="auto", backend=backend_name)
    z = z.reshape(tuple(expr.sizes[c] for c in rows + cols))
    z = z.transpose([(rows + cols).index(c) for c in expr.output])
    return np.ascontiguousarray(z) if z.ndim else z[()]
