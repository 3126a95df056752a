"""A stack of GEMMs (``matmul``'s batch axes) batched: each matrix's own moduli, the products on equal ones together."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..arrays import to_host
from ..backends import dispatch
from ..basis import Basis
from ..encode import _NONE
from ..magnitude import measure_ratios
from ..program.execute import Value, execute
from ..run.epilogue import gemm_epilogue
from .checks import _check_moduli, _check_target, _check_workspace
from .scan import group_lsb, group_stats, stack_moduli
from .tiles import _phase, _run_product, _tile_bytes, gemm_program
from .width import gemm_width, one_matrix

__all__ = ["gemm_stack", "gemm_shared", "shared_moduli", "shared_products"]


def _moduli_counts(moduli, k: int, cplx: bool, sa, sb, A, BT, rtol, xp) -> list:
    """Every matrix's moduli count as :func:`~.scan.gemm_scale` chooses it alone (:func:`~.scan.stack_moduli`;
    ``None``: split, left to :func:`~.api.dgemm`), its lowest bits from one pass, its measured ratio from one
    batched GEMM."""
    nb, m, n = sa[0].shape[0], sa[1].shape[1], sb[1].shape[1]
    return stack_moduli(
        moduli, k, cplx, sa, sb,
        lambda: (group_lsb(A, 1, xp).reshape(nb, m), group_lsb(BT, 1, xp).reshape(nb, n)),
        lambda which: measure_ratios(A.reshape(nb, m, k)[which], sa[1][which],
                                     BT.reshape(nb, n, k)[which].transpose(0, 2, 1), sb[1][which], xp),
        rtol, xp)


def shared_moduli(k: int, cplx: bool, A3, Bm, xp) -> tuple:
    """``(counts, a_stats, b_stats)``: the moduli count :func:`~.api.dgemm` (``moduli=None``) chooses for each
    ``A3[i] @ Bm`` alone (``None``: split), from one scan of ``A3`` ``(nb, m, k)`` and of the ``Bm`` ``(k, n)``
    every matrix shares (scanned, and its measured magnitudes scaled, once), and one float32 GEMM of all the
    rows; the statistics of ``A3``'s rows ``(nb, m)`` and of ``Bm``'s columns ``(n,)``."""
    nb, m, _ = A3.shape
    A2 = A3.reshape(nb * m, k)
    sa = tuple(None if v is None else v.reshape(nb, m) for v in group_stats(A2, 1, False, xp))
    sb = group_stats(Bm, 0, False, xp)
    counts = stack_moduli(
        None, k, cplx, sa, one_matrix(sb),
        lambda: (group_lsb(A2, 1, xp).reshape(nb, m), group_lsb(Bm, 0, xp)[None]),
        lambda which: measure_ratios(A3[_index(which, xp)], xp.where(sa[0], sa[1], _NONE)[_index(which, xp)], Bm,
                                     xp.where(sb[0], sb[1], _NONE), xp),
        None, xp)
    return counts, sa, sb


def shared_products(A3, Bm, counts: list, Ea, Eb, workspace: int, be, xp, backend_name) -> list:
    """``[(s, t, members, index, rows, product)]``: the products ``A3[i] @ Bm`` of a stack sharing ``Bm`` (its
    matrices' moduli ``counts`` and row / column statistics from :func:`shared_moduli`; ``None``: left out),
    each as :func:`~.api.dgemm` (complex operands: :func:`~.api.zgemm`) gives it alone, the matrices on equal
    moduli ``s`` (width ``t``) one product of its program and engine: ``rows`` their rows ``(len(members) * m,
    k)``, ``index`` theirs in the stack (:func:`_index`). Where the backend can, a real ``Bm`` is encoded once for
    every width (``exact_gemm_shared``: the same integers, so the same bits)."""
    k, n = Bm.shape
    cplx = A3.dtype.kind == "c"
    kind = "complex" if cplx else "real"
    transposed = getattr(be, "gemm_layout", "NN") == "TN"
    eb_of = lambda t: xp.where(Eb != _NONE, t - Eb, 0).astype(np.int64)  # noqa: E731
    groups = []
    for s in sorted({c for c in counts if c is not None}, key=lambda s: (gemm_width(s, k, kind), s)):
        members = [i for i, c in enumerate(counts) if c == s]
        t = gemm_width(s, k, kind)
        sel = _index(members, xp)  # (consecutive matrices: a view)
        Ea_g = Ea[sel].reshape(-1)
        ea = xp.where(Ea_g != _NONE, t - Ea_g, 0).astype(np.int64)
        groups.append((s, t, members, sel, A3[sel].reshape(-1, k), ea,
                       gemm_program(Basis.int8(s), t, k, cplx, 1.0, transposed)))
    shared = getattr(be, "exact_gemm_shared", None)
    terms = None
    if shared is not None and len(groups) > 1 and not transposed and not cplx:
        t0 = groups[0][1]
        with _phase("products"):
            terms = shared([g[6] for g in groups], [g[4] for g in groups], [g[5] for g in groups], Bm,
                           [eb_of(g[1]) for g in groups], [g[1] - t0 for g in groups], workspace)
    terms = [None] * len(groups) if terms is None else terms
    for g, (s, t, _, _, rows, ea, prog) in enumerate(groups):
        if terms[g] is None:  # (a product the shared engine left alone)
            terms[g] = xp.zeros((rows.shape[0], n), A3.dtype)
            _run_product(terms[g], prog, rows, Bm, ea, eb_of(t), rows.shape[0], n, k, s, cplx, workspace, be, xp,
                         backend_name, transposed)
    every_col = xp.ones(n, bool)
    return [(s, t, members, sel, rows,
             gemm_epilogue(term, 1.0, 0.0, None, xp.ones(term.shape[0], bool), every_col, xp, opa=rows, opb=Bm))
            for (s, t, members, sel, rows, _, _), term in zip(groups, terms)]


def _index(which, xp):
    """The matrices ``which`` (increasing) as an index of the stack: a slice where they are consecutive (the usual
    case: a view, nothing copied), else an index array, made on the array's side once (a device array's index
    crosses the bus once, explicitly)."""
    which = [int(i) for i in which]
    if which == list(range(which[0], which[-1] + 1)):
        return slice(which[0], which[-1] + 1)
    return xp.asarray(np.asarray(which, np.int64))


def gemm_shared(res, A3, Bm, backend, workspace_bytes) -> Optional[list]:
    """``res[b] <- A3[b] @ Bm`` for a finite stack sharing ``Bm`` (``matmul``'s default with one ``b`` for every
    matrix): each matrix on the moduli :func:`~.api.dgemm` (:func:`~.api.zgemm`) gives it alone
    (:func:`shared_moduli`), the matrices on every width one pass of the engine where it can
    (:func:`shared_products`), so its bits. Returns the matrices left to dgemm (rows wider than 49 moduli
    hold), or None where the stack holds an inf or NaN (:func:`gemm_stack` then takes it)."""
    fn = "matmul"
    be, xp = dispatch(A3, Bm, res, backend=backend, names=("a", "b", "out"), fn=fn)
    if not (bool(xp.isfinite(A3).all()) and bool(xp.isfinite(Bm).all())):
        return None
    workspace = _check_workspace(workspace_bytes, fn, xp)
    backend_name = be.name if xp is not np else backend
    nb, m, k = A3.shape
    A3, Bm = xp.ascontiguousarray(A3), xp.ascontiguousarray(Bm)
    counts, (_, Ea, _, _), (_, Eb, _, _) = shared_moduli(k, A3.dtype.kind == "c", A3, Bm, xp)
    for _, _, members, sel, _, term in shared_products(A3, Bm, counts, Ea, Eb, workspace, be, xp, backend_name):
        res[sel] = term.reshape(len(members), m, -1)
    return [i for i, c in enumerate(counts) if c is None]


def gemm_stack(res, A, B, moduli, backend, workspace_bytes, min_bits: int, rtol) -> list:
    """``res[b] <- A[b] @ B[b]`` for the matrices of a stack that run batched; returns the others' indices.

    ``A`` ``(nb, m, k)``, ``B`` ``(nb, k, n)`` float64 or complex128 (``m, n,
    k > 0``), ``res`` ``(nb, m, n)`` of their dtype. Each matrix gets the
    moduli :func:`~.api.dgemm` (:func:`~.api.zgemm`) chooses for it alone and
    the same exact product's integers and decode, so the same bits; the
    matrices on equal moduli run as one
    batched program (:func:`~.tiles.gemm_program` with ``stack=True``), in as many pieces as the
    workspace asks. On a device the choices read back one scalar (all finite?) and at most one number per
    matrix (its measured ratio, or its exact width), once for the stack. Left to ``dgemm`` one by one
    (returned): every matrix where the stack's contiguous copies of ``A`` and ``B`` (a broadcast operand's once per
    matrix) would pass the workspace, and matrices with
    an inf or NaN, rows or columns wider than 49 moduli hold, an explicit
    ``moduli`` too small for the product (its error names the fix), and
    matrices whose product alone exceeds the workspace (``dgemm`` tiles it).
    """
    fn = "matmul"
    moduli = _check_moduli(moduli, fn)
    rtol = _check_target(rtol, moduli, fn)
    be, xp = dispatch(A, B, res, backend=backend, names=("a", "b", "out"), fn=fn)
    workspace = _check_workspace(workspace_bytes, fn, xp)
    backend_name = be.name if xp is not np else backend
    nb, m, k = A.shape
    n = B.shape[2]
    if (A.size + 2 * B.size) * A.itemsize > workspace:
        # the stack's contiguous copies (of a broadcast operand too, once per matrix) would pass the workspace:
        # every matrix to dgemm on its views, as a broadcast operand is
        return list(range(nb))
    cplx = A.dtype.kind == "c"
    kind = "complex" if cplx else "real"
    auto = moduli == "auto"
    A3, B3 = xp.ascontiguousarray(A).reshape(nb, m, k), xp.ascontiguousarray(B)  # (the operands, for the encodes)
    A2 = A3.reshape(nb * m, k)
    BT = xp.ascontiguousarray(xp.swapaxes(B, 1, 2)).reshape(nb * n, k)  # the columns of every B[b], as rows
    sa = tuple(None if v is None else v.reshape(nb, m) for v in group_stats(A2, 1, auto, xp))
    sb = tuple(None if v is None else v.reshape(nb, n) for v in group_stats(BT, 1, auto, xp))
    finite = sa[0].all(axis=1) & sb[0].all(axis=1)
    # one scalar read back where every matrix is finite (the usual case), else one flag per matrix
    finite = np.ones(nb, bool) if bool(finite.all()) else to_host(finite)
    left = [i for i in range(nb) if not finite[i]]
    take = np.nonzero(finite)[0]
    if not take.size:
        return left
    if take.size < nb:
        finite_ones = _index(take, xp)
        A2 = A2.reshape(nb, m, k)[finite_ones].reshape(-1, k)
        BT = BT.reshape(nb, n, k)[finite_ones].reshape(-1, k)
        sa = tuple(None if v is None else v[finite_ones] for v in sa)
        sb = tuple(None if v is None else v[finite_ones] for v in sb)
    counts = _moduli_counts(moduli, k, cplx, sa, sb, A2, BT, rtol, xp)
    groups: dict = {}
    for j, s in enumerate(counts):
        t = None if s is None else gemm_width(s, k, kind)
        if t is None or t < 1 or (isinstance(moduli, int) and t < min_bits) or _tile_bytes(m, n, k, s, cplx) > workspace:
            left.append(int(take[j]))
        else:
            groups.setdefault(s, []).append(j)
    (fa, Ea, _, _), (fb, Eb, _, _) = sa, sb
    for s, members in groups.items():
        t = gemm_width(s, k, kind)
        prog = gemm_program(Basis.int8(s), t, k, cplx, 1.0, stack=True)
        enc_a, enc_b = prog.steps[:2]
        per = max(1, workspace // _tile_bytes(m, n, k, s, cplx))
        for c0 in range(0, len(members), per):
            sel = _index(members[c0:c0 + per], xp)
            at = sel if take.size == nb else _index(take[members[c0:c0 + per]], xp)
            ea = xp.where(fa[sel] & (Ea[sel] != _NONE), t - Ea[sel], 0).astype(np.int64)[:, :, None]
            eb = xp.where(fb[sel] & (Eb[sel] != _NONE), t - Eb[sel], 0).astype(np.int64)[:, None, :]
            xa, xb = A3[at], B3[at]  # (consecutive matrices: views, nothing gathered)
            if cplx:  # the (re, im) parts first, sharing each row's (column's) exponent
                xa, xb, ea, eb = xp.stack([xa.real, xa.imag]), xp.stack([xb.real, xb.imag]), ea[None], eb[None]
            encoded = {enc_a.out: Value(be.encode(xa, ea, prog.basis.moduli, t), -ea, 1, enc_a.bound, enc_a.labels),
                       enc_b.out: Value(be.encode(xb, eb, prog.basis.moduli, t), -eb, 1, enc_b.bound, enc_b.labels)}
            res[at] = execute(prog, be, backend_name, xp, vals=encoded, start=2)[prog.out]
    return sorted(left)
